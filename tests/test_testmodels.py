"""The synthetic GGUF models behave like language models where collaborative decoding cares."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from conftest import BASE
from localcos.backend import Model
from localcos.core.sampling import softmax
from localcos.models import writer
from localcos.models.writer import ModelSpec, build_vocab, cached_model, write_model

TEXT = "The small model writes a draft and the large model checks it, one token at a time."


def next_token_distributions(path, n=48, seed=0):
    """Distributions along a sampled continuation of TEXT (the model's own text)."""
    m = Model(path, n_ctx=256)
    rng = np.random.default_rng(seed)
    logits = m.evaluate(m.tokenize(TEXT), 1)[0]
    out = []
    for _ in range(n):
        p = softmax(logits).astype(np.float64)
        out.append(p)
        token = int(rng.choice(len(p), p=p / p.sum()))
        logits = m.evaluate([token])[0]
    m.close()
    return np.array(out)


def entropy(p):
    return -(p * np.log(np.maximum(p, 1e-30))).sum(axis=-1)


def test_same_spec_same_bytes(tmp_path):
    a = write_model(BASE, tmp_path / "a.gguf")
    b = write_model(BASE, tmp_path / "b.gguf")
    assert a.read_bytes() == b.read_bytes()
    c = write_model(replace(BASE, seed=8), tmp_path / "c.gguf")
    assert c.read_bytes() != a.read_bytes()
    # a family's output head is kept from the last model written: a sibling written after its
    # family's base, after another family's, or first in a process, is the same file
    sibling = replace(BASE, noise=0.3)
    after_base = write_model(sibling, tmp_path / "s1.gguf").read_bytes()
    write_model(replace(BASE, seed=8), tmp_path / "other.gguf")
    after_other = write_model(sibling, tmp_path / "s2.gguf").read_bytes()
    writer._last_head.clear()
    first = write_model(sibling, tmp_path / "s3.gguf").read_bytes()
    assert after_base == after_other == first != a.read_bytes()


def test_peaked_distributions_like_a_language_model(models):
    for name in ("base", "sibling", "larger"):
        h = entropy(next_token_distributions(models[name]))
        assert 1.0 <= h.mean() <= 3.0, f"{name}: mean entropy {h.mean():.2f} nats"
        assert h.mean() < 0.5 * np.log(1024)  # far from uniform


def test_context_matters_not_only_the_last_token(models):
    m = Model(models["base"], n_ctx=128)
    a = m.evaluate(m.tokenize("The river runs past the mill"), 1)[0]
    m.reset()
    b = m.evaluate(m.tokenize("Three times four is twelve, the mill"), 1)[0]
    m.close()
    tv = 0.5 * np.abs(softmax(a) - softmax(b)).sum()
    assert tv > 0.05  # same last token, different contexts, different predictions


def test_family_members_agree_to_the_chosen_degree(model_dir):
    """A sibling with less noise agrees more with the base (smaller total variation)."""
    base = next_token_distributions(cached_model(BASE, model_dir), seed=1)
    tvs = []
    for noise in (0.1, 0.3, 0.8):
        path = cached_model(replace(BASE, noise=noise, name=f"t-noise{noise}"), model_dir)
        # score the base's own continuation with the sibling: same contexts for both
        m = Model(path, n_ctx=256)
        ref = Model(cached_model(BASE, model_dir), n_ctx=256)
        rng = np.random.default_rng(1)
        tokens = ref.tokenize(TEXT)
        la, lb = ref.evaluate(tokens, 1)[0], m.evaluate(tokens, 1)[0]
        total = []
        for _ in range(32):
            pa, pb = softmax(la).astype(np.float64), softmax(lb).astype(np.float64)
            total.append(0.5 * np.abs(pa - pb).sum())
            t = int(rng.choice(len(pa), p=pa / pa.sum()))
            la, lb = ref.evaluate([t])[0], m.evaluate([t])[0]
        m.close()
        ref.close()
        tvs.append(float(np.mean(total)))
    assert base.shape[0] == 48
    assert tvs[0] < tvs[1] < tvs[2], tvs
    assert tvs[0] < 0.2 and tvs[2] > 0.3


def test_larger_member_costs_several_times_more_and_stays_close(model_dir):
    small = cached_model(BASE, model_dir)
    large = cached_model(replace(BASE, widen=4, extra_layers=2, name="t-wide"), model_dir)
    a, b = Model(small, n_ctx=128), Model(large, n_ctx=128)
    assert b.n_params > 5 * a.n_params
    assert b.n_embd == 4 * a.n_embd and b.n_layer == a.n_layer + 2
    tokens = a.tokenize(TEXT)
    pa, pb = softmax(a.evaluate(tokens)), softmax(b.evaluate(tokens))
    tv = 0.5 * np.abs(pa - pb).sum(axis=-1).mean()
    assert tv < 0.3, f"the wide model should predict nearly what its base predicts (TV {tv:.2f})"
    a.close()
    b.close()


def test_vocabulary_sizes_and_padding():
    v = build_vocab(4096)
    assert v.size == v.n_real == 4096 and len(set(v.tokens)) == 4096
    assert v.tokens[:3] == ["<unk>", "<s>", "</s>"] and v.tokens[3] == "<0x00>"
    padded = build_vocab(1024, pad_to=1100)
    assert padded.size == 1100 and padded.n_real == 1024 and padded.tokens[-1] == "[PAD1099]"
    other = build_vocab(1024, variant=1)
    assert sorted(other.tokens) == sorted(build_vocab(1024).tokens) and other.tokens != build_vocab(1024).tokens


def test_quantised_files_are_smaller(tmp_path):
    spec = ModelSpec(vocab_size=512, n_embd=64, n_layer=1, n_head=2, n_ff=128)
    sizes = {d: write_model(replace(spec, dtype=d), tmp_path / f"{d}.gguf").stat().st_size for d in ("f32", "f16", "bf16", "q8_0", "q4_0")}
    assert sizes["f32"] > sizes["f16"] == sizes["bf16"] > sizes["q8_0"] > sizes["q4_0"]


def test_the_settings_offer_exactly_the_writers_weight_types():
    from localcos.config import OPTIONS
    from localcos.models.weights import WEIGHT_TYPES
    from localcos.models.writer import WEIGHT_TYPES as DTYPES

    assert WEIGHT_TYPES == DTYPES == OPTIONS["synthetic_dtype"].choices
