"""Standard collaborative decoding through the Python API."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import NEAR_TIE
from localcos import Ensemble, WeightedEnsemble
from localcos.backend import Model
from localcos.errors import ConfigError, PromptTooLongError, TokenizerMismatchError
from localcos.core.sampling import softmax
from localcos.testing import reference
from localcos.testing.reference import in_child
from localcos.stats import ESTIMATE_HOST_SHARE
from statcheck import assert_matches

PROMPTS = ["The river runs past the old mill", "def main():", "Question: what is the capital of France?"]


@pytest.fixture(scope="module")
def single(models):
    with Ensemble.load([models["base"]], n_ctx=512) as ens:
        yield ens


@pytest.fixture(scope="module")
def pair(models):
    with Ensemble.load([models["base"], models["sibling"]], n_ctx=512) as ens:
        yield ens


def fresh_logits(path, tokens):
    m = Model(path, n_ctx=512)
    out = m.evaluate(tokens, 1)[0]
    m.close()
    return out


def llama_greedy(path, prompt, n):
    return in_child(reference.greedy, str(path), prompt, n)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_one_model_greedy_equals_llama_cpp_python(single, models, prompt):
    ours = single.generate(prompt, method="ensemble", temperature=0, max_tokens=48)
    theirs = llama_greedy(models["base"], prompt, 48)[: len(ours.token_ids)]
    assert len(ours.token_ids) > 10
    if ours.token_ids != theirs:
        # llama-cpp-python runs llama.cpp with other thread and batch settings, which round
        # differently (~1e-3 on logits): a divergence must be a near-tie of the top two logits
        i = next(j for j, (a, b) in enumerate(zip(ours.token_ids, theirs)) if a != b)
        logits = fresh_logits(models["base"], single.tokenize(prompt) + ours.token_ids[:i])
        top = np.argsort(logits)[::-1][:2]
        assert set(top.tolist()) == {ours.token_ids[i], theirs[i]}
        assert logits[top[0]] - logits[top[1]] < NEAR_TIE, f"diverged at token {i} without a near-tie"


def test_completion_fields_and_stats(pair):
    out = pair.generate(PROMPTS[0], method="ensemble", max_tokens=20, seed=3, ignore_eos=True)
    assert len(out.token_ids) == 20 and out.finish_reason == "length"
    assert out.text == pair.detokenize(out.token_ids)
    s = out.stats
    assert s.method == "ensemble" and s.tokens == 20
    # every model evaluates every token: 20 tokens need 19 single-token calls after the prompt
    assert [m.calls for m in s.models] == [19, 19]
    assert s.llama_seconds == sum(m.seconds for m in s.models) > 0
    assert 0 < s.host_seconds == pytest.approx(s.seconds - s.llama_seconds)
    assert all(o.kind == "sample" for o in out.origins)


def test_speedup_estimate_prices_tokens_at_single_token_calls(pair):
    """The estimate compares a run's llama.cpp time with what the standard ensemble would need:
    one single-token call per model per token, at the single-row call times the models' calls
    measured (not the profiles': a profile measured with another job running would price them
    wrong); before a model made one, there is no estimate."""
    for model in pair.loaded:
        model.call_times.reset()
    assert pair.costs.ensemble_seconds(40) is None
    base = pair.generate(PROMPTS[0], method="ensemble", max_tokens=40, seed=3, ignore_eos=True)
    # its own 39 single-token calls per model. Not a bound on the ratio itself: one slow call on
    # a busy CI machine moves the run's time far from the calls' mean.
    singles = sum(model.call_times.mean(1) for model in pair.loaded)
    assert [m.calls for m in base.stats.models] == [39, 39]
    assert base.stats.ensemble_llama_seconds == pytest.approx(39 * singles)
    assert base.stats.speedup_estimate == pytest.approx(39 * singles / base.stats.llama_seconds)
    cos = pair.generate(PROMPTS[0], method="cos", gamma=3, max_tokens=40, seed=3, ignore_eos=True)
    singles = sum(model.call_times.mean(1) for model in pair.loaded)
    assert cos.stats.ensemble_llama_seconds == pytest.approx(39 * singles)
    assert cos.stats.speedup_estimate == pytest.approx(39 * singles / cos.stats.llama_seconds)
    assert cos.stats.to_dict()["speedup_estimate"] == cos.stats.speedup_estimate
    # shown where the calls are most of the run (tiny models' runs are mostly the host's)
    assert ("the ensemble (est.)" in cos.stats.summary()) == (cos.stats.host_fraction <= ESTIMATE_HOST_SHARE)


def test_same_seed_same_output_and_different_seeds_differ(pair):
    a = pair.generate(PROMPTS[1], max_tokens=30, seed=11, method="ensemble")
    b = pair.generate(PROMPTS[1], max_tokens=30, seed=11, method="ensemble")
    c = pair.generate(PROMPTS[1], max_tokens=30, seed=12, method="ensemble")
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_generate_many_is_reproducible_and_independent(pair):
    a = pair.generate_many(PROMPTS[0], 5, max_tokens=8, seed=1, method="ensemble")
    b = pair.generate_many(PROMPTS[0], 5, max_tokens=8, seed=1, method="ensemble")
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert len({tuple(c.token_ids) for c in a}) > 1


def test_first_token_follows_the_combined_distribution(pair):
    """3000 one-token completions: their distribution is r = 0.5 p_base + 0.5 p_sibling."""
    prompt = PROMPTS[0]
    tokens = pair.tokenize(prompt)
    for m in pair.models:
        m.reset()
    logits = [m.evaluate(tokens, 1) for m in pair.models]
    r = 0.5 * softmax(logits[0][0]) + 0.5 * softmax(logits[1][0])
    outs = pair.generate_many(prompt, 3000, max_tokens=1, seed=5, method="ensemble")
    assert_matches([c.token_ids[0] for c in outs if c.token_ids], r, "first tokens")


def test_stop_string_ends_the_text_before_it(pair):
    full = pair.generate(PROMPTS[0], temperature=0, max_tokens=40, ignore_eos=True)
    stop = full.text[10:14]
    assert stop.strip()
    out = pair.generate(PROMPTS[0], temperature=0, max_tokens=40, stop=[stop], ignore_eos=True)
    assert out.finish_reason == "stop"
    assert out.text == full.text[: full.text.index(stop)]
    assert stop not in out.text


@pytest.mark.parametrize(("method", "least"), [("ensemble", 6), ("cos", 3)])
def test_streaming_yields_the_final_text_in_pieces(pair, method, least):
    """A piece a token (ensemble) or a cycle (cos, at a fixed gamma: auto's lengths follow the
    machine's call costs, and the count of pieces with them)."""
    settings = {"method": method, "temperature": 0, "max_tokens": 30, "ignore_eos": True}
    if method == "cos":
        settings["gamma"] = 2
    full = pair.generate(PROMPTS[2], **settings)
    stop = full.text[40:44]
    stream = pair.stream(PROMPTS[2], stop=[stop], **settings)
    pieces = list(stream)
    assert len(pieces) >= least
    assert "".join(pieces) == stream.completion.text == full.text[: full.text.index(stop)]


def test_end_of_sequence_stops_unless_ignored(models):
    with Ensemble.load([models["eos_heavy"]], n_ctx=512) as ens:
        stops = [ens.generate("The river", max_tokens=200, seed=s, method="ensemble") for s in range(5)]
        assert any(c.finish_reason == "stop" for c in stops)
        for c in stops:
            assert 2 not in c.token_ids  # EOS ends a completion, it is not part of it
        ignored = ens.generate("The river", max_tokens=200, seed=0, ignore_eos=True, method="ensemble")
        assert ignored.finish_reason == "length" and len(ignored.token_ids) == 200
        assert 2 not in ignored.token_ids


def test_context_full_ends_with_length(models):
    with Ensemble.load([models["base"], models["sibling"]], n_ctx=32) as ens:
        prompt = ens.tokenize(PROMPTS[0])
        out = ens.generate(PROMPTS[0], max_tokens=1000, ignore_eos=True, method="ensemble")
        assert out.finish_reason == "length"
        assert len(prompt) + len(out.token_ids) == 32


def test_prompt_longer_than_the_context(models):
    with Ensemble.load([models["base"]], n_ctx=16) as ens, pytest.raises(PromptTooLongError, match="context holds 16"):
        ens.generate("word " * 40)


def test_prompt_cache_is_reused_and_correct(pair):
    pair.generate(PROMPTS[0], max_tokens=5, method="ensemble", seed=0)
    calls = [m.stats.calls for m in pair.models]
    again = pair.generate(PROMPTS[0], max_tokens=1, method="ensemble", temperature=0)
    assert [m.stats.calls for m in pair.models] == calls  # nothing evaluated for a cached prompt
    for m in pair.models:
        m.reset()
    fresh = pair.generate(PROMPTS[0], max_tokens=1, method="ensemble", temperature=0)
    assert again.token_ids == fresh.token_ids


def test_speculative_methods_need_two_models(single):
    with pytest.raises(ConfigError, match="at least 2 models"):
        single.generate("hi", method="cos")


def test_a_byte_level_setting_is_refused_at_the_token_level(pair):
    """byte_gamma means nothing to models that share a tokenizer: refused, not ignored."""
    for run in (pair.generate, pair.stream):
        with pytest.raises(ConfigError, match="byte_gamma: these models share a tokenizer.*ByteEnsemble") as e:
            run("hi", method="cos", byte_gamma=8)
        assert e.value.param == "byte_gamma"


def test_mismatched_tokenizers_are_refused(models):
    with pytest.raises(TokenizerMismatchError):
        Ensemble.load([models["base"], models["other_tokenizer"]])


def test_padded_vocabulary_drops_the_padding_logits(models):
    with Ensemble.load([models["padded"], models["base"]], n_ctx=128) as ens:
        assert ens.n_vocab == 1024
        out = ens.generate(PROMPTS[0], max_tokens=30, seed=2, ignore_eos=True, method="ensemble")
        assert max(out.token_ids) < 1024
        assert all(m.logits_vocab == 1024 for m in ens.models)


def test_real_size_vocabulary(models):
    """Qwen2.5's sizes: 151936 and 152064 (padded) entries."""
    with Ensemble.load([models["vocab152k"], models["vocab152k_padded"]], n_ctx=256) as ens:
        assert ens.n_vocab == 151936
        out = ens.generate(PROMPTS[0], max_tokens=16, seed=0, ignore_eos=True, method="ensemble")
        assert len(out.token_ids) == 16 and max(out.token_ids) < 151936


def test_weights_are_validated_at_load(models):
    with pytest.raises(ConfigError, match="got 3 weights for 2 models"):
        Ensemble.load([models["base"], models["sibling"]], WeightedEnsemble([1, 1, 1]))
