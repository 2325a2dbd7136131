"""Cost-aware speculation: each model's call costs are measured once per machine and setting,
cached, and every auto plan (--gamma auto, --lookup auto, the back-off under load) is made from
them; the weight types whose batched calls are cheap are one command away (`models quantize`)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from fakes import FakeModel
from localcos import Ensemble, WeightedEnsemble
from localcos.backend import Model, read_info
from localcos.backend.slot import CallTimes
from localcos.core.speedmodel import CallProfile
from localcos.runtime import profile as profiling
from localcos.runtime.scheduler import run_completions
from localcos.runtime.plan import plan
from localcos.config.specs import GenerationConfig

# a CPU whose batched calls cost what their rows do: no draft can pay
LINEAR = CallProfile({1: 1.0, 2: 2.0, 4: 4.0, 8: 8.0})
# an accelerator's: a call of 8 rows costs about one of one row
FLAT = CallProfile({1: 1.0, 2: 1.01, 4: 1.02, 8: 1.05})
# cheap up to 4 rows, then every row costs a call: drafting pays alone, not beside 3 others
KNEE = CallProfile({1: 1.0, 2: 1.05, 3: 1.1, 4: 1.15, 5: 2.15, 6: 3.15, 8: 5.15})
# two or three rows cost more than as many one-row calls, four batch well (measured so for
# Qwen2.5-Coder-0.5B Q4_K_M on a 2-core Zen 5: 14.8, 36.7, 45.7, 49.5, 76.9 ms)
DEAR_PAIRS = CallProfile({1: 1.0, 2: 2.5, 3: 3.3, 4: 3.35, 6: 5.2})


class Timed(FakeModel):
    """A fake whose calls take what `truth` says of their rows, recorded as `Model.decode` records
    a real model's calls (seconds it never spends: nothing sleeps)."""

    def __init__(self, seed: int, truth: CallProfile, **kwargs) -> None:
        super().__init__(seed, **kwargs)
        self.truth = truth
        self.call_times = CallTimes()

    def decode(self, parts):  # type: ignore[no-untyped-def]
        out = super().decode(parts)
        self.call_times.record(sum(len(tokens) for _, tokens, _, _ in parts), self.truth(sum(len(tokens) for _, tokens, _, _ in parts)))
        return out


def relatives(profile: CallProfile, n: int = 2, truth: CallProfile | None = None) -> list[FakeModel]:
    """Fake models that agree most of the time (acceptance ~0.8), planned with `profile` (and,
    given `truth`, whose calls take what it says: `Timed`)."""

    def make(seed: int) -> FakeModel:
        return FakeModel(seed, sharpness=2.5) if truth is None else Timed(seed, truth, sharpness=2.5)

    base = make(80)
    models = [base] + [make(80 + i) for i in range(1, n)]
    for m in models[1:]:
        m.table = (0.9 * base.table + 0.3 * m.table).astype(base.table.dtype)
    for m in models:
        m.call_profile = profile
    return models


def greedy(ens: Ensemble, **options):
    return ens.generate([1, 2], method="cos", max_tokens=60, seed=0, temperature=0.0, ignore_eos=True, lookup="off", **options)


@pytest.mark.parametrize("profile, drafts", [(LINEAR, False), (FLAT, True)])
def test_auto_plans_from_the_profile_from_the_first_token(profile, drafts):
    """Where a batched call costs its rows, --gamma auto takes only the ensemble's steps from the
    first token; where it costs about one call, it drafts. The output is the ensemble's either
    way (greedy: token for token)."""
    ens = Ensemble(relatives(profile), WeightedEnsemble())
    plain = greedy(ens, gamma=3).token_ids
    want = ens.generate([1, 2], method="ensemble", max_tokens=60, seed=0, temperature=0.0, ignore_eos=True).token_ids
    assert plain == want
    auto = greedy(ens, gamma="auto")
    assert auto.token_ids == want
    if drafts:
        assert auto.stats.proposed > 0 and auto.origins[0].kind != "sample"
    else:
        assert auto.stats.proposed == 0 and all(o.kind == "sample" for o in auto.origins)


