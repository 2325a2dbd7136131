"""The lookup proposer: drafts looked up in the context, verified as point masses against r.

1. Finding drafts: the longest earlier occurrence of the text's suffix (the most recent among
   equals), within the n-gram sizes and the draft limit, the pending draft included.
2. Exactness: accepting x with probability r(x) and resampling r without x emits r (by hand and
   by chi-square); the joint law of continuations on the fake models with lookup drafts inside
   CoS and as the only proposer; on llama.cpp models, chi-square and greedy equality.
3. It pays where the context repeats: looked-up tokens accepted, fewer model calls; `auto`
   leaves it out where nothing repeats.
"""

from __future__ import annotations

import zlib
from collections import Counter

import numpy as np
import pytest

from conftest import assert_same_or_near_tie
from fakes import FakeModel
from localcos import Contrastive, Ensemble, WeightedEnsemble
from localcos.core.lookup import ContextIndex, LookupSettings, LookupState, worth_drafting
from localcos.core.verify import verify
from localcos.testing.invariants import checked
from statcheck import assert_matches
from test_fake_decoding import joint_test

WIDE = LookupSettings("on", ngram_min=1, ngram_max=4, max_tokens=3)


# --- 1. finding drafts -----------------------------------------------------------------------------


def test_the_longest_most_recent_earlier_occurrence_is_continued():
    s = LookupSettings("on", ngram_min=2, ngram_max=5, max_tokens=4)
    #        0  1  2  3  4  5  6  7  8  9 10 11 12
    tokens = [7, 1, 2, 3, 9, 9, 5, 1, 2, 8, 8, 0, 1]
    index = ContextIndex(tokens, 4)
    # suffix [0, 1] + tail [2]: "1 2" occurs at 1 and 7; "0 1 2" nowhere earlier -> the most recent "1 2" (7) -> 8 8 0 1
    assert index.continuation([2], s) == [8, 8, 0, 1]
    # a longer match wins over a more recent shorter one: "9 5 1 2" at 5..8 vs "3 1 2"?
    index2 = ContextIndex([4, 5, 1, 2, 6, 3, 1, 2, 7, 4, 5, 1, 2], 4)
    assert index2.continuation([], s) == [6, 3, 1, 2]  # "4 5 1 2" (0..3) beats "1 2" at 6
    # limits: never past the end; nothing below ngram_min; nothing to find
    assert ContextIndex([1, 2, 3, 1, 2], 4).continuation([], s) == [3, 1, 2]
    assert ContextIndex([1, 2, 3, 4], 4).continuation([], s) == []
    assert ContextIndex([5, 1, 2, 6, 2], 4).continuation([], s) == []  # "6 2": no earlier occurrence
    index.extend([2])
    assert index.continuation([], s) == [8, 8, 0, 1]
    index.truncate(3)
    assert index.n == 3


def test_auto_takes_only_the_rows_that_pay():
    def cost(k: int) -> float:
        return 0.3 * k

    assert worth_drafting([1, 2, 3, 4], alpha=0.9, extra_cost=cost, saving=1.0) == 4
    assert worth_drafting([1, 2, 3, 4], alpha=0.2, extra_cost=cost, saving=1.0) == 0
    assert 0 < worth_drafting([1, 2, 3, 4], alpha=0.6, extra_cost=cost, saving=1.0) < 4


def test_a_continuation_left_out_is_judged_by_what_is_committed():
    """auto learns the acceptance of looked-up tokens without drafting them: the committed tokens
    after a watched continuation are its verdicts (a match is an acceptance, the first difference
    a rejection), and nothing is counted when a pending model draft before it was not kept."""
    state = LookupState(LookupSettings(), ContextIndex([1, 2, 3], 64))
    state.watch(10, [7], [4, 5, 6])
    state.watch(10, [], [8])  # one at a time: ignored while the first is watched
    for position, token in [(9, 2), (10, 7), (11, 4), (12, 5), (13, 9)]:
        state.committed(position, token)
    assert (state.outcomes.accepted, state.outcomes.tested) == pytest.approx((2, 3))
    state.watch(20, [], [4, 5])
    state.committed(20, 4)
    state.committed(21, 5)  # the whole continuation came true
    assert state.outcomes.accepted == pytest.approx(2 * 0.995**2 + 2)
    state.watch(30, [7], [4])
    state.committed(30, 3)  # the model's draft was replaced: no verdict on the continuation
    assert state.outcomes.tested == pytest.approx(3 * 0.995**2 + 2) and not state.watched


# --- 2. exactness ----------------------------------------------------------------------------------


def test_a_point_mass_draft_emits_r():
    """Accept x with probability r(x), else sample r without x: the emitted token follows r."""
    rng = np.random.default_rng(5)
    r = np.array([0.05, 0.5, 0.1, 0.3, 0.05], dtype=np.float32)
    emitted = []
    for _ in range(20000):
        v = verify([3], [None], r[None, :].copy(), rng)
        emitted.append(3 if v.accepted else v.resample)
        assert v.resample != 3
    assert_matches(Counter(emitted), r, "point-mass draft")
    # mixed with sampled drafts: the second token's verdict uses its own q
    q = np.full(5, 0.2, dtype=np.float32)
    v = verify([1, 2], [None, q], np.stack([r, r]), np.random.default_rng(0))
    assert v.accepted in (0, 1, 2)


CASES = {
    "we-2": (2, WeightedEnsemble([0.4, 0.6]), dict(temperature=1.0)),
    "cd-2": (2, Contrastive(mu=0.5), dict(temperature=0.8)),
}


