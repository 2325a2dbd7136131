"""Exactness of the speculative methods on real llama.cpp models.

1. Greedy: sd, naive-cos and cos produce the standard ensemble's tokens, token for token; where
   they diverge, it must be a numerical near-tie of the combined scores.
2. Sampling: for every method, the 2nd and 3rd tokens of thousands of 3-token completions follow
   the exact combined distribution r computed directly from the models' logits.
3. Rollback: after a rejection, every model's next logits equal a fresh model's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from conftest import BASE, NEAR_TIE
from localcos import Contrastive, Ensemble, LogitMix, WeightedEnsemble
from localcos.backend import Model
from localcos.core.combiners import Gated
from localcos.core.decoding import Decoder, Draft
from localcos.core.sampling import Sampler
from localcos.models.writer import cached_model
from localcos.core.text import TextAssembler
from localcos.testing.invariants import assert_invariants, checked
from statcheck import assert_matches

SPECULATIVE = ("sd", "naive-cos", "cos")
PROMPTS = [
    "The river runs past the old mill",
    "def count_words(sentence: str) -> dict[str, int]:",
    "Question: A baker makes 24 loaves of bread every morning.",
    "Which planet is closest to the Sun?",
]

# a model that disagrees with the base more than the sibling does: many rejections
RIVAL = replace(BASE, noise=0.8, noise_seed=5, name="t-rival")


def run_step(step, slots):
    """Fulfil a decoding step's requests at once, as `Ensemble.stream` does."""
    try:
        request = next(step)
        while True:
            request = step.send(slots[request.model].evaluate(request.tokens, request.n_logits))
    except StopIteration:
        pass


def fresh_rows(paths, tokens):
    """Each model's logits at the position after `tokens`, from a fresh context, one batch."""
    rows = []
    for p in paths:
        m = Model(p, n_ctx=512)
        rows.append(m.evaluate(tokens, 1))
        m.close()
    return rows


def combined_scores(ens, paths, tokens):
    """Log of r at temperature 1 after `tokens`, computed from scratch."""
    r = ens.combiner.combine(fresh_rows(paths, tokens), 1.0)[0]
    with np.errstate(divide="ignore"):
        return np.log(r)


ENSEMBLES = {
    "we-2": (("base", "sibling"), WeightedEnsemble([0.5, 0.5])),
    "we-3": (("base", "sibling", "sibling2"), WeightedEnsemble()),
    "we-4": (("base", "sibling", "sibling2", "sibling3"), WeightedEnsemble()),
    "cd-2": (("base", "larger"), Contrastive(mu=0.1)),
    "cd-2-alpha": (("base", "larger"), Contrastive(mu=0.5, plausibility=0.1)),
    "mix-3": (("base", "sibling", "sibling2"), LogitMix([1, 2, 1])),
    # combined only where the lead is unsure; the other model evaluated only there (lazy)
    "we-2-gated": (("base", "sibling"), Gated(WeightedEnsemble([0.5, 0.5]), 0.4)),
    "cd-2-gated": (("base", "larger"), Gated(Contrastive(mu=0.1), 0.4)),
}


@pytest.fixture(scope="module")
def ensembles(models):
    opened = {}

    def get(key):
        if key not in opened:
            names, comb = ENSEMBLES[key]
            paths = [models[n] for n in names]
            opened[key] = (Ensemble.load(paths, comb, n_ctx=512), paths)
        return opened[key]

    yield get
    for ens, _ in opened.values():
        ens.close()


