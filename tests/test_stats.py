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


def test_byte_stats_aggregate_every_field_by_its_kind():
    """A byte-level request's totals: counters summed, per-model lists model by model, the most
    paths the largest, what describes the request the first's; every field is covered, so a
    counter added later is totalled without a second list of fields."""
    from dataclasses import fields

    from localcos.core.level import Level
    from localcos.runtime.bytelevel.results import ByteStats

    def one(k: int, reason: str) -> ByteStats:
        values = {f.name: getattr(ByteStats(), f.name) for f in fields(ByteStats)}
        for name, value in values.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                values[name] = k
        lists = {name: [k, 2 * k] for name in ("calls", "rows", "most_paths", "restarts", "dropped", "folded", "missed")}
        return ByteStats(**{**values, **lists, "level": Level.MIXED, "finish_reason": reason, "names": [f"m{k}", "x"],
                            "method": "cos", "combiner": f"c{k}"})  # fmt: skip

    total = ByteStats.aggregate([one(1, "stop"), one(3, "length")])
    for f in fields(ByteStats):
        value = getattr(total, f.name)
        if f.name in ("calls", "rows", "restarts", "dropped", "folded", "missed"):
            assert value == [4, 8], f.name
        elif f.name == "most_paths":
            assert value == [3, 6]
        elif isinstance(getattr(ByteStats(), f.name), (int, float)):
            assert value == 4, f.name
    assert (total.level, total.method, total.combiner, total.names) == (Level.MIXED, "cos", "c1", ["m1", "x"])
    assert total.finish_reasons == {"stop": 1, "length": 1} and total.finish_reason == ""
    same = ByteStats.aggregate([one(1, "stop"), one(2, "stop")])
    assert same.finish_reason == "stop" and same.finish_reasons == {"stop": 2}


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
        "~1.25x the ensemble (est.)",
        "seed 5",
    ]
