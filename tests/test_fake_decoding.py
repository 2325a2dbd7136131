"""Every method on pure-NumPy fake models: the joint distribution of whole continuations is r's.

The fakes make exact sequence probabilities cheap, so these tests check the full joint law of
3-token continuations (not just conditionals) with large samples, for many combiners, settings
and proposal lengths, in seconds.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from fakes import FakeModel, exact_joint
from localcos import Contrastive, Ensemble, Guidance, LogitMix, WeightedEnsemble
from localcos.errors import ConfigError
from localcos.core.sampling import Sampler
from localcos.core.speedmodel import AutoGamma, CallProfile, Costs
from localcos.testing.invariants import checked
from statcheck import assert_law

LENGTH = 3
# draws per case: a chi-square test on a few hundred joint outcomes at ALPHA = 1e-4 sees a broken
# draft, cache, turn or accept/residual step; an acceptance or residual off by ~10% moves too
# little mass for it, and is the kernel's own test (tests/test_verify.py, many draws per pair)
N = 2000


def joint_test(models, combiner, method, gamma, settings, seed, prompt=(1, 2), **generation):
    """N completions of LENGTH tokens: their joint law is r's (chi-square). `settings` are the
    sampler's, `generation` more generation settings (lookup ...)."""
    ens = Ensemble(models, combiner)
    prompt = list(prompt)
    outs = checked(ens).generate_many(prompt, N, method=method, gamma=gamma, max_tokens=LENGTH, seed=seed, **settings, **generation)
    assert_law(outs, exact_joint(models, ens.combiner, Sampler(**settings), prompt, LENGTH), f"{method}(gamma {gamma}) joint law")
    return outs


CASES = {
    "we-2": (2, WeightedEnsemble([0.4, 0.6]), dict(temperature=1.0)),
    "cd-2": (2, Contrastive(mu=0.5), dict(temperature=1.0)),
    "cd-plausible": (2, Contrastive(mu=1.0, plausibility=0.2), dict(temperature=0.7)),
    "mix-3": (3, LogitMix([1, 1, 2]), dict(temperature=1.2, top_k=5)),
    "we-3-top-p": (3, WeightedEnsemble(), dict(temperature=1.0, top_p=0.8)),
    "we-4-min-p": (4, WeightedEnsemble([1, 2, 3, 4]), dict(temperature=1.0, min_p=0.05)),
    # the drafter (model 0, the cheapest) has no share in r: plain speculative decoding
    "target-only": (2, WeightedEnsemble([0, 1]), dict(temperature=1.0)),
    "cd-mu0": (2, Contrastive(mu=0.0, expert=1), dict(temperature=0.8)),
}
METHODS = [("ensemble", None), ("sd", 3), ("naive-cos", 2), ("cos", 1), ("cos", 4)]
# --gamma auto, which may also choose the ensemble's own step (gamma 0) between drafts
AUTO = [(case, method, "auto") for case in ("we-2", "cd-2", "target-only") for method in ("cos", "sd")]


@pytest.mark.parametrize("case, method, gamma", [(c, m, g) for c in CASES for m, g in METHODS] + AUTO)
def test_joint_law_of_continuations(case, method, gamma):
    n_models, combiner, settings = CASES[case]
    models = [FakeModel(seed=10 + i, n_params=1000 * (i + 1)) for i in range(n_models)]
    outs = joint_test(models, combiner, method, gamma, settings, seed=zlib.crc32(f"{case}/{method}/{gamma}".encode()))
    if method != "ensemble" and gamma != "auto":  # (auto may choose the ensemble's own step)
        assert sum(o.stats.rejected for o in outs) > 25  # rejections happen and are handled