@pytest.mark.parametrize("key", list(ENSEMBLES))
def test_greedy_equals_the_standard_ensemble(ensembles, key):
    ens, paths = ensembles(key)
    gammas = [None, 3] if len(paths) == 2 else [None, 2]
    divergences = 0
    for prompt in PROMPTS:
        reference = ens.generate(prompt, method="ensemble", temperature=0, max_tokens=64, ignore_eos=True)
        assert len(reference.token_ids) == 64
        for method in SPECULATIVE:
            for gamma in gammas:
                out = checked(ens).generate(
                    prompt, method=method, gamma=gamma, temperature=0, max_tokens=64, ignore_eos=True
                )
                if out.token_ids == reference.token_ids:
                    continue
                # a divergence must be a floating-point near-tie at the first differing position
                i = next(j for j, (a, b) in enumerate(zip(out.token_ids, reference.token_ids)) if a != b)
                prefix = ens.tokenize(prompt) + reference.token_ids[:i]
                scores = combined_scores(ens, paths, prefix)
                top2 = np.sort(scores)[-2:]
                gap = top2[1] - top2[0]
                assert gap < NEAR_TIE, (
                    f"{method} (gamma {gamma}) diverged from ensemble at token {i} of {prompt!r} "
                    f"where the combined top-two gap is {gap:.4f}: not a near-tie"
                )
                assert {out.token_ids[i], reference.token_ids[i]} <= set(np.argsort(scores)[-2:].tolist())
                divergences += 1
    # near-ties are rare: nearly every run must match exactly
    assert divergences <= 2


def test_greedy_speculation_actually_speculates(ensembles):
    """Greedy cos drafts, accepts and rejects, and its verdicts are the models' own: a token it
    committed as a model's accepted draft is that model's choice there, and it rejects a draft
    only where the models do not all choose r's token (judged from fresh rows, near-ties aside).
    How many drafts that accepts is the untrained models' agreement on this CPU's kernels, not a
    share fixed in advance."""
    ens, paths = ensembles("we-2")
    out = ens.generate(PROMPTS[0], method="cos", gamma=3, temperature=0, max_tokens=64, ignore_eos=True)
    s = out.stats
    assert s.proposed > 40 and s.accepted > 0 and s.bonus > 0 and s.rejected > 0
    kinds = Counter(o.kind for o in out.origins)
    assert kinds["draft"] > 0 and kinds["bonus"] > 0 and kinds["resample"] == s.rejected
    # fewer calls than the ensemble's one call per model per token
    assert sum(m.calls for m in s.models) < 2 * 63
    prompt = ens.tokenize(PROMPTS[0])
    rows = []  # each model's rows at the generated positions, from one fresh batched call
    for p in paths:
        with Model(p, n_ctx=512) as m:
            rows.append(m.evaluate(prompt + out.token_ids[:-1], len(out.token_ids)))
    with np.errstate(divide="ignore"):
        scores = np.log(ens.combiner.combine(rows, 1.0))

    def clear(row: np.ndarray) -> bool:
        top2 = np.sort(row)[-2:]
        return bool(top2[1] - top2[0] >= NEAR_TIE)

    judged = 0
    for j, (token, origin) in enumerate(zip(out.token_ids, out.origins)):
        choices = [int(np.argmax(r[j])) for r in rows]
        if not (clear(scores[j]) and all(clear(r[j]) for r in rows)):
            continue
        judged += 1
        assert int(np.argmax(scores[j])) == token  # greedy: r's choice
        if origin.kind == "draft":
            assert choices[origin.model] == token, f"token {j}: an accepted draft its proposer did not choose"
        if origin.kind == "resample":
            assert choices != [token] * len(rows), f"token {j}: a draft rejected where every model chose r's token"
    assert judged > len(out.token_ids) // 2


# --- sampling: the output distribution is exactly r -----------------------------------------------

N_COMPLETIONS = 1800
# tokens 2 and 3 are checked after the commonest prefixes with at least this many samples: enough
# for the chi-square's pooled categories to see a conditional distribution that is off
MIN_CONDITIONAL = 50