def test_auto_stops_drafting_within_a_generation_where_calls_cost_3x_what_the_profile_says():
    """The load-time profile says a call of several rows costs about one of one row (drafts pay);
    the calls take 3x that at two rows (1.5 one-row calls a row). Auto drafts at first, then, from
    what the calls measured, takes the
    ensemble's steps for the rest of the generation, and the next generation from its first
    token; the text is the ensemble's token for token. Where the calls agree with the profile, it
    drafts to the end."""
    truth = CallProfile({1: 1.0, 2: 3.0, 4: 6.0, 8: 12.0})
    want = Ensemble(relatives(FLAT), WeightedEnsemble()).generate([1, 2], method="ensemble", max_tokens=60, seed=0, temperature=0.0,
                                                                  ignore_eos=True).token_ids  # fmt: skip
    agreeing = greedy(Ensemble(relatives(FLAT, truth=FLAT), WeightedEnsemble()), gamma="auto")
    assert agreeing.token_ids == want and any(o.kind != "sample" for o in agreeing.origins[-20:])
    ens = Ensemble(relatives(FLAT, truth=truth), WeightedEnsemble())
    first, second = greedy(ens, gamma="auto"), greedy(ens, gamma="auto")
    assert first.token_ids == want and second.token_ids == want
    assert first.stats.proposed > 0 and all(o.kind == "sample" for o in first.origins[-30:]), [o.kind for o in first.origins]
    assert second.stats.proposed == 0
    # the statistics say what it planned: drafts, then rounds without one; the second, none but those
    assert first.stats.plans["none"] >= 30 and set(first.stats.plans) - {"none"}
    assert set(second.stats.plans) == {"none"} and "no draft x" in second.stats.summary()


def test_the_profiles_are_corrected_where_the_calls_disagree_with_them_not_where_every_call_slows_alike():
    """A profile the calls agree with (within 1.5x) is planned with as it is; one whose calls of
    several rows cost 3x its price is replaced by what they measured; a slowdown every model's
    calls share (another job on the machine) changes nothing."""
    from localcos.core.speedmodel import Costs

    def times(truth: CallProfile, rows: list[int], pace: float = 1.0) -> CallTimes:
        kept = CallTimes()
        for n in [1, *rows]:  # the first call is not kept (the weights paged in)
            kept.record(n, truth(n) * pace)
        return kept

    rows = [1, 2, 2, 4, 1, 2, 4, 4, 1, 2]
    steep = CallProfile({1: 1.0, 2: 3.0, 4: 6.0, 8: 12.0})
    for truth, pace, kept in ((FLAT, 1.0, True), (FLAT, 2.0, True), (steep, 1.0, False), (steep, 2.0, False)):
        costs = Costs([FLAT, FLAT], measured=[times(truth, rows, pace), times(truth, rows, pace)]).current()
        assert (costs.profiles == [FLAT, FLAT]) is kept, (truth, pace)
        if not kept:  # the measured calls, at the profile's pace: a 4-row call well past two one-row calls
            assert costs(0, 4) > 2.5 * costs(0, 1) and costs(0, 8) > costs(0, 4)


def test_speculation_backs_off_beside_other_sequences(models):
    """With a profile whose rows are cheap up to 4 a call and dear beyond, a sequence alone
    drafts; four sequences sharing the calls take the ensemble's steps while all four decode
    (a draft's rows are priced at what they add beside the others' rows)."""
    with Ensemble.load([models["base"], models["sibling"]], n_ctx=256, parallel=4) as ens:
        ens.profiles = [KNEE, KNEE]
        config = GenerationConfig(method="cos", gamma="auto", max_tokens=24, seed=0, temperature=0.0, ignore_eos=True, lookup="off")
        request = plan(ens, "The river runs", config)
        (alone,) = run_completions(ens, request, 1)
        assert alone.stats.proposed > 0
        together = run_completions(ens, request, 4)
        # (the last to finish may decode its final tokens alone, and draft again)
        assert all(o.kind == "sample" for c in together for o in c.origins[:20]), [c.stats.proposed for c in together]
        ens.profiles = [FLAT, FLAT]  # where rows are nearly free, drafting pays beside others too
        assert all(c.stats.proposed > 0 for c in run_completions(ens, request, 4))


def test_a_drafter_r_does_not_use_reads_its_prompt_only_where_drafts_repay_it(models):
    """sd with a drafter of weight 0 under --gamma auto: the drafter, cheap per draft but dear on
    a long prompt, reads nothing (not even its prompt: no call at all) where the few tokens that
    may follow cannot repay its prompt, and drafts where many can; at a fixed gamma it reads its
    prompt first. The text is the other model's alone every time (greedy)."""
    from localcos.core.speedmodel import AutoGamma, Costs

    cheap = CallProfile({k: 0.1 * t for k, t in KNEE.seconds.items()})
    with Ensemble.load([models["sibling"], models["base"]], WeightedEnsemble([0.0, 1.0]), n_ctx=1024) as ens:
        ens.profiles = [cheap, KNEE]
        prompt = "The river runs " * 40

        def run(max_tokens: int, gamma: int | str):
            return ens.generate(prompt, method="sd", gamma=gamma, max_tokens=max_tokens, temperature=0.0, ignore_eos=True, lookup="off")

        alone = [ens.generate(prompt, method="ensemble", max_tokens=n, temperature=0.0, ignore_eos=True).token_ids for n in (6, 120)]
        short, long = run(6, "auto"), run(120, "auto")
        assert short.stats.models[0].calls == 0 and short.stats.proposed == 0
        assert long.stats.models[0].calls > 0 and long.stats.proposed > 0
        fixed = run(6, 3)
        assert fixed.stats.models[0].calls > 0 and fixed.stats.proposed > 0
        assert [short.token_ids, long.token_ids] == alone and fixed.token_ids == alone[0]
    # the plan itself: the same drafter and acceptance, the prompt's lag priced against what may follow
    plan_of = AutoGamma(Costs([cheap, KNEE]), used=(False, True))
    assert plan_of.choose("sd", [0])[1] > 0  # nothing to catch up: drafts pay
    assert AutoGamma(Costs([cheap, KNEE]), used=(False, True)).choose("sd", [0], lag=[300, 0], remaining=6)[1] == 0
    assert AutoGamma(Costs([cheap, KNEE]), used=(False, True)).choose("sd", [0], lag=[300, 0], remaining=3000)[1] > 0