def test_a_model_r_does_not_use_is_never_evaluated_for_r():
    """Weight 0: the ensemble never runs that model, and sd's drafter does not score its own
    draft again in the target pass; with weight > 0 it does."""
    for weights, unused in (([0, 1], True), ([0.5, 0.5], False)):
        ens = Ensemble([FakeModel(seed=61, n_params=100), FakeModel(seed=62, n_params=1000)], WeightedEnsemble(weights))
        base = ens.generate([1, 2], method="ensemble", max_tokens=30, seed=0).stats
        assert (base.models[0].calls == 0) == unused and base.models[1].calls > 0
        sd = ens.generate([1, 2], method="sd", gamma=3, max_tokens=30, seed=0).stats
        # the drafter's calls: one per draft token (3 a pass), plus, only when r uses it, one
        # batched re-run of its draft per pass
        passes = sd.verifications
        assert (sd.models[0].calls <= 3 * passes) == unused, (weights, sd.models[0].calls, passes)


def test_per_model_gammas_for_three_models():
    models = [FakeModel(seed=30 + i) for i in range(3)]
    joint_test(models, WeightedEnsemble(), "cos", (2, 1, 3), dict(temperature=1.0), seed=5)


def test_calls_per_token_match_the_algorithm():
    """Two identical models always agree: CoS with gamma (1, 1) then needs one call per token
    (each model scores the other's token and samples a bonus in the same pass). Lookup drafts,
    which change the schedule by design, are off here and counted in test_lookup."""
    models = [FakeModel(seed=50), FakeModel(seed=50)]
    ens = Ensemble(models, WeightedEnsemble())
    out = ens.generate([1, 2], method="cos", gamma=(1, 1), max_tokens=40, seed=0, lookup="off")
    assert out.stats.acceptance_rate == 1.0
    total_calls = sum(m.calls for m in out.stats.models)
    assert total_calls <= 40 + 1
    base = ens.generate([1, 2], method="ensemble", max_tokens=40, seed=0)
    assert sum(m.calls for m in base.stats.models) == 2 * 39


@pytest.mark.parametrize("method", ["cos", "naive-cos"])
def test_a_draft_tokens_softmax_is_reused_for_r(monkeypatch, method):
    """With a probability-level combiner, r at a draft position reuses the softmax its proposer
    computed to sample it: at least one softmax per proposed token is served from the decoder's
    cache. (The joint-law tests run with check_invariants, which asserts that every kept softmax
    matches its model's current row.)"""
    from localcos.core import decoding

    computed, requested = [], []
    real, real_cached = decoding.softmax, decoding.Decoder.softmax
    monkeypatch.setattr(decoding, "softmax", lambda row, t: computed.append(1) or real(row, t))
    monkeypatch.setattr(decoding.Decoder, "softmax", lambda self, i, p: requested.append(1) or real_cached(self, i, p))
    ens = Ensemble([FakeModel(seed=70), FakeModel(seed=71)], WeightedEnsemble())
    out = ens.generate([1, 2], method=method, gamma=2, max_tokens=60, seed=0, ignore_eos=True, lookup="off")
    assert out.stats.proposed > 20 and out.stats.rejected > 0
    assert len(requested) - len(computed) >= out.stats.proposed


@pytest.mark.parametrize("n", [2, 3, 4])
def test_cos_speed_model_predicts_the_decoders_calls(n):
    """--gamma auto ranks choices by a model of the cos turn schedule; with every call costing
    the same, its tokens per call must be what the real decoder does, for 2 to 4 models."""

    base = FakeModel(seed=60, sharpness=2.5)
    models = [base] + [FakeModel(seed=60 + i, sharpness=2.5) for i in range(1, n)]
    for m in models[1:]:  # relatives of the first: acceptance about 0.7-0.8
        m.table = (0.8 * base.table + 0.6 * m.table).astype(np.float32)
    ens = Ensemble(models, WeightedEnsemble())
    for gamma in (1, 2, 4):
        outs = ens.generate_many([1, 2], 60, method="cos", gamma=(gamma,) + (1,) * (n - 1), max_tokens=100, seed=gamma, ignore_eos=True, lookup="off")
        tokens = sum(len(o.token_ids) for o in outs)
        calls = sum(m.calls for o in outs for m in o.stats.models)
        accepted = sum(o.stats.accepted for o in outs)
        tested = accepted + sum(o.stats.rejected for o in outs)
        model = AutoGamma(Costs([CallProfile.flat(1.0)] * n))
        for m in range(n):
            model.observe_verdicts(m, accepted, tested - accepted)
        predicted = model.tokens_per_second("cos", 0, gamma)
        assert predicted == pytest.approx(tokens / calls, rel=0.03), (n, gamma)