# (method, gamma): cos with gamma 1 puts bonus tokens at positions 2 and 3, where the conditional
# samples are large; gamma 2 mixes drafts and bonuses there.
ALL_METHODS = (("ensemble", None), ("sd", 2), ("naive-cos", 2), ("cos", 1), ("cos", 2))
SAMPLING_CASES = {
    # case: (model names, combiner, sampler settings, (method, gamma) pairs)
    "we-t1": (("base", "rival"), WeightedEnsemble([0.5, 0.5]), dict(temperature=1.0), ALL_METHODS),
    "we-top-p": (("base", "sibling"), WeightedEnsemble([0.3, 0.7]), dict(temperature=1.0, top_p=0.9), ALL_METHODS),
    "cd-t1": (("base", "larger"), Contrastive(mu=0.3), dict(temperature=1.0), ALL_METHODS),  # flat: token 3 unchecked
    "we3-t1": (("base", "sibling", "rival"), WeightedEnsemble(), dict(temperature=0.8, min_p=0.01), (("cos", 1), ("naive-cos", 2))),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(SAMPLING_CASES))
def test_sampled_tokens_follow_the_combined_distribution(models, model_dir, case):
    names, comb, sampling, methods = SAMPLING_CASES[case]
    paths = [cached_model(RIVAL, model_dir) if n == "rival" else models[n] for n in names]
    check_sampling(case, paths, comb, sampling, methods, depths=(1,) if case == "cd-t1" else (1, 2))


def check_sampling(case, paths, comb, sampling, methods, n_completions=N_COMPLETIONS, generation=None, prompt="The river runs past the old mill",
                   depths=(1, 2), parallel=8, **load_options):  # fmt: skip
    """N 3-token completions per (method, gamma): token 1, and tokens 2 and 3 after the two most
    common prefixes, each follow r computed from fresh local models (a chi-square bound from
    `statcheck`). `depths`: the prefix lengths after which the next token is checked (a flat r
    leaves no 2-token prefix with enough samples). `generation`: more generation settings (lookup ...); `load_options` go to
    `Ensemble.load` (such as `rpc`). `parallel` completions decode at once, as `generate --n`
    runs them (their rows share llama.cpp calls, which these tiny models spend most of their time
    on); each draws from its own random stream, so the law checked is the same."""
    sampler = Sampler(**sampling)
    with Ensemble.load(paths, comb, n_ctx=256, parallel=parallel, **load_options) as ens:
        prompt_tokens = ens.tokenize(prompt)

        def exact(prefix):
            rows = fresh_rows(paths, prompt_tokens + list(prefix))
            return sampler.finalize(ens.combiner.combine(rows, sampler.softmax_temperature))[0]

        for k, (method, gamma) in enumerate(methods):
            what = f"{case}/{method}" + (f"(gamma {gamma})" if gamma else "")
            outs = ens.generate_many(
                prompt, n_completions, method=method, gamma=gamma, max_tokens=3, seed=1000 + k, ignore_eos=True, **sampling, **(generation or {})
            )
            seqs = [tuple(o.token_ids) for o in outs]
            assert all(len(s) == 3 for s in seqs)
            if method != "ensemble":
                proposed = sum(o.stats.proposed for o in outs)
                rejected = sum(o.stats.rejected for o in outs)
                assert proposed > 0 and rejected > 0.03 * proposed, "the test must exercise rejections"
            assert_matches(Counter(s[0] for s in seqs), exact(()), f"{what} token 1")
            for depth in depths:  # tokens 2 and 3, where bonus tokens and rejections land
                prefixes = [(p, c) for p, c in Counter(s[:depth] for s in seqs).most_common(2) if c >= MIN_CONDITIONAL]
                assert prefixes, f"{what}: no prefix of {depth} token(s) has the {MIN_CONDITIONAL} samples a check of token {depth + 1} needs"
                for prefix, _ in prefixes:
                    following = Counter(s[depth] for s in seqs if s[:depth] == prefix)
                    assert_matches(following, exact(prefix), f"{what} token {depth + 1} after {prefix}")
        return outs


# --- rollback ---------------------------------------------------------------------------------------