def test_requests_are_grouped_into_the_calls_that_cost_least():
    """One call for every request that fits where calls batch well (or cost their rows: no split
    is cheaper); where two rows cost more than two calls, a pair goes in two calls while four
    go in one; the model's limits always hold, and `least` prices what `group` makes."""
    ones = [1] * 4

    def calls(profile: CallProfile, tokens: list[int], most: int = 64) -> list[list[int]]:
        return [list(g) for g in profile.group(tokens, lambda i, j: sum(tokens[i:j]) <= most)]

    for profile in (FLAT, LINEAR):
        assert not profile.splits_pay
        assert calls(profile, ones) == [[0, 1, 2, 3]] and calls(profile, [3, 1, 1]) == [[0, 1, 2]]
        assert calls(profile, [3, 1, 1, 2], most=4) == [[0, 1], [2, 3]]  # as many as fit, in order
    assert calls(KNEE, ones) == [[0, 1, 2, 3]] and calls(KNEE, [1] * 8) == [[0, 1, 2, 3], [4, 5, 6, 7]]  # past the knee: two calls of 4
    assert DEAR_PAIRS.splits_pay
    assert calls(DEAR_PAIRS, [1, 1]) == [[0], [1]]
    assert calls(DEAR_PAIRS, ones) == [[0, 1, 2, 3]]
    assert calls(DEAR_PAIRS, ones, most=3) == [[0], [1], [2], [3]]  # 3 + 1 costs more than four calls
    assert calls(DEAR_PAIRS, [4, 1, 1]) == [[0, 1, 2]]  # six rows cost less than four and two
    assert calls(DEAR_PAIRS, []) == [] and calls(FLAT, []) == []
    assert DEAR_PAIRS.least((1, 1)) == 2.0 and DEAR_PAIRS.least((1,) * 4) == 3.35 and LINEAR.least((1, 1)) == 2.0


def test_a_draft_beside_other_sequences_is_priced_at_the_calls_the_scheduler_makes():
    """Under load a request's price is what it adds to the calls its rows join: beside one other
    sequence on a model whose pairs cost more than two calls, the calls are split, so one more
    row costs one call (not half of a dear pair's)."""
    from localcos.core.speedmodel import Costs

    beside_one = Costs([DEAR_PAIRS]).under_load([1])
    assert beside_one(0, 1) == pytest.approx(1.0)
    assert Costs([KNEE]).under_load([1])(0, 1) == pytest.approx(KNEE(2) / 2)  # unchanged where calls batch well