# --- members: one model under two prompts -------------------------------------------------------------

MEMBER_CASES = {
    "cfg": (Guidance(scale=1.8), dict(temperature=1.0)),
    "cd": (Contrastive(mu=0.5), dict(temperature=0.9)),
    "we": (WeightedEnsemble([0.5, 0.5]), dict(temperature=1.0, top_k=6)),
}


@pytest.mark.parametrize("case, method, gamma", [(c, m, g) for c in MEMBER_CASES for m, g in METHODS if m != "naive-cos"])
def test_a_model_under_two_prompts_samples_r_exactly(case, method, gamma):
    """One model, two members: the prompt's and a second prompt's, on two sequences of the model.
    The joint law of continuations is r's over the two members' rows, each after its own
    prompt, whatever the method (the drafts of one member checked by both); their catch-ups
    share the model's calls."""
    from fakes import FakeSequences

    combiner, settings = MEMBER_CASES[case]
    model = FakeSequences(seed=21, n_seq=2)
    prompt, second = [1, 2], [3, 4, 5]
    ens = Ensemble([model], combiner, second_prompt=True)
    assert ens.models == [model, model] and ens.n_params == [1000, 999]  # the second prompt's member counts one fewer: the prompt's leads
    outs = checked(ens).generate_many(prompt, N, method=method, gamma=gamma, max_tokens=LENGTH, seed=zlib.crc32(f"m/{case}/{method}".encode()),
                                      second_prompt=second, **settings)  # fmt: skip
    law = exact_joint([model, model], ens.combiner, Sampler(**settings), prompt, LENGTH, prompts=[prompt, second])
    assert_law(outs, law, f"{case} {method}(gamma {gamma}), one model under two prompts")
    assert any(len(parts) == 2 for parts in model.call_parts)  # both members' rows in one call


def test_a_second_prompt_is_read_by_its_own_member_and_scale_1_is_the_model_alone():
    """The second member reads the second prompt (a change of it changes the text), guidance at
    scale 1 is the model alone token for token (the second member never evaluated)."""
    from fakes import FakeSequences

    model = FakeSequences(seed=22, n_seq=2)
    alone = Ensemble([FakeModel(seed=22)], WeightedEnsemble()).generate([1, 2], max_tokens=12, temperature=0)
    ens = Ensemble([model], Guidance(scale=1.0), second_prompt=True)
    one = ens.generate([1, 2], max_tokens=12, temperature=0, second_prompt=[3, 4])
    assert one.token_ids == alone.token_ids and one.stats.models[1].calls == 0
    for second in ([3, 4], [5, 6]):
        guided_ens = Ensemble([FakeSequences(seed=22, n_seq=2)], Guidance(scale=3.0), second_prompt=True)
        guided = guided_ens.generate([1, 2], max_tokens=12, temperature=0, second_prompt=second).token_ids
        # greedy of r with each member after its own prompt, by brute force: the second prompt is read
        want: list[int] = []
        for _ in range(12):
            rows = [model.logits_after([1, 2] + want)[None, :], model.logits_after(second + want)[None, :]]
            want.append(int(np.argmax(guided_ens.combiner.combine(rows, 1.0)[0])))
        assert guided == want
        assert guided != alone.token_ids, "guidance at scale 3 moves this text off the model's own"
    with pytest.raises(ConfigError, match="is the prompt itself"):
        ens.generate([1, 2], max_tokens=2, second_prompt=[1, 2])
    with pytest.raises(ConfigError, match="give it one"):
        ens.generate([1, 2], max_tokens=2)