@pytest.mark.parametrize("proposer", [None, "lookup"], ids=["cos+lookup", "lookup-proposer"])
@pytest.mark.parametrize("case", list(CASES))
def test_joint_law_with_lookup_drafts(case, proposer):
    n_models, combiner, settings = CASES[case]
    models = [FakeModel(seed=10 + i, n_params=1000 * (i + 1)) for i in range(n_models)]
    outs = joint_test(
        models, combiner, "cos", 2, settings, seed=zlib.crc32(f"{case}/{proposer}".encode()), prompt=(1, 2, 3, 1, 2, 4, 1, 2),
        proposer=proposer, lookup="on", lookup_ngram=(1, 4), lookup_tokens=3,
    )  # fmt: skip
    proposed = sum(o.stats.lookup_proposed for o in outs)
    accepted = sum(o.stats.lookup_accepted for o in outs)
    assert accepted > 100 and proposed - accepted > 100  # accepted and rejected, often


def test_cos_with_lookup_follows_r_on_llama_cpp_models(models):
    from test_speculative import check_sampling

    paths = [models["base"], models["sibling"]]
    outs = check_sampling("we-t1 lookup", paths, WeightedEnsemble([0.5, 0.5]), dict(temperature=1.0), (("cos", 2),),
                          generation=dict(lookup="on", lookup_ngram=(1, 4)), prompt="the mill and the river and the mill and the river and the")  # fmt: skip
    # the synthetic models rarely repeat the prompt: these drafts are rejected, through the
    # residual of a point mass (the fake models' test has them accepted too)
    assert sum(o.stats.lookup_proposed for o in outs) > 300


REPEATING = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(a, b):\n"


@pytest.mark.parametrize("combine", ["we", "cd"])
def test_greedy_with_lookup_equals_the_ensemble_and_saves_calls(models, combine):
    paths = [models["base"], models["sibling"]] if combine == "we" else [models["base"], models["larger"]]
    combiner = WeightedEnsemble([0.5, 0.5]) if combine == "we" else Contrastive(mu=0.1)
    with Ensemble.load(paths, combiner, n_ctx=512) as ens:
        prompt = ens.tokenize(REPEATING * 2)
        settings = dict(temperature=0, max_tokens=48, ignore_eos=True)
        reference = ens.generate(prompt, method="ensemble", **settings)
        without = checked(ens).generate(prompt, method="cos", gamma=2, lookup="off", **settings)
        for proposer in (None, "lookup"):
            out = checked(ens).generate(prompt, method="cos", gamma=2, proposer=proposer, lookup="on", lookup_ngram=(2, 12), **settings)
            assert_same_or_near_tie(out.token_ids, reference.token_ids, paths, ens.combiner, prompt, f"lookup {proposer}")
            assert out.stats.lookup_proposed > 0
            assert all(o.kind != "lookup" or o.model is None for o in out.origins)
        out = ens.generate(prompt, method="cos", gamma=2, lookup="on", lookup_ngram=(2, 12), **settings)
        # the synthetic models continue their own text: it repeats, and looked-up drafts are accepted
        if out.stats.lookup_accepted >= 10:
            assert sum(out.stats.calls) < sum(without.stats.calls)
        assert any(o.kind == "lookup" for o in out.origins) == (out.stats.lookup_accepted > 0)


def test_auto_leaves_lookup_out_where_nothing_repeats(models):
    with Ensemble.load([models["base"], models["sibling"]], n_ctx=512) as ens:
        prompt = list(range(10, 60))  # no n-gram repeats in the prompt
        out = ens.generate(prompt, method="cos", gamma=2, lookup="auto", temperature=1.0, seed=3, max_tokens=40, ignore_eos=True)
        assert out.stats.lookup_proposed <= 6  # (the text it writes may repeat a little)


def test_a_seed_pins_sampled_text_with_lookup_auto():
    """auto decides on planned costs and on this completion's own outcomes: the same seed gives
    the same sampled text however many generations ran before (a fake model's repetitive text
    makes lookup drafts and rejections frequent)."""
    models = [FakeModel(seed=80, n_params=1000), FakeModel(seed=81, n_params=3000)]
    for m in models:
        m.offloaded = "1/1"  # planned as on a GPU, where verification rows are cheap and auto drafts
    ens = Ensemble(models, WeightedEnsemble())
    prompt = [1, 2, 3, 1, 2, 4, 1, 2]
    first = ens.generate(prompt, method="cos", gamma=2, lookup="auto", temperature=1.0, seed=11, max_tokens=60, ignore_eos=True)
    ens.generate(prompt, method="cos", gamma=2, lookup="auto", temperature=1.0, seed=12, max_tokens=60, ignore_eos=True)
    again = ens.generate(prompt, method="cos", gamma=2, lookup="auto", temperature=1.0, seed=11, max_tokens=60, ignore_eos=True)
    assert first.stats.lookup_proposed > 0 and first.stats.lookup_accepted < first.stats.lookup_proposed
    assert again.token_ids == first.token_ids


@pytest.mark.parametrize(
    "flag, value",
    [("--lookup", "sometimes"), ("--lookup-ngram", "5,3"), ("--lookup-ngram", "0,3"), ("--lookup-tokens", "0"), ("--proposer", "lookups")],
)
def test_bad_lookup_settings_are_one_line(models, flag, value):
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "localcos", "generate", "--models", f"{models['base']},{models['sibling']}", "--prompt", "x", flag, value],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and flag in proc.stderr, proc.stderr