def test_rollback_restores_every_cache(models):
    """Force a rejection after every model has scored a 3-token draft; afterwards each model's
    logits for the next position equal a fresh model's on the committed sequence."""
    paths = [models["base"], models["sibling"], models["sibling2"]]
    with Ensemble.load(paths, WeightedEnsemble(), n_ctx=256) as ens:
        prompt = ens.tokenize(PROMPTS[0])
        sampler = Sampler(temperature=0)
        dec = Decoder(
            ens.models,
            ens.combiner,
            sampler,
            np.random.default_rng(0),
            prompt,
            [m.prefill(prompt) for m in ens.models],
            max_length=200,
            end_tokens=set(),
            text=TextAssembler(ens.models[0].piece),
        )
        n0 = len(prompt)
        best = int(np.argmax(dec.combined([n0])[0]))
        wrong_second = 100 if best != 100 else 101
        for token in (best, wrong_second, 102):
            dec.pending.append(Draft(token, 0, sampler.finalize(np.eye(ens.n_vocab)[token])))
        for i in range(3):
            run_step(dec.catch_up(i), ens.models)
        assert all(len(m.tokens) == n0 + 3 for m in ens.models)  # everyone holds the draft
        assert dec.verify_pending(3)  # rejected at the second draft token
        assert dec.committed[n0] == best and len(dec.committed) == n0 + 2
        assert all(len(m.tokens) == n0 + 1 for m in ens.models)
        assert_invariants(dec)
        for i, path in enumerate(paths):
            run_step(dec.catch_up(i), ens.models)
            expected = fresh_rows([path], dec.committed)[0][0]
            np.testing.assert_allclose(dec.rows[i][len(dec.committed)], expected, atol=5e-3)


# --- limits ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", SPECULATIVE)
def test_limits_eos_and_stop_strings_end_where_the_ensemble_ends(models, method):
    """Drafts never run past --max-tokens or the context, and an end token or a stop string
    inside a draft ends the completion exactly where the standard ensemble ends it."""
    with Ensemble.load([models["eos_heavy"], models["sibling"]], n_ctx=256) as ens:
        prompt = ens.tokenize(PROMPTS[0])
        finish = set()
        for text in PROMPTS:  # greedy: the prompt and the limit, not a seed, decide where it ends
            for limit in (3, 40):
                ref = ens.generate(text, method="ensemble", temperature=0, max_tokens=limit)
                out = checked(ens).generate(text, method=method, gamma=4, temperature=0, max_tokens=limit)
                assert (out.token_ids, out.text, out.finish_reason) == (ref.token_ids, ref.text, ref.finish_reason)
                finish.add(ref.finish_reason)
        assert finish == {"stop", "length"}, "the prompts must end both ways: by an end token and by the limit"
        ends = ens.generate(PROMPTS[0], method="ensemble", temperature=0, max_tokens=200)
        assert ends.finish_reason == "stop"  # greedy decoding reaches EOS here
        # a stop string in the middle of a draft
        stop = ends.text[len(ends.text) // 2 : len(ends.text) // 2 + 3]
        ref = ens.generate(PROMPTS[0], method="ensemble", temperature=0, max_tokens=200, stop=[stop])
        out = ens.generate(PROMPTS[0], method=method, gamma=4, temperature=0, max_tokens=200, stop=[stop])
        assert (out.text, out.finish_reason) == (ref.text, "stop")
        # max tokens: drafts stop at the limit (check_invariants asserts it every round)
        for max_tokens in (1, 2, 5):
            out = checked(ens).generate(PROMPTS[0], method=method, gamma=4, max_tokens=max_tokens, ignore_eos=True, seed=1)
            assert len(out.token_ids) == max_tokens and out.finish_reason == "length"
            full = prompt + out.token_ids
            assert all(len(prompt) <= len(m.tokens) and m.tokens == full[: len(m.tokens)] for m in ens.models)
    # context: the completion fills the context exactly, without an error
    with Ensemble.load([models["base"], models["sibling"]], n_ctx=40) as ens:
        out = checked(ens).generate(PROMPTS[0], method=method, gamma=4, max_tokens=500, ignore_eos=True, seed=2)
        assert out.finish_reason == "length" and len(ens.tokenize(PROMPTS[0])) + len(out.token_ids) == 40
