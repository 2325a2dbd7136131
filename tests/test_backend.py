"""The llama.cpp backend: logits of exactly the positions asked for, exact KV-cache bookkeeping."""

from __future__ import annotations

import numpy as np
import pytest

from localcos.backend import Model, check_gguf_file, shared_vocab_size
from localcos.errors import ModelFileError, TokenizerMismatchError
from localcos.testing import reference
from localcos.testing.reference import in_child

# Batched and one-token-at-a-time evaluation round differently in llama.cpp: measured here, the
# logits differ by up to ~1e-3 (on logits of magnitude ~10). Comparisons across batch shapes use
# this tolerance; identical batch shapes must agree exactly.
BATCH_TOL = 5e-3

TEXT = "The small model writes a draft and the large model checks it, token by token."


@pytest.fixture(scope="module")
def base(models):
    m = Model(models["base"], n_ctx=256)
    yield m
    m.close()


def reference_logits(path, tokens):
    """All-position logits from llama-cpp-python's high-level API (independent code path)."""
    return in_child(reference.all_logits, str(path), tokens)


def test_evaluate_returns_the_positions_asked_for(base, models):
    base.reset()
    tokens = base.tokenize(TEXT)
    full = base.evaluate(tokens)
    assert full.shape == (len(tokens), base.n_vocab)
    assert full.dtype == np.float32
    assert base.tokens == tokens
    ref = reference_logits(models["base"], tokens)
    np.testing.assert_allclose(full, ref, atol=BATCH_TOL)
    # only the last 3 rows: the same numbers as the tail of the full evaluation
    base.reset()
    tail = base.evaluate(tokens, 3)
    assert tail.shape == (3, base.n_vocab)
    np.testing.assert_array_equal(tail, full[-3:])
    base.reset()
    assert base.evaluate(tokens, 0).shape == (0, base.n_vocab)
    assert base.tokens == tokens


def test_one_at_a_time_matches_batched_within_rounding(base):
    base.reset()
    tokens = base.tokenize(TEXT)
    batched = base.evaluate(tokens)
    base.reset()
    single = np.concatenate([base.evaluate([t]) for t in tokens])
    np.testing.assert_allclose(single, batched, atol=BATCH_TOL)
    assert np.abs(single).max() > 1.0  # the comparison is not vacuous


def test_truncate_then_reevaluate_equals_fresh_evaluation(base):
    base.reset()
    tokens = base.tokenize(TEXT)
    fresh = base.evaluate(tokens)
    for keep in (1, 5, len(tokens) - 1):
        base.truncate(len(tokens))  # no-op
        base.evaluate([42, 43, 44])  # something to throw away
        base.truncate(keep)
        assert base.tokens == tokens[:keep]
        again = base.evaluate(tokens[keep:])
        np.testing.assert_allclose(again, fresh[keep:], atol=BATCH_TOL)
        base.truncate(len(tokens))


