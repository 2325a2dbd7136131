"""Many sequences at once: batched decoding changes which rows share a llama_decode call, never
what is sampled.

1. Greedy: sequences of every method, at different phases (a prompt going in while others draft
   or verify), decoded together give the tokens each gives alone; on the synthetic models
   near-ties aside.
2. Sampled: cos with four sequences in flight follows r (chi-square), and a seed gives the same
   completions however many run at once.
3. A cancelled sequence stops without disturbing the others: their tokens are the ones they get
   alone and every cache holds exactly what its sequence committed.
4. Shared prompts are evaluated once: `n` completions of one prompt share its KV cells.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import assert_same_or_near_tie
from localcos import Ensemble, GenerationConfig, WeightedEnsemble
from localcos.runtime.plan import plan
from localcos.runtime.scheduler import Scheduler
from localcos.testing.invariants import observe
from test_speculative import RIVAL, SAMPLING_CASES, check_sampling
from localcos.models.writer import cached_model

PROMPTS = [
    "The river runs past the old mill",
    "def count_words(sentence: str) -> dict[str, int]:",
    "Question: A baker makes 24 loaves of bread every morning and sells",
    "Which planet is closest to the Sun?",
    "Once upon a time there was a small village by the sea where",
]
SETTINGS = [  # (method, gamma) per sequence: every method, drafts of different lengths
    ("cos", 3),
    ("ensemble", None),
    ("sd", 2),
    ("naive-cos", 4),
    ("cos", 1),
]


@pytest.fixture(scope="module")
def pair(models):
    return [models["base"], models["sibling"]]


def _alone(pair, combiner, prompts, max_tokens=40, temperature=0.0, seed=0):
    with Ensemble.load(pair, combiner, n_ctx=512) as ens:
        return [
            ens.generate(p, method=m, gamma=g, temperature=temperature, max_tokens=max_tokens, seed=seed + k, ignore_eos=True).token_ids
            for k, (p, (m, g)) in enumerate(zip(prompts, SETTINGS))
        ]


def test_sequences_at_different_phases_decode_together_as_alone(pair):
    combiner = WeightedEnsemble([0.5, 0.5])
    want = _alone(pair, combiner, PROMPTS)
    with Ensemble.load(pair, combiner, n_ctx=512, parallel=3) as ens:
        scheduler = Scheduler(ens, observe=observe)
        done = {}
        rounds = 0
        calls_before = [m.stats.calls for m in ens.models]
        # continuous batching: each sequence takes a slot as one frees, in the order submitted
        for k, (prompt, (method, gamma)) in enumerate(zip(PROMPTS, SETTINGS)):
            config = GenerationConfig(method=method, gamma=gamma, temperature=0, max_tokens=40, ignore_eos=True)
            scheduler.submit(plan(ens, prompt, config), np.random.default_rng(k), key=k)
        while not scheduler.idle:
            for running in scheduler.step():
                done[running.key] = running.completion
            rounds += 1
            assert rounds < 1000
        calls = [m.stats.calls - b for m, b in zip(ens.models, calls_before)]
        per_sequence = [sum(c.stats.models[i].calls for c in done.values()) for i in range(2)]
        # the calls were shared: fewer than the sequences' calls added up
        assert all(c < s for c, s in zip(calls, per_sequence)), (calls, per_sequence)
        for k, prompt in enumerate(PROMPTS):
            got = done[k].token_ids
            assert len(got) == 40 and done[k].finish_reason == "length"
            assert_same_or_near_tie(got, want[k], pair, ens.combiner, ens.tokenize(prompt), f"sequence {k} ({SETTINGS[k][0]})")
        for m in ens.models:  # every slot's cache holds what its last sequence committed
            for slot in m.slots:
                assert slot.kv_length() == len(slot.tokens)


@pytest.mark.parametrize("dear_pairs", [False, True])
def test_a_seed_gives_the_same_completions_however_many_run_at_once(pair, dear_pairs):
    """Also where the profile splits calls (two rows dearer than two one-row calls: the
    sequences' rows then share calls differently)."""
    from test_cost_profile import DEAR_PAIRS

    outs = {}
    for parallel in (1, 4):
        with Ensemble.load(pair, n_ctx=256, parallel=parallel) as ens:
            if dear_pairs:
                ens.profiles = [DEAR_PAIRS] * 2
            many = ens.generate_many(PROMPTS[0], 10, method="cos", gamma=2, max_tokens=12, seed=42, ignore_eos=True)
            outs[parallel] = [c.token_ids for c in many]
    assert len({tuple(t) for t in outs[1]}) > 5  # different draws
    # the same random streams; batched rows may round differently, rarely enough to move a draw
    same = sum(a == b for a, b in zip(outs[1], outs[4]))
    assert same >= 9, (same, outs)


def test_cos_with_four_sequences_in_flight_follows_r(models, model_dir):
    names, comb, sampling, _ = SAMPLING_CASES["we-t1"]
    paths = [cached_model(RIVAL, model_dir) if n == "rival" else models[n] for n in names]
    check_sampling("we-t1 batched", paths, comb, sampling, (("cos", 1), ("cos", 2)), parallel=4)


def test_a_cancelled_sequence_leaves_the_others_exact(pair):
    combiner = WeightedEnsemble([0.5, 0.5])
    want = _alone(pair, combiner, PROMPTS[:3], max_tokens=60)
    with Ensemble.load(pair, combiner, n_ctx=512, parallel=3) as ens:
        scheduler = Scheduler(ens, observe=observe)
        running = []
        for k, prompt in enumerate(PROMPTS[:3]):
            method, gamma = SETTINGS[k]
            config = GenerationConfig(method=method, gamma=gamma, temperature=0, max_tokens=60, ignore_eos=True)
            running.append(scheduler.submit(plan(ens, prompt, config), np.random.default_rng(k), key=k))
        for _ in range(6):
            scheduler.step()
        running[1].cancel()
        done = {}
        while not scheduler.idle:
            for r in scheduler.step():
                done[r.key] = r.completion
        assert done[1].finish_reason == "cancelled" and 0 < len(done[1].token_ids) < 60
        # the cancelled one's cache holds exactly what it committed; the others finished as alone
        for m in ens.models:
            slot = m.slots[running[1].slot]
            prompt = ens.tokenize(PROMPTS[1])
            assert slot.tokens == (prompt + done[1].token_ids)[: len(slot.tokens)] and len(slot.tokens) >= len(prompt) + len(done[1].token_ids) - 1
            assert slot.kv_length() == len(slot.tokens)
        for k in (0, 2):
            assert done[k].finish_reason == "length"
            assert_same_or_near_tie(done[k].token_ids, want[k], pair, ens.combiner, ens.tokenize(PROMPTS[k]), f"sequence {k}")


def test_n_completions_evaluate_their_prompt_once(pair):
    with Ensemble.load(pair, n_ctx=512, parallel=4) as ens:
        prompt = ens.tokenize(PROMPTS[2] * 3)
        before = [m.stats.tokens for m in ens.models]
        outs = ens.generate_many(prompt, 4, method="ensemble", max_tokens=5, seed=1, ignore_eos=True)
        evaluated = [m.stats.tokens - b for m, b in zip(ens.models, before)]
        # the prompt once, then each completion's own tokens (and a prompt's last token per slot)
        assert all(e < len(prompt) + 4 * (5 + 1) for e in evaluated), (evaluated, len(prompt))
        for m in ens.models:
            slots = [s for s in m.slots if s.tokens]
            assert len(slots) == 4 and all(s.tokens[: len(prompt)] == prompt for s in slots)
        assert len({tuple(o.token_ids) for o in outs}) > 1