def test_the_scheduler_splits_calls_that_cost_more_than_their_parts(models):
    """Sequences of several methods on models whose pairs of rows are dear: every call is one
    the profile would not split, none holds only one-token requests (with a profile where
    calls batch well, some do), and each sequence gets the tokens it gets alone (greedy;
    near-ties aside, as batching rounds differently)."""
    from conftest import assert_same_or_near_tie
    from localcos.runtime.scheduler import Scheduler

    pair = [models["base"], models["sibling"]]
    prompts = ["The river runs past the old mill", "def count_words(sentence: str) -> dict[str, int]:", "Which planet is closest to the Sun?"]
    settings = [("ensemble", None), ("cos", 3), ("sd", 2)]
    configs = [GenerationConfig(method=m, gamma=g, max_tokens=24, temperature=0.0, ignore_eos=True, lookup="off") for m, g in settings]
    with Ensemble.load(pair, n_ctx=256) as ens:
        want = [ens.generate(p, config=c).token_ids for p, c in zip(prompts, configs)]
    with Ensemble.load(pair, n_ctx=256, parallel=3) as ens:
        for name, profiles, pairs_expected in (("dear", [DEAR_PAIRS, DEAR_PAIRS], False), ("flat", [FLAT, FLAT], True)):
            ens.profiles = profiles
            shapes: list[tuple[int, ...]] = []
            for m in ens.models:
                original = m.decode

                def decode(parts, _original=original, _shapes=shapes):
                    _shapes.append(tuple(len(tokens) for _, tokens, _, _ in parts))
                    return _original(parts)

                m.decode = decode
            scheduler = Scheduler(ens)
            done = [scheduler.submit(plan(ens, p, c), np.random.default_rng(0)) for p, c in zip(prompts, configs)]
            scheduler.run()
            for m in ens.models:
                del m.decode
            # every call is one the profile would not split; two or three one-token requests never share one
            assert all(len(profiles[0].group(list(shape))) == 1 for shape in shapes), (name, shapes)
            assert any(len(shape) > 1 and set(shape) == {1} for shape in shapes) == pairs_expected, (name, shapes)
            for k, (sequence, prompt) in enumerate(zip(done, prompts)):
                assert len(sequence.completion.token_ids) == 24
                assert_same_or_near_tie(sequence.completion.token_ids, want[k], pair, ens.combiner, ens.tokenize(prompt), f"{name}: {settings[k]}")


def test_profiles_are_measured_once_and_cached_per_file_and_threads(models, tmp_path, monkeypatch):
    """The first load measures (k rows per call, k = 1..6); the next load with the same file and
    settings reads the cache; another thread count or a changed file measures again."""
    monkeypatch.setenv("LOCALCOS_CACHE", str(tmp_path / "cache"))
    measured = []
    real = profiling.measure

    def counting(model, *args, **kwargs):
        measured.append(model.n_threads)
        return real(model, *args, **kwargs)

    monkeypatch.setattr(profiling, "measure", counting)
    path = tmp_path / "m.gguf"
    path.write_bytes(models["base"].read_bytes())

    def profile_of(threads: int, calibrate: bool = False) -> CallProfile:
        with Model(path, n_ctx=64, n_threads=threads) as m:
            return profiling.profile(m, calibrate)

    first = profile_of(1)
    assert measured == [1] and set(first.seconds) == set(profiling.PROFILE_ROWS)
    assert all(t > 0 for t in first.seconds.values())
    assert profile_of(1) == first and measured == [1]  # cached: nothing measured
    assert len(list((tmp_path / "cache" / "profiles").glob("*.json"))) == 1
    profile_of(2)
    assert measured == [1, 2]  # another thread count: another profile
    profile_of(1, calibrate=True)
    assert measured == [1, 2, 1]  # --calibrate measures again
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    profile_of(1)
    assert measured == [1, 2, 1, 1]  # the file changed
    assert not list((tmp_path / "cache" / "profiles").glob(".localcos-tmp-*"))


def test_models_quantize_writes_the_type_asked_and_is_usable_by_name(models, tmp_path):
    """`models quantize FILE --type q4_0` writes a file llama.cpp loads whose general.file_type is
    Q4_0, into the cache as NAME@TYPE, listed by `models list` and usable by that name; it prints
    the sizes, the perplexity change and both files' batched call costs."""
    env = {**os.environ, "LOCALCOS_CACHE": str(tmp_path / "cache")}
    source = tmp_path / "small.gguf"
    source.write_bytes(models["base"].read_bytes())

    def localcos(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "localcos", *args], capture_output=True, text=True, timeout=600, env=env)

    done = localcos("models", "quantize", str(source), "--type", "q4_0")
    assert done.returncode == 0, done.stderr
    made = tmp_path / "cache" / "quantized" / "small@q4_0.gguf"
    assert f"wrote {made}" in done.stdout and "use it as small@q4_0" in done.stdout
    assert "perplexity on" in done.stdout and "b(4)" in done.stdout
    assert read_info(made).quantization == "Q4_0"
    with Model(made, n_ctx=32) as m:
        assert m.evaluate([1, 2, 3], 1).shape == (1, m.n_vocab)
    assert "small@q4_0" in localcos("models", "list").stdout
    info = localcos("models", "info", "small@q4_0", "--no-profile")
    assert info.returncode == 0 and "Q4_0" in info.stdout, info.stderr
    for args, words in [
        (("models", "quantize", str(source), "--type", "q5_1"), ("--type", "q4_0, iq4_nl, q8_0")),
        (("models", "quantize", str(tmp_path / "missing.gguf"), "--type", "q4_0"), ("not found",)),
        (("models", "quantize", str(made), "--type", "q4_0"), ("q4_0 weights already",)),
        (("models", "info", "small@iq4_nl"), ("models quantize small --type iq4_nl",)),
    ]:
        proc = localcos(*args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and all(w in lines[0] for w in words), (args, proc.stderr)
