"""Shared fixtures: synthetic GGUF models written once per test session by localcos.models.writer.

Set LOCALCOS_TEST_CACHE=DIR to keep the models between sessions (they are keyed by their spec).

The suite runs in worker processes (pytest-xdist, `-n auto` in pyproject.toml): each worker gets
its own share of the CPUs (llama.cpp's threads then follow it), the workers share one folder of
test models, and what is fetched or written once (a model, the llama.cpp sdist, a trained model)
is done under a lock by the first worker that needs it. A fault that kills a worker fails the
test it ran, names it, and the rest of the suite goes on in a new worker. `-m "not slow"` is the
quick inner loop: fakes and synthetic models, no real tokenizer, no trained model.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from collections.abc import Iterator

import numpy as np
import pytest
from filelock import FileLock
from threadpoolctl import threadpool_limits

from localcos.backend import Model
from localcos.testing import llamacpp_sdist
from localcos.testing.loopback import RpcServerProcess, free_port  # noqa: F401  (free_port: for the tests)
from localcos.models.writer import CHAT_TEMPLATE, ModelSpec, cached_model

# the chat's kept conversations and remembered settings go to a folder of the test run's own, never
# the user's (a test that checks them gives its own)
os.environ.setdefault("LOCALCOS_DATA", tempfile.mkdtemp(prefix="localcos-test-data-"))

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
    # fill-in-the-middle tokens in the vocabulary (found by their text), a sibling sharing them, and
    # FIM tokens of other names that the header names
    "fim": replace(BASE, fim="text", name="t-fim"),
    "fim_sibling": replace(BASE, fim="text", noise=0.3, name="t-fim-sibling"),
    "fim_header": replace(BASE, fim="header", name="t-fim-header"),
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


def within_budget(tokens: int, max_tokens: int) -> bool:
    """A byte-level text cut by --max-tokens: the lead's tokens, counted at a character's end (a
    character of up to four bytes may carry the count past the budget by its bytes but one)."""
    return max_tokens <= tokens <= max_tokens + 3


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


# --- workers: a share of the CPUs each, one folder of models, things done once under a lock --------


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: a worker per core, at most 4 (each may hold trained models in memory)."""
    return max(1, min(4, len(_cpus())))


def _cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def pytest_configure(config: pytest.Config) -> None:
    # a worker's share of the cores: llama.cpp's default threads (and the processes a test
    # starts) follow it, so workers never contend for a core, whose spinning threads would stall
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if worker and count and hasattr(os, "sched_setaffinity"):
        cpus, n, i = _cpus(), int(count), int(worker.removeprefix("gw"))
        share = cpus[i * len(cpus) // n : (i + 1) * len(cpus) // n] or [cpus[i % len(cpus)]]
        # every thread, not only this one: NumPy's BLAS started its threads when it was imported,
        # one per core; left there, a worker's matrix products ran half on the other worker's
        # core, and as many BLAS threads as cores spinning on one core stall each product
        for thread in os.listdir("/proc/self/task"):
            os.sched_setaffinity(int(thread), share)
        threadpool_limits(limits=len(share))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`slow`: what needs a real tokenizer or a trained model, besides the tests marked slow
    (`-m "not slow"` leaves them out)."""
    for item in items:
        if {"real_models", "llama_vocab", "trained"} & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("real"):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every worker of this run shares (for its locks and its test models)."""
    root = tmp_path_factory.getbasetemp()
    return root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root


@pytest.fixture(scope="session")
def once(shared_dir: Path):
    """`with once(name):` the block runs while no other worker of this run holds `name`: what
    the first worker fetches or writes, the others then find done."""

    @contextmanager
    def hold(name: str) -> Iterator[None]:
        with FileLock(str(shared_dir / f".{name}.lock")):
            yield

    return hold


@pytest.fixture(scope="session")
def model_dir(shared_dir: Path) -> Path:
    env = os.environ.get("LOCALCOS_TEST_CACHE")
    path = Path(env) if env else shared_dir / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def cached(spec: ModelSpec, model_dir: Path, once) -> Path:  # type: ignore[no-untyped-def]
    """The model for `spec`, written by the first worker that needs it."""
    with once(f"model-{spec.name}-{spec.key()}"):
        return cached_model(spec, model_dir)


@pytest.fixture(scope="session")
def models(model_dir: Path, once):
    """name -> path of a test model, written on first use."""

    class _Models:
        def __getitem__(self, name: str) -> Path:
            return cached(SPECS[name], model_dir, once)

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
def llama_vocab(once):
    """name -> llama.cpp's ggml-vocab-NAME.gguf from the pinned llama-cpp-python sdist (fetched
    once into the cache). Without the package index: a failure in CI, a skip elsewhere."""

    def get(name: str) -> Path:
        try:
            with once("llama-sdist"):
                return llamacpp_sdist.vocab_file(name)
        except llamacpp_sdist.SdistUnavailable as e:
            if os.environ.get("CI"):
                pytest.fail(str(e))
            pytest.skip(str(e))

    return get


@pytest.fixture(scope="session")
def real_models(model_dir: Path, llama_vocab, once):
    """name -> path of a model with a real tokenizer (REAL_SPECS), written on first use."""

    class _Models:
        def __getitem__(self, name: str) -> Path:
            vocab, spec = REAL_SPECS[name]
            return cached(replace(spec, tokenizer=str(llama_vocab(vocab))), model_dir, once)

    return _Models()


# --- trained models: GGUF files shipped in packages on the package index (models.toml) --------------


@pytest.fixture(scope="session")
def trained(once):
    """name -> path of a trained model of models.toml (`coder-0.5b`, `coder-1.5b`, ...), fetched
    once from the package index into the cache and checked by sha256. Without the index: a
    failure in CI, a skip elsewhere."""
    from localcos.errors import ModelNotAvailableError
    from localcos.models.registry import Registry

    registry = Registry.load(user=False)

    def get(name: str) -> Path:
        try:
            with once(f"trained-{name}"):
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
