"""`localcos bench`, the speed model and the --gamma auto controller."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys

import pytest

from localcos import Ensemble, GenerationStats, ModelRunStats
from localcos.tools.bench import Config, Run, configurations, summarize
from localcos.core.speedmodel import AutoGamma, CallProfile, Costs, expected_speedup, expected_tokens


def test_expected_tokens():
    assert expected_tokens(0.5, 3) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens(1.0, 4) == 4
    assert expected_tokens(0.0, 4) == 1


def test_expected_speedup_formulas():
    # naive-cos, Theorem 3.1: E (1 + c) / (gamma c + 1)
    assert expected_speedup("naive-cos", 0.8, 4, 0.1) == pytest.approx((1 - 0.8**4) / 0.2 * 1.1 / 1.4)
    # cos, Theorem 3.6: the proposer skips a call with probability alpha^gamma
    assert expected_speedup("cos", 0.8, 4, 0.1) == pytest.approx((1 - 0.8**4) / 0.2 * 1.1 / ((4 - 0.8**4) * 0.1 + 1))
    # two equal models, gamma 1, full acceptance: every call yields two distributions -> 2x
    assert expected_speedup("cos", 1.0, 1, 1.0) == pytest.approx(2.0)
    # sd: target pass costs 1 + c, bonus token on full acceptance
    assert expected_speedup("sd", 1.0, 3, 0.1) == pytest.approx(4 * 1.1 / (0.3 + 1.1))
    assert expected_speedup("ensemble", 0.3, 1, 1.0) == 1.0
    assert expected_speedup("cos", 1.5, 1, 1.0) is None


def test_configurations_always_include_the_baseline():
    configs = configurations(["cos", "sd"], [1, 3, "auto"])
    assert configs[0] == Config("ensemble", None)
    assert [c.label for c in configs[1:]] == ["cos/1", "cos/3", "cos/auto", "sd/1", "sd/3", "sd/auto"]
    with_big = configurations(["cos"], [3], members=[1])
    assert [c.label for c in with_big] == ["alone-1", "ensemble", "cos/3"]


def _run(prompt, method, gamma, tokens, seconds, accepted=0, rejected=0, calls=(10, 10), model_seconds=(0.1, 1.0)):
    # llama.cpp's share of the time is 90%, split between the models as model_seconds says
    llama = [seconds * 0.9 * s / sum(model_seconds) for s in model_seconds]
    stats = GenerationStats(
        method=method,
        combiner="we(0.5,0.5)",
        models=[ModelRunStats(f"m{i}", calls[i], tokens, llama[i]) for i in range(2)],
        tokens=tokens,
        seconds=seconds,
        accepted=accepted,
        rejected=rejected,
        proposed=accepted + rejected,
        verifications=max(1, rejected),
    )
    return Run("code" if prompt == 0 else "math", prompt, 0.0, 0, method, gamma, stats)


def test_summary_by_hand():
    runs = [
        _run(0, "ensemble", None, 10, 1.0),
        _run(1, "ensemble", None, 10, 1.0),
        _run(0, "cos", 3, 10, 0.5, accepted=8, rejected=2, calls=(6, 3)),
        _run(1, "cos", 3, 10, 0.8, accepted=6, rejected=4, calls=(6, 3)),
    ]
    rows = {(r.task, r.method): r for r in summarize(runs, proposer=0, n_models=2)}
    cos = rows[("all", "cos")]
    assert cos.per_second == pytest.approx(20 / 1.3)
    assert cos.speedup == pytest.approx((20 / 1.3) / 10)
    assert cos.min_prompt_speedup == pytest.approx(10 / 0.8 / 10)
    assert cos.acceptance == pytest.approx(14 / 20)
    assert cos.calls_per_unit == pytest.approx([0.6, 0.3])
    assert cos.cost_ratio == pytest.approx(0.1)  # 0.1 s vs 1.0 s per 10 calls
    assert cos.expected == pytest.approx(expected_speedup("cos", 0.7, 3, 0.1))
    assert cos.measured_over_expected == pytest.approx(cos.speedup / cos.expected)
    assert cos.host_fraction == pytest.approx(0.1)
    assert rows[("code", "cos")].speedup == pytest.approx(2.0)
    assert rows[("all", "ensemble")].speedup == pytest.approx(1.0)


def amateur_and_expert() -> AutoGamma:
    """A controller for a cheap amateur (model 0) and an expert whose batches are cheap."""
    return AutoGamma(Costs([CallProfile({1: 0.001}), CallProfile({1: 0.010, 6: 0.012})]))


def test_auto_gamma_prefers_long_drafts_from_a_cheap_accurate_proposer():
    auto = amateur_and_expert()
    auto.observe_verdicts(0, 90, 10)
    auto.observe_verdicts(1, 90, 10)
    for method in ("cos", "naive-cos", "sd"):
        proposer, gamma = auto.choose(method)
        assert proposer == 0 and gamma >= 4, (method, proposer, gamma)
    # a proposer that is almost always rejected should draft one token at a time
    bad = AutoGamma(Costs([CallProfile({1: 0.001}), CallProfile({1: 0.010, 2: 0.011})]))
    bad.observe_verdicts(0, 5, 95)
    bad.observe_verdicts(1, 5, 95)
    assert bad.choose("naive-cos")[1] <= 1  # one token at a time, or no draft at all


def _equal_pair(batch_of_two: float) -> AutoGamma:
    """Two models of equal cost whose 2-token calls cost `batch_of_two` single-token calls."""
    profile = CallProfile({1: 0.010, 2: 0.010 * batch_of_two})
    return AutoGamma(Costs([profile, profile]))


def test_auto_gamma_takes_the_ensembles_step_when_speculation_does_not_pay_and_returns():
    """Gamma 0 (no draft: every model scores the next token) is a choice: models that agree half
    the time with batches that cost 1.7 single calls gain nothing from drafting. When they come
    to agree (here: measured acceptance near 1), speculation is chosen again."""
    auto = _equal_pair(1.7)
    for m in (0, 1):
        auto.observe_verdicts(m, 50, 50)
    assert auto.choose("cos")[1] == 0
    assert auto.choose("naive-cos")[1] == 0
    for m in (0, 1):
        auto.observe_verdicts(m, 400, 4)  # e.g. measured as 1 - TV(r, q) during ensemble steps
    assert auto.choose("cos")[1] >= 1
    # a cheap batch makes speculation pay even at moderate agreement
    cheap = _equal_pair(1.05)
    for m in (0, 1):
        cheap.observe_verdicts(m, 60, 40)
    assert cheap.choose("cos")[1] >= 1


def test_during_ensemble_steps_the_controller_learns_acceptance_as_one_minus_tv(models, monkeypatch):
    """With gamma 0 chosen, the decoder reports alpha_i = sum min(r, q_i) for every model at every
    token: the controller's estimate converges to the true mean acceptance without drafting."""
    from localcos.core.speedmodel import AutoGamma
    from localcos.runtime import generation

    made: list[AutoGamma] = []

    class NeverDrafts(AutoGamma):
        def __post_init__(self) -> None:
            super().__post_init__()
            made.append(self)

        def ensemble_tokens_per_second(self, cost=None) -> float:
            return float("inf")  # force gamma 0

    monkeypatch.setattr(generation, "AutoGamma", NeverDrafts)
    with Ensemble.load([models["base"], models["sibling"]], n_ctx=256) as ens:
        out = ens.generate("The river runs", method="cos", gamma="auto", max_tokens=40, seed=0, ignore_eos=True)
        assert out.stats.proposed == 0 and len(out.token_ids) == 40  # no drafts: the ensemble's steps
        assert out.stats.plans == {"none": 40}  # each step planned as such
        assert all(o.kind == "sample" for o in out.origins)
        (auto,) = made
        assert auto.judged == 2 * 40  # one verdict per model per token
        spec = ens.generate("The river runs", method="cos", gamma=1, max_tokens=200, seed=1, ignore_eos=True).stats
        measured = [auto.acceptance[i].accepted / auto.acceptance[i].tested for i in (0, 1)]
        assert all(abs(m - spec.acceptance_rate) < 0.2 for m in measured), (measured, spec.acceptance_rate)


