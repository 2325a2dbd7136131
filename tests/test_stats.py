"""The one statistics model: counters, derived rates, aggregation and the summary line."""

from __future__ import annotations

import time

import pytest

from fakes import FakeModel
from localcos import Ensemble, GenerationStats, ModelRunStats


class TimedFake(FakeModel):
    """A fake whose calls take a known time inside `evaluate`, as llama.cpp's do."""

    CALL_SECONDS = 0.002

    def evaluate(self, tokens, n_logits=None):
        t0 = time.perf_counter()
        time.sleep(self.CALL_SECONDS)
        out = super().evaluate(tokens, n_logits)
        self.stats.seconds += time.perf_counter() - t0
        return out


def test_time_splits_into_llama_and_host():
    ens = Ensemble([TimedFake(1), TimedFake(2)])
    out = ens.generate([1, 2], method="cos", gamma=2, max_tokens=30, seed=0, ignore_eos=True)
    s = out.stats
    calls = sum(s.calls)
    assert calls > 0 and s.llama_seconds >= calls * TimedFake.CALL_SECONDS
    assert s.llama_seconds < sum(m.stats.seconds for m in ens.models)  # the prompt's calls are not decoding's
    assert s.host_seconds == pytest.approx(s.seconds - s.llama_seconds)
    assert 0 < s.host_seconds < s.seconds
    assert s.host_fraction == pytest.approx(s.host_seconds / s.seconds)


def _stats(tokens, seconds, accepted, rejected, verifications, calls, seed=None):
    return GenerationStats(
        method="cos",
        combiner="we(0.5,0.5)",
        models=[ModelRunStats("a", calls[0], tokens, seconds * 0.3), ModelRunStats("b", calls[1], tokens, seconds * 0.5)],
        tokens=tokens,
        seconds=seconds,
        proposed=accepted + rejected + 1,
        accepted=accepted,
        rejected=rejected,
        verifications=verifications,
        seed=seed,
        ensemble_llama_seconds=seconds,
        finish_reasons={"length": 1},
    )


def test_byte_level_stats_aggregate_every_field_by_its_kind():
    """A byte-level request's totals: counters summed, per-model lists and each model's work
    model by model, the most paths the largest, what describes the request the first's; every
    field is covered, so a counter added later is totalled without a second list of fields."""
    from dataclasses import fields

    from localcos.core.level import Level

    per_model = ("restarts", "dropped_mass", "folded", "missed_rows")
    described = ("method", "combiner", "level", "seed", "gamma", "proposer")

    def one(k: int, reason: str) -> GenerationStats:
        values = {f.name: getattr(GenerationStats("", "", []), f.name) for f in fields(GenerationStats)}
        for name, value in values.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                values[name] = k
        lists = {name: [k, 2 * k] for name in (*per_model, "most_paths")}
        return GenerationStats(**{**values, **lists, "level": Level.MIXED, "finish_reason": reason, "finish_reasons": {},
                                  "models": [ModelRunStats(f"m{k}", k, 10 * k, 0.5 * k), ModelRunStats("x", 2 * k, k, k)],
                                  "method": "cos", "combiner": f"c{k}", "seed": k, "ensemble_llama_seconds": float(k),
                                  "plans": {"0:4": k, "none": 1} if k > 1 else {"none": 1}})  # fmt: skip

    total = GenerationStats.aggregate([one(1, "stop"), one(3, "length")])
    for f in fields(GenerationStats):
        value = getattr(total, f.name)
        if f.name in per_model:
            assert value == [4, 8], f.name
        elif f.name == "most_paths":
            assert value == [3, 6]
        elif f.name in described:
            assert value == getattr(one(1, "stop"), f.name), f.name
        elif f.name == "plans":
            assert value == {"none": 2, "0:4": 3}
        elif f.name == "models":
            assert [(m.name, m.calls, m.tokens, m.seconds) for m in value] == [("m1", 4, 40, 2.0), ("x", 8, 4, 4.0)]
        elif f.name not in ("finish_reason", "finish_reasons"):
            assert value == 4, f.name
    assert total.names == ["m1", "x"] and total.rows == [40, 4] and total.calls == [4, 8]
    assert total.finish_reasons == {"stop": 1, "length": 1} and total.finish_reason == ""
    same = GenerationStats.aggregate([one(1, "stop"), one(2, "stop")])
    assert same.finish_reason == "stop" and same.finish_reasons == {"stop": 2}


