"""Gated combination: r is the lead model's own distribution where it is sure of the next token,
the combination elsewhere (`Gated`), and the members the gate does not ask are not evaluated
(lazy members). Exact under every method: the joint law of continuations on NumPy fakes, greedy
cos equal to the greedy ensemble on synthetic F16 models (token and byte level), and the lazy
decoder's text equal to an eager one's, which evaluates every model at every token."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from conftest import assert_same_or_near_tie, within_budget
from fakes import FakeModel
from localcos import Contrastive, CustomCombiner, Ensemble, LogitMix, WeightedEnsemble
from localcos.core.combiners import Gated
from localcos.core.sampling import softmax
from localcos.errors import ConfigError
from test_fake_decoding import METHODS, joint_test


def eager(gated: Gated) -> CustomCombiner:
    """The same r computed from every model's row at every position (no laziness): log r as
    logits, so at temperature 1 (and greedy, which computes r at 1) r is the gated r."""

    def log_r(logits: list[np.ndarray]) -> np.ndarray:
        with np.errstate(divide="ignore"):
            return np.log(gated.combine(logits, 1.0))

    return CustomCombiner(log_r, name="eager")


# --- the definition, brute force ----------------------------------------------------------------


@pytest.mark.parametrize("inner", [WeightedEnsemble([0.3, 0.7]), Contrastive(mu=0.5), LogitMix([1, 2])])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_r_is_the_leads_own_where_it_is_sure_and_the_combination_elsewhere(inner, temperature):
    rng = np.random.default_rng(4)
    logits = [rng.standard_normal((64, 50)).astype(np.float32) * s for s in (2.0, 3.0)]
    gated = Gated(inner, 0.3).bind(2, [100, 900]).combiner
    assert gated.lead == 1  # the heavier model (cd: its expert, the same here)
    r = gated.combine(logits, temperature)
    bound = inner.bind(2, [100, 900])
    for k in range(64):
        top = float(softmax(logits[1][k]).max())
        want = softmax(logits[1][k], temperature) if top >= 0.3 else bound.combine([rows[k : k + 1] for rows in logits], temperature)[0]
        np.testing.assert_allclose(r[k], want, rtol=1e-5, atol=1e-7)
    opened = gated.opens(logits[1])
    assert 0 < opened.sum() < 64  # both sides are tested


def test_a_gate_and_its_lead_are_checked_where_they_enter():
    with pytest.raises(ConfigError, match="gate"):
        Gated(WeightedEnsemble(), 0.0)
    with pytest.raises(ConfigError, match="gate"):
        Gated(WeightedEnsemble(), 1.5)
    with pytest.raises(ConfigError, match="lead") as e:
        Gated(WeightedEnsemble(), 0.5, lead=2).bind(2, [1, 2])
    assert e.value.param == "lead"
    with pytest.raises(ConfigError, match="gated once"):
        Gated(Gated(WeightedEnsemble(), 0.5), 0.5)


# --- exact under every method: the joint law on fakes ---------------------------------------------

GATED = {
    "we-gated": (Gated(WeightedEnsemble([0.4, 0.6]), 0.35), dict(temperature=1.0), METHODS + [("cos", "auto")]),
    "cd-gated": (Gated(Contrastive(mu=0.5), 0.3), dict(temperature=0.8), [("ensemble", None), ("cos", 4)]),
    "we-gated-lead-0": (Gated(WeightedEnsemble(), 0.5, lead=0), dict(temperature=1.0, top_k=6), [("ensemble", None), ("cos", 1)]),
}


@pytest.mark.parametrize("case, method, gamma", [(c, m, g) for c in GATED for m, g in GATED[c][2]])
def test_gated_joint_law_of_continuations(case, method, gamma):
    combiner, settings, _ = GATED[case]
    models = [FakeModel(seed=80 + i, n_params=1000 * (i + 1)) for i in range(2)]
    outs = joint_test(models, combiner, method, gamma, settings, seed=zlib.crc32(f"{case}/{method}/{gamma}".encode()))
    tokens = sum(o.stats.gate_decided for o in outs)
    opened = sum(o.stats.gate_opened for o in outs)
    assert tokens == sum(len(o.token_ids) + (o.finish_reason == "stop") for o in outs) and 0.05 * tokens < opened < 0.95 * tokens


def test_a_member_the_gate_never_asks_is_never_evaluated():
    """Lazy members: where the lead is always sure the other model is not run at all; where it
    never is, both run at every token, as without a gate."""
    models = [FakeModel(seed=90, n_params=100), FakeModel(seed=91, n_params=1000)]
    for gate, other_runs in ((1e-6, False), (1.0, True)):
        ens = Ensemble(models, Gated(WeightedEnsemble(), gate))
        out = ens.generate([1, 2], method="ensemble", max_tokens=30, seed=0, ignore_eos=True)
        assert (out.stats.models[0].calls > 0) == other_runs and out.stats.models[1].calls == 29
        assert out.stats.gate_opened == (30 if other_runs else 0) and out.stats.gate_decided == 30


@pytest.mark.parametrize("method, gamma", [("ensemble", None), ("sd", 3), ("naive-cos", 2), ("cos", 2)])
def test_lazy_members_give_the_eager_text_on_fakes(method, gamma):
    models = [FakeModel(seed=92, n_params=100), FakeModel(seed=93, n_params=1000)]
    gated = Gated(WeightedEnsemble([0.5, 0.5]), 0.4)
    lazy = Ensemble(models, gated).generate([1, 2], method=method, gamma=gamma, max_tokens=60, temperature=0, ignore_eos=True)
    full = Ensemble(models, eager(gated.bind(2, [100, 1000]).combiner)).generate(
        [1, 2], method=method, gamma=gamma, max_tokens=60, temperature=0, ignore_eos=True)  # fmt: skip
    assert lazy.token_ids == full.token_ids
    assert 0 < lazy.stats.gate_opened < lazy.stats.gate_decided
    if method == "ensemble":  # the other model catches up only where the gate opens
        assert lazy.stats.models[0].calls <= lazy.stats.gate_opened < full.stats.models[0].calls


# --- lazy members on llama.cpp models: the eager text, up to the batch noise's near-ties ----------


@pytest.mark.parametrize("names, inner", [(("base", "sibling"), WeightedEnsemble([0.5, 0.5])), (("f16", "larger"), Contrastive(mu=0.1))])
def test_lazy_members_give_the_eager_text_on_synthetic_models(models, names, inner):
    """A lazy member catches up on the tokens it skipped in one batched call, where an eager one
    evaluates each in a call of its own: the same greedy text (F32 / F16 models), parting only
    at a near-tie of r, and the lazy one evaluates the other model only where the gate opens."""
    paths = [models[n] for n in names]
    gated = Gated(inner, 0.4)
    prompt = "The river runs past the old mill"
    with Ensemble.load(paths, gated, n_ctx=256) as ens:
        bound = ens.combiner
        lazy = ens.generate(prompt, method="ensemble", temperature=0, max_tokens=64, ignore_eos=True)
        full = ens.generate(prompt, combiner=eager(bound.combiner), method="ensemble", temperature=0, max_tokens=64, ignore_eos=True)
        tokens = ens.tokenize(prompt)
    assert_same_or_near_tie(lazy.token_ids, full.token_ids, paths, bound, tokens, "lazy members")
    other = 1 - bound.gate.lead
    assert 0 < lazy.stats.gate_opened < lazy.stats.gate_decided == 64
    assert lazy.stats.models[other].calls <= lazy.stats.gate_opened < full.stats.models[other].calls == 63


# --- lazy members at the byte level: a model the gate does not ask takes its bytes later ------------


@pytest.mark.parametrize("temperature, seed", [(0.0, 0), (1.0, 5), (1.0, 6)])
def test_lazy_byte_level_members_give_the_eager_text_on_fakes(temperature, seed):
    """Two tokenizers at the byte level: the lazy member takes the bytes it skipped (scored ahead
    in one call, replayed) only where the gate opens, and its view is then where advancing at
    every byte would have brought it: the same bytes as the eager generation, which asks every
    model at every byte, with fewer of its calls."""
    from bytefakes import VOCAB_A, VOCAB_B, FakeMember
    from localcos.core.sampling import Sampler
    from localcos.runtime.bytelevel import ByteGeneration, run_to_end

    gated = Gated(Contrastive(mu=0.5, expert=1), 0.6).bind(2, [1, 2])
    outs = {}
    for name, combiner in (("lazy", gated), ("eager", eager(gated.combiner).bind(2, [1, 2]))):
        members = [FakeMember(VOCAB_A, max_paths=4, prune=0.01), FakeMember(VOCAB_B, max_paths=4, prune=0.01)]
        gen = ByteGeneration(members, [(0, 3)] * 2, combiner, Sampler(temperature=temperature), np.random.default_rng(seed),
                             max_chars=40, ignore_end=True, method="ensemble")  # fmt: skip
        outs[name] = (run_to_end(gen), members[0].calls)
    (lazy, lazy_calls), (full, full_calls) = outs["lazy"], outs["eager"]
    assert lazy.data == full.data and len(lazy.text) == 40
    assert 0 < lazy.stats.gate_opened < lazy.stats.gate_decided == len(lazy.data)
    assert lazy_calls < full_calls


def test_a_byte_level_member_r_does_not_use_is_never_evaluated():
    """Weight 0 at the byte level: the model is read in (its prompt) and never asked again."""
    from bytefakes import VOCAB_A, VOCAB_B, FakeMember
    from localcos.core.sampling import Sampler
    from localcos.runtime.bytelevel import ByteGeneration, run_to_end

    members = [FakeMember(VOCAB_A, max_paths=4, prune=0.01), FakeMember(VOCAB_B, max_paths=4, prune=0.01)]
    gen = ByteGeneration(members, [(0, 3)] * 2, LogitMix([0, 1]).bind(2, [1, 2]), Sampler(temperature=1.0), np.random.default_rng(1),
                         max_chars=30, ignore_end=True, method="ensemble")  # fmt: skip
    out = run_to_end(gen)
    assert len(out.text) == 30 and members[0].calls == 0 and members[1].calls > 0
    assert members[0].view.text == b""  # the bytes it was never asked about were never given to it


def test_lazy_byte_level_members_give_the_eager_text_across_real_tokenizers(real_models):
    """F16 models of two tokenizers: the lazy member's bytes, scored ahead and replayed where the
    gate opens, give the eager text byte for byte with fewer of its rows; where the gate never
    opens the member is never evaluated."""
    from localcos import ByteEnsemble

    prompt = "Hello wörld, def f(x):"
    for gate, opens in ((0.5, True), (0.1, False)):
        gated = Gated(Contrastive(mu=0.5, expert=1), gate)
        # the larger model leads: the eager combination (a custom one) counts max_tokens in its tokens too
        # a context the skipped bytes cannot fill (a lazy member takes them where they could reach its end)
        with ByteEnsemble.load([real_models["llama3"], real_models["qwen2"]], gated, n_ctx=1024) as ens:
            eager_r = eager(ens.combiner.combiner)
            lazy = ens.generate(prompt, max_tokens=20, temperature=0.0, method="ensemble", ignore_eos=True)
            full = ens.generate(prompt, max_tokens=20, temperature=0.0, method="ensemble", ignore_eos=True, combiner=eager_r)
        assert lazy.text == full.text and within_budget(lazy.stats.tokens, 20)
        assert (lazy.stats.gate_opened > 0) == opens and lazy.stats.gate_opened < lazy.stats.gate_decided
        assert 0 < lazy.stats.rows[0] < full.stats.rows[0] if opens else lazy.stats.calls[0] == 0 < full.stats.calls[0]


def test_the_byte_levels_gate_is_decided_once_even_at_its_threshold():
    """Where the lead's top symbol probability is within rounding of the threshold, deciding the
    gate twice (from the float64 probabilities, then again from float32 log-probabilities inside
    the combination) can disagree, and the combination then asked for a member the first decision
    left unevaluated (a TypeError). Decided once: where the lead's top probability is at least
    the threshold, r is its own distribution, the other model not asked; below it, the inner
    combination of both."""
    from localcos.runtime.bytelevel import combine_symbols

    gated = Gated(Contrastive(mu=0.5), 0.5).bind(2, [1, 2])  # the lead: model 1
    inner = Contrastive(mu=0.5).bind(2, [1, 2])
    rng = np.random.default_rng(0)
    disagreed = 0
    for _ in range(5000):
        top = 0.5 + rng.uniform(-3e-7, 3e-7)
        lead = np.concatenate([[top], (1 - top) * rng.dirichlet(np.ones(256))])  # 256 bytes and the end
        with np.errstate(divide="ignore"):
            disagreed += bool(gated.combiner.opens(np.log(lead)[None, :].astype(np.float32))[0]) == (top >= 0.5)
        if top >= 0.5:
            np.testing.assert_allclose(combine_symbols(gated, [None, lead], 1.0), lead, rtol=1e-5, atol=1e-9)
        else:
            other = rng.dirichlet(np.ones(257))
            np.testing.assert_allclose(combine_symbols(gated, [other, lead], 1.0), combine_symbols(inner, [other, lead], 1.0), rtol=1e-6)
    assert disagreed > 0  # the two formulas do part near the threshold: the case this test is for