def test_auto_gamma_keeps_a_choice_until_enough_new_verdicts():
    """Re-evaluating every candidate costs about a small model's call, so a choice stands until
    `rechoose_every` more draft tokens have been judged; then new evidence changes it."""
    auto = amateur_and_expert()
    auto.observe_verdicts(0, 95, 5)
    evaluations = []
    real = auto.tokens_per_second
    auto.tokens_per_second = lambda *a: evaluations.append(1) or real(*a)  # type: ignore[method-assign]
    first = auto.choose("naive-cos")
    assert first[0] == 0 and first[1] >= 4 and len(evaluations) == 2 * auto.gamma_max
    auto.observe_verdicts(0, 0, int(auto.rechoose_every) - 1)  # not yet enough to re-evaluate
    assert auto.choose("naive-cos") == first and len(evaluations) == 2 * auto.gamma_max
    auto.observe_verdicts(0, 0, 200)  # the cheap proposer turns out to be wrong most of the time
    assert auto.choose("naive-cos") != first and len(evaluations) == 4 * auto.gamma_max


def test_auto_gamma_end_to_end(models):
    with Ensemble.load([models["base"], models["larger"]], n_ctx=256) as ens:
        out = ens.generate("The river runs", method="cos", gamma="auto", max_tokens=48, seed=0, ignore_eos=True)
        assert len(out.token_ids) == 48 and out.stats.proposed > 0
        # each generation plans from its own start: the same seed after other requests, the same text
        ens.generate("Other text of another length", method="cos", gamma="auto", max_tokens=20, seed=3, ignore_eos=True)
        again = ens.generate("The river runs", method="cos", gamma="auto", max_tokens=48, seed=0, ignore_eos=True)
        assert again.token_ids == out.token_ids and again.stats.proposed == out.stats.proposed
        greedy = ens.generate("The river runs", method="cos", gamma="auto", max_tokens=48, temperature=0, ignore_eos=True)
        reference = ens.generate("The river runs", method="ensemble", max_tokens=48, temperature=0, ignore_eos=True)
        assert greedy.token_ids == reference.token_ids


