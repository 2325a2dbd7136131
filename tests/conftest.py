"""Shared fixtures: synthetic GGUF models written once per test session by localcos.models.writer.

Set LOCALCOS_TEST_CACHE=DIR to keep the models between sessions (they are keyed by their spec).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from localcos.backend import Model
from localcos.testing import llamacpp_sdist
from localcos.testing.loopback import RpcServerProcess, free_port  # noqa: F401  (free_port: for the tests)
from localcos.models.writer import CHAT_TEMPLATE, ModelSpec, cached_model

# Small and fast: a 1024-token vocabulary, 2 layers of width 64. Peaked distributions with a
# mean entropy of about 2-3 nats, like a language model.
BASE = ModelSpec(vocab_size=1024, n_embd=64, n_layer=2, n_head=4, n_ff=128, dtype="f32", seed=7, name="t-base")
SPECS: dict[str, ModelSpec] = {
    "base": BASE,
    "sibling": replace(BASE, noise=0.3, name="t-sibling"),
    "sibling2": replace(BASE, noise=0.3, noise_seed=2, name="t-sibling2"),
    "sibling3": replace(BASE, noise=0.3, noise_seed=3, name="t-sibling3"),
    "larger": replace(BASE, extra_layers=6, name="t-larger"),
    "other_tokenizer": replace(BASE, tokenizer_variant=1, name="t-other-tok"),
    "padded": replace(BASE, pad_vocab_to=1024 + 64, name="t-padded"),
    "eos_heavy": replace(BASE, eos_rate=0.5, name="t-eos"),
    "q8": replace(BASE, dtype="q8_0", name="t-q8"),
    "chat": replace(BASE, chat_template=CHAT_TEMPLATE, name="t-chat"),
    "chat_sibling": replace(BASE, noise=0.3, chat_template=CHAT_TEMPLATE.replace("<|", "[").replace("|>", "]"), name="t-chat2"),
    "f16": replace(BASE, dtype="f16", name="t-f16"),
    "bf16": replace(BASE, dtype="bf16", name="t-bf16"),
    "q4": replace(BASE, dtype="q4_0", name="t-q4"),
    # a real-size vocabulary (Qwen2.5's padded size), narrow so it stays small
    "vocab152k": ModelSpec(vocab_size=151936, n_embd=32, n_layer=1, n_head=2, n_ff=64, dtype="f16", seed=9, name="t-152k"),
    "vocab152k_padded": ModelSpec(
        vocab_size=151936, pad_vocab_to=152064, n_embd=32, n_layer=1, n_head=2, n_ff=64, dtype="f16", seed=9, name="t-152k-pad"
    ),
}


# Batched and one-token evaluation, or other thread counts, round differently in llama.cpp
# (~1e-3 on logits). Greedy outputs computed two ways may differ only where the top two scores
# (logits, or log-probabilities of r) are closer than this.
NEAR_TIE = 0.02


def fresh_scores(paths, combiner, tokens):
    """log r after `tokens`, from fresh contexts (to judge a divergence); `combiner` bound."""
    rows = []
    for p in paths:
        m = Model(p, n_ctx=max(128, len(tokens) + 1))
        rows.append(m.evaluate(tokens, 1))
        m.close()
    with np.errstate(divide="ignore"):
        return np.log(combiner.combine(rows, 1.0)[0])


def assert_same_or_near_tie(got, want, paths, combiner, prompt, what):
    """Two greedy token sequences are equal, or first differ where r's top two are a near-tie
    (different batchings round differently); returns where they part (the near-tie's position in
    `prompt + want`), or None when they are equal. Methods that part at one close call part at
    the same position: count distinct positions, not methods."""
    if got == want:
        return None
    i = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    scores = fresh_scores(paths, combiner, prompt + want[:i])
    top2 = np.sort(scores)[-2:]
    assert top2[1] - top2[0] < NEAR_TIE, f"{what} diverged at token {i} where the top two scores differ by {top2[1] - top2[0]:.4f}"
    return (tuple(prompt), i)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    env = os.environ.get("LOCALCOS_TEST_CACHE")
    if env:
        path = Path(env)
        path.mkdir(parents=True, exist_ok=True)
        return path
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def models(model_dir: Path):
    """name -> path of a test model, written on first use."""

    class _Models:
        def __getitem__(self, name: str) -> Path:
            return cached_model(SPECS[name], model_dir)

    return _Models()


# --- real tokenizers: llama.cpp's vocabulary test files, with the project's weights around them ---

# (vocabulary, spec): Qwen2's 151,936-token byte-level BPE with its ChatML template, in F16 and in
# llama.cpp's Q4_K_M (K-quants need widths that are multiples of 256); Llama 3's for the mismatch.
_QWEN2 = ModelSpec(arch="qwen2", n_embd=64, n_layer=2, n_head=4, n_ff=128, dtype="f16", seed=51, name="r-qwen2")
_QWEN2_Q4KM = ModelSpec(arch="qwen2", n_embd=256, n_layer=1, n_head=4, n_ff=512, dtype="q4_k_m", seed=52, name="r-qwen2-q4km")
REAL_SPECS: dict[str, tuple[str, ModelSpec]] = {
    "qwen2": ("qwen2", _QWEN2),
    "qwen2_sibling": ("qwen2", replace(_QWEN2, noise=0.3, name="r-qwen2-sibling")),
    "qwen2_q4km": ("qwen2", _QWEN2_Q4KM),
    "qwen2_q4km_sibling": ("qwen2", replace(_QWEN2_Q4KM, noise=0.3, name="r-qwen2-q4km-sibling")),
    "llama3": ("llama-bpe", ModelSpec(n_embd=32, n_layer=1, n_head=2, n_ff=64, dtype="f16", seed=53, name="r-llama3")),
}


@pytest.fixture(scope="session")
def llama_vocab():
    """name -> llama.cpp's ggml-vocab-NAME.gguf from the pinned llama-cpp-python sdist (fetched
    once into the cache). Without the package index: a failure in CI, a skip elsewhere."""

    def get(name: str) -> Path:
        try:
            return llamacpp_sdist.vocab_file(name)
        except llamacpp_sdist.SdistUnavailable as e:
            if os.environ.get("CI"):
                pytest.fail(str(e))
            pytest.skip(str(e))

    return get


@pytest.fixture(scope="session")
def real_models(model_dir: Path, llama_vocab):
    """name -> path of a model with a real tokenizer (REAL_SPECS), written on first use."""

    class _Models:
        def __getitem__(self, name: str) -> Path:
            vocab, spec = REAL_SPECS[name]
            return cached_model(replace(spec, tokenizer=str(llama_vocab(vocab))), model_dir)

    return _Models()


# --- trained models: GGUF files shipped in packages on the package index (models.toml) --------------


@pytest.fixture(scope="session")
def trained():
    """name -> path of a trained model of models.toml (`coder-0.5b`, `coder-1.5b`, ...), fetched
    once from the package index into the cache and checked by sha256. Without the index: a
    failure in CI, a skip elsewhere."""
    from localcos.errors import ModelNotAvailableError
    from localcos.models.registry import Registry

    registry = Registry.load(user=False)

    def get(name: str) -> Path:
        try:
            return registry.pull(name, progress=print)
        except ModelNotAvailableError as e:
            if os.environ.get("CI"):
                pytest.fail(str(e))
            pytest.skip(str(e))

    return get


# --- servers on 127.0.0.1 -------------------------------------------------------------------------


def require_rpc_build() -> None:
    """Models on RPC servers need llama.cpp's RPC backend, which `pip install` compiles only with
    CMAKE_ARGS="-DGGML_RPC=ON" (and a cached wheel may lack): without it, a failure in CI (.ci/run
    builds it), a skip elsewhere that gives the rebuild command."""
    from localcos.backend.rpc import REBUILD, rpc_available

    if not rpc_available():
        message = f"this llama.cpp build has no RPC backend; rebuild it with: {REBUILD}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture
def rpc_build() -> None:
    require_rpc_build()


class RpcServer(RpcServerProcess):
    """A `localcos rpc-server` for a test: one thread (the tests share 2 cores with it)."""

    def __init__(self, port: int | None = None) -> None:
        require_rpc_build()
        super().__init__(port, threads=1)