def test_the_statistics_document_has_the_same_keys_at_every_level_null_where_a_level_counts_nothing():
    from localcos.core.level import Level

    def at(level: Level) -> dict:
        return GenerationStats("cos", "we", [ModelRunStats("a", 3, 9, 0.1)], level=level, tokens=4, seconds=1.0, chars=12, bytes=12,
                               proposed=5, accepted=2, rejected=1, verifications=1, most_paths=[2], restarts=[0], dropped_mass=[0.0],
                               folded=[0], missed_rows=[0], token_bytes=8, drafted=3).to_dict()  # fmt: skip

    token, mixed, byte = at(Level.TOKEN), at(Level.MIXED), at(Level.BYTE)
    assert list(token) == list(mixed) == list(byte)
    assert (token["level"], mixed["level"], byte["level"]) == ("token", "mixed", "byte")
    # what each level counts, and null where it counts nothing
    assert token["proposed"] == 5 and token["acceptance_rate"] == pytest.approx(2 / 3) and token["chars"] is None
    assert token["rows"] is None and token["most_paths"] is None and token["token_bytes"] is None
    assert mixed["proposed"] is None and mixed["acceptance_rate"] is None and mixed["chars"] == 12 and mixed["rows"] == [9]
    assert mixed["token_bytes"] == 8 and byte["token_bytes"] is None and byte["drafted"] == 3
    assert token["calls"] == mixed["calls"] == byte["calls"] == [3] and token["accepted"] == byte["accepted"] == 2
    assert mixed["calls_per_char"] == [pytest.approx(3 / 12)] and token["calls_per_char"] is None


def test_aggregate_sums_counters_and_recomputes_rates():
    a = _stats(10, 1.0, 8, 2, 4, (6, 3), seed=5)
    b = _stats(30, 2.0, 10, 10, 6, (20, 9))
    total = GenerationStats.aggregate([a, b])
    assert (total.completions, total.tokens, total.seconds) == (2, 40, 3.0)
    assert (total.accepted, total.rejected, total.verifications) == (18, 12, 10)
    assert total.calls == [26, 12]
    assert total.acceptance_rate == pytest.approx(18 / 30)  # not the mean of 0.8 and 0.5
    assert total.tokens_per_second == pytest.approx(40 / 3.0)
    assert total.mean_accepted == pytest.approx(1.8)
    assert total.calls_per_token == pytest.approx(38 / 40)
    assert total.llama_seconds == pytest.approx(3.0 * 0.8)
    assert total.speedup_estimate == pytest.approx(3.0 / 2.4)
    assert total.finish_reasons == {"length": 2} and total.seed == 5
    d = total.to_dict()
    assert d["rejected"] == 12 and d["acceptance_rate"] == total.acceptance_rate and d["calls"] == [26, 12]
    assert d["models"][0]["calls_per_token"] == pytest.approx(26 / 40)
    assert "rollbacks" not in d


def test_summary_line():
    line = _stats(10, 2.0, 8, 2, 4, (6, 3), seed=5).summary()
    assert line.split(" | ") == [
        "cos",
        "10 tokens in 2.00s",
        "5.0 tok/s",
        "acceptance 80% (8/10)",
        "mean accepted 2.00",
        "calls 6/3",
        "host 20%",
        "seed 5",
    ]  # no estimate: a fifth of the time is the host's, which it does not price


def test_summary_line_shows_auto_plans_and_the_estimate_where_the_host_share_is_small():
    s = _stats(10, 2.0, 8, 2, 4, (6, 3))
    s.models[1].seconds = 2.0 * 0.65  # host 5%
    s.plans = {"0:3": 2, "none": 3, "0:4": 5, "1:2": 1}
    parts = s.summary().split(" | ")
    assert "host 5%" in parts and "~1.05x the ensemble (est.)" in parts
    assert "planned a 4 x5, 3 x2; b 2 x1; no draft x3" in parts
    assert s.to_dict()["plans"] == s.plans and s.shown_speedup_estimate == s.speedup_estimate