def test_bench_command(models, tmp_path):
    out_json, out_csv, out_png = tmp_path / "b.json", tmp_path / "b.csv", tmp_path / "b.png"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "localcos",
            "bench",
            "--models",
            f"{models['base']},{models['sibling']}",
            "--methods",
            "ensemble,sd,cos",
            "--gamma",
            "1,2,auto",
            "--temperature",
            "0,1",
            "--limit-prompts",
            "2",
            "--max-tokens",
            "8",
            "--json",
            str(out_json),
            "--csv",
            str(out_csv),
            "--plot",
            str(out_png),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert "speedup" in proc.stdout and "meas/exp" in proc.stdout and "peak while generating" in proc.stdout
    assert "its calls as measured: 1 row " in proc.stdout  # beside each profile, what the run's calls took
    # what auto planned: a line per auto configuration, temperature and prompt
    planned = [line.strip() for line in proc.stdout.split("what auto planned")[1].split("\n\n")[0].splitlines()[1:]]
    assert len(planned) == 2 * 2 * 2 and all(re.match(r"(cos|sd)/auto T=[01] \w+ #\d+: \d+\.\d\dx  ", line) for line in planned), planned
    report = json.loads(out_json.read_text())
    # temperatures x prompts x (the largest model alone + configurations + the ensemble again)
    assert len(report["runs"]) == 2 * 2 * (1 + 7 + 1)
    assert len(report["timing_noise"]) == 2 * 2 and "timing noise" in proc.stdout
    all_rows = [r for r in report["summary"] if r["task"] == "all"]
    assert {(r["method"], r["gamma"]) for r in all_rows} >= {("ensemble", None), ("cos", 1), ("cos", 2), ("cos", "auto")}
    assert "/big" in proc.stdout and "alone-1" in proc.stdout
    for r in all_rows:
        assert r["of_largest"] > 0
        if r["method"] == "alone":  # model 1 (the last of two equal sizes) by itself: only it is evaluated
            assert r["member"] == 1 and r["of_largest"] == pytest.approx(1.0) and r["acceptance"] is None
            assert r["calls_per_token"][0] == 0 and r["calls_per_token"][1] == pytest.approx(7 / 8)  # a call a token but the first
        elif r["method"] == "ensemble":
            assert r["speedup"] == pytest.approx(1.0)
        elif r["gamma"] == "auto" and r["acceptance"] is None:  # chose the ensemble's own step throughout
            ensemble = next(e for e in all_rows if e["method"] == "ensemble" and e["temperature"] == r["temperature"])
            assert r["speedup"] > 0 and r["calls_per_token"] == pytest.approx(ensemble["calls_per_token"])
        else:
            assert r["speedup"] > 0 and 0 <= r["acceptance"] <= 1
            assert r["cost_ratio"] > 0
        if r["method"] not in ("ensemble", "alone") and r["temperature"] == 0:  # greedy: every method writes r's text
            assert r["same_text"] == 2 and r["vs_ensemble_there"] == pytest.approx(r["speedup"]), r
    with open(out_csv) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(report["summary"]) and "measured_over_expected" in rows[0]
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


MEMORY_SCRIPT = """
import sys
from localcos import Ensemble
from localcos.tools.bench import RssSampler, current_rss_mb
a, b = sys.argv[1:3]
with Ensemble.load([a, b], n_ctx=8192) as ens:
    ens.generate("warm up", method="ensemble", max_tokens=4, ignore_eos=True)
    loaded = current_rss_mb()
    with RssSampler(0.005) as rss:
        for method in ("ensemble", "sd", "naive-cos", "cos"):
            ens.generate("The river runs past the old mill", method=method, gamma=5, max_tokens=48, ignore_eos=True, seed=1)
    print(rss.peak - loaded)
"""