def test_long_input_is_split_into_batches(models):
    m = Model(models["base"], n_ctx=256, n_batch=16)
    tokens = m.tokenize(TEXT * 3)
    assert len(tokens) > 40
    out = m.evaluate(tokens, 20)  # the logits span two batches
    assert out.shape == (20, m.n_vocab)
    assert m.stats.calls == -(-len(tokens) // 16)
    ref = reference_logits(models["base"], tokens)
    np.testing.assert_allclose(out, ref[-20:], atol=BATCH_TOL)
    m.close()


def test_counters(base):
    base.reset()
    base.stats.reset()
    base.evaluate([5, 6, 7], 1)
    base.evaluate([8])
    assert (base.stats.calls, base.stats.tokens) == (2, 4)
    assert base.stats.seconds > 0


def test_warm_up_times_single_calls_and_leaves_nothing_behind(models):
    m = Model(models["base"], n_ctx=64)
    seconds = m.warm_up()
    assert len(seconds) == 3 and all(t > 0 for t in seconds)
    assert m.tokens == [] and (m.stats.calls, m.stats.tokens) == (0, 0)
    # the cache is really empty: the first evaluation equals a fresh model's
    fresh = Model(models["base"], n_ctx=64)
    tokens = m.tokenize(TEXT)
    np.testing.assert_array_equal(m.evaluate(tokens), fresh.evaluate(tokens))
    with pytest.raises(RuntimeError):
        m.warm_up()
    m.close()
    fresh.close()


def test_context_overflow_is_refused(models):
    m = Model(models["base"], n_ctx=16)
    m.evaluate(list(range(10, 26)), 1)
    with pytest.raises(ValueError, match="exceeds the context"):
        m.evaluate([30])
    assert len(m.tokens) == 16
    m.close()


def test_quantised_models_load_and_run(models, base):
    """Every weight type the writer offers loads and computes the F32 model's function, to the
    type's precision."""
    base.reset()
    tokens = base.tokenize(TEXT)
    reference = base.evaluate(tokens)
    base.reset()
    # (type, mean relative logit error, share of positions with the same argmax); measured here:
    # f16 0.0005, bf16 0.003, q8_0 0.01, q4_0 0.13 error; 100% argmax agreement but 83% for q4_0
    for name, tolerance, agreement in (("f16", 0.01, 0.9), ("bf16", 0.05, 0.9), ("q8", 0.05, 0.9), ("q4", 0.3, 0.6)):
        m = Model(models[name], n_ctx=64)
        logits = m.evaluate(tokens)
        assert np.isfinite(logits).all()
        error = np.abs(logits - reference).mean() / np.abs(reference).mean()
        assert error < tolerance, (name, error)
        assert (logits.argmax(axis=1) == reference.argmax(axis=1)).mean() >= agreement, name
        m.close()


def test_bad_files(tmp_path, models):
    with pytest.raises(ModelFileError, match="not found"):
        check_gguf_file(tmp_path / "missing.gguf")
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        Model(text)
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(models["base"].read_bytes()[:200_000])
    # caught by localcos's header reader before llama.cpp opens it, both sizes said
    with pytest.raises(ModelFileError, match=r"incomplete: tensor data ends at [0-9.]+ MB, the file has 0.2 MB"):
        Model(truncated)


def test_tokenizer_mismatch_names_both_files_and_the_first_differing_id(models):
    a = Model(models["base"], n_ctx=32)
    b = Model(models["other_tokenizer"], n_ctx=32)
    with pytest.raises(TokenizerMismatchError) as err:
        shared_vocab_size([a, b])
    message = str(err.value)
    assert str(models["base"]) in message and str(models["other_tokenizer"]) in message
    first = next(t for t in range(a.n_vocab) if a.token_text(t) != b.token_text(t))
    assert f"token id {first}" in message
    a.close()
    b.close()


def test_padded_vocabulary_shares_the_smaller_one(models):
    a = Model(models["base"], n_ctx=32)
    b = Model(models["padded"], n_ctx=32)
    assert b.n_vocab == a.n_vocab + 64
    assert shared_vocab_size([a, b]) == shared_vocab_size([b, a]) == a.n_vocab
    a.close()
    b.close()


def test_models_list_groups_models_by_the_rule_loading_applies(models):
    """One definition of "these models share a tokenizer": `localcos models list` groups the
    headers by it, loading accepts a pair by it; a padded vocabulary shares the smaller one's
    tokenizer (listed apart by a fingerprint of every token before), another tokenizer does not."""
    from localcos.backend import read_info
    from localcos.backend.tokenizers import tokenizer_groups

    names = ["base", "padded", "sibling", "other_tokenizer"]
    groups = tokenizer_groups([read_info(models[n]).token_table() for n in names])
    assert groups == [0, 0, 0, 1]
    for i, a in enumerate(names):
        for j, b in enumerate(names[i + 1 :], start=i + 1):
            pair = [Model(models[a], vocab_only=True), Model(models[b], vocab_only=True)]
            try:
                shared_vocab_size(pair)
                accepted = True
            except TokenizerMismatchError:
                accepted = False
            finally:
                for m in pair:
                    m.close()
            assert accepted == (groups[i] == groups[j]), (a, b)