@pytest.mark.slow
def test_memory_at_a_152k_vocabulary_and_8k_context(models):
    """Nothing proportional to n_ctx x n_vocab: at 152k x 8192 one such float32 buffer would be
    5 GB; the decoding overhead above the loaded models and KV caches stays under 300 MB."""
    proc = subprocess.run(
        [sys.executable, "-c", MEMORY_SCRIPT, str(models["vocab152k"]), str(models["vocab152k_padded"])],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    overhead = float(proc.stdout.strip().splitlines()[-1])
    assert overhead < 300, f"{overhead:.0f} MiB above the loaded models"


def test_call_profiles_interpolate_between_measured_row_counts():
    """Call time is not linear in the rows (on CPUs one row runs matrix-vector kernels, two or
    more matrix-matrix ones): measured counts are used as measured, others interpolated, larger
    ones extrapolated along the slope of the two largest; under load a sequence's rows cost what
    they add to the others' rows."""
    profile = CallProfile({1: 1.0, 2: 1.65, 4: 1.95})
    assert profile(1) == pytest.approx(1.0) and profile(0) == 0.0
    assert profile(2) == pytest.approx(1.65)
    assert profile(3) == pytest.approx(1.80)  # between 2 and 4
    assert profile(6) == pytest.approx(2.25)  # the slope of 2 -> 4, not of 1 -> 2
    assert profile.batch_cost(4) == pytest.approx(1.95)
    costs = Costs([profile])
    assert costs(0, 2) == pytest.approx(1.65)
    # 2 rows beside 2 others: the 4-row call less the others' share of a 3-row call
    assert costs.under_load([2])(0, 2) == pytest.approx(1.95 - 2 * 1.80 / 3)
    assert costs.ensemble_seconds(11) == pytest.approx(10.0)
    assert CallProfile.from_dict(profile.to_dict()) == profile
    with pytest.raises(ValueError):
        CallProfile({2: 1.0})  # no single-row cost: nothing to compare with


def test_batch_cost_script_prints_a_row_per_weight_type():
    """benchmarks/batch_cost.py (the README's table of batched call costs) runs end to end."""
    from pathlib import Path

    script = Path(__file__).parents[1] / "benchmarks" / "batch_cost.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--set", "demo", "--dtypes", "bf16", "--sizes", "1,2", "--reps", "4"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.startswith("bf16"))
    ratios = [float(x.strip("()")) for x in row.split() if x.startswith("(")]
    assert ratios[0] == 1.0 and len(ratios) == 2 and ratios[1] > 0


def test_host_loop_script_prints_a_row_per_method_and_temperature():
    """benchmarks/host_loop.py (host cost per token, outside llama.cpp) runs end to end."""
    from pathlib import Path

    script = Path(__file__).parents[1] / "benchmarks" / "host_loop.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--vocab", "4096", "--tokens", "16", "--repeat", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()[2:]]
    assert sorted((r[0], r[1]) for r in rows) == sorted((m, t) for m in ("ensemble", "sd", "naive-cos", "cos") for t in ("0", "1"))
    assert all(float(r[2]) > 0 for r in rows)
    assert all(r[3].endswith("%") for r in rows if r[0] != "ensemble")


def test_bench_sequences_reports_aggregate_throughput_per_level(models, tmp_path):
    out_json = tmp_path / "t.json"
    proc = subprocess.run(
        [sys.executable, "-m", "localcos", "bench", "--models", f"{models['base']},{models['sibling']}", "--sequences", "1,2,4",
         "--methods", "ensemble,cos", "--gamma", "2", "--temperature", "1", "--limit-prompts", "4", "--max-tokens", "8", "--json", str(out_json)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "sequences decoded together: 1, 2, 4" in proc.stdout and "vs 1" in proc.stdout
    rows = json.loads(out_json.read_text())["throughput"]
    assert {(r["method"], r["sequences"]) for r in rows} == {(m, k) for m in ("ensemble", "cos") for k in (1, 2, 4)}
    per_token = {(r["method"], r["sequences"]): sum(r["calls"]) / r["tokens"] for r in rows}
    for r in rows:
        assert r["tokens"] == 8 * r["sequences"] and r["seconds"] > 0
    # sequences decoded together share calls: the ensemble's one call per model and token is
    # divided among them, each further sequence adding at most its prompt's call (prompts may go
    # in calls of their own where this machine's call profile prices them so); cos's fall too
    calls = {(r["method"], r["sequences"]): r["calls"] for r in rows}
    for k in (2, 4):
        assert all(c <= c1 + k - 1 for c, c1 in zip(calls[("ensemble", k)], calls[("ensemble", 1)])), calls
    assert per_token[("cos", 4)] < per_token[("cos", 2)] < per_token[("cos", 1)], per_token
