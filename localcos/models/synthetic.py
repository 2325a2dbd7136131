"""Named sets of synthetic models (built by `testmodels`, cached in the user cache directory).

* ``demo``: a small weighted-ensemble pair that builds in seconds (``localcos demo``, ``chat --demo``).
* ``we-pair``: two same-size siblings that agree about as much as an instruct model and its code
  variant (weighted ensemble).
* ``cd-pair``: an amateur and an expert of one family, the expert about 10x costlier per token
  (contrastive decoding).
* ``we-triple``: three same-size siblings (three-model weighted ensemble).
* ``we-unrelated``: two same-size models with unrelated weights: they rarely agree, the case
  where speculation does not pay and ``--gamma auto`` must not be slower than the ensemble.
* ``we-pair-152k``: a we-pair with Qwen2.5's 151936-token vocabulary (host overhead at 152k).

The weights are BF16 by default: on CPUs with native BF16 dot products (AVX512_BF16, Arm BF16)
llama.cpp's batched BF16 kernels make a short verification pass cost little more than a
single-token call (measured on a 2-core EPYC by benchmarks/batch_cost.py: 2 tokens cost 1.28x
one token in BF16, 1.68x in F16, 2.34x in Q8_0), the regime of the GPUs the CoS paper measured
on. Any other weight type can be asked for (`ensure_set(..., dtype=)`, `localcos bench
--synthetic-dtype`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from collections.abc import Callable

from ..paths import cache_dir
from .writer import CHAT_TEMPLATE, ModelSpec, cached_model, cached_path


@dataclass(frozen=True)
class SyntheticSet:
    name: str
    description: str
    specs: tuple[ModelSpec, ...]
    combine: str  # the combiner the set is made for
    labels: tuple[str, ...]


_DEMO_BASE = ModelSpec(
    vocab_size=8192, n_embd=512, n_layer=6, n_head=8, n_ff=1536, dtype="bf16", seed=11, chat_template=CHAT_TEMPLATE, name="demo-a"
)
_WE_BASE = ModelSpec(vocab_size=32000, n_embd=1024, n_layer=8, n_head=16, n_ff=2816, dtype="bf16", seed=21, name="we-a")
_WE_152K = ModelSpec(vocab_size=151936, n_embd=512, n_layer=8, n_head=8, n_ff=1536, dtype="bf16", seed=41, name="we152k-a")
_CD_AMATEUR = ModelSpec(vocab_size=32000, n_embd=384, n_layer=4, n_head=6, n_ff=1152, dtype="bf16", seed=31, name="cd-amateur")

SETS: dict[str, SyntheticSet] = {
    "demo": SyntheticSet(
        "demo",
        "two small siblings for a weighted ensemble (builds in seconds)",
        (_DEMO_BASE, replace(_DEMO_BASE, noise=0.2, name="demo-b")),
        "we",
        ("demo-a", "demo-b"),
    ),
    "we-pair": SyntheticSet(
        "we-pair",
        "two same-size siblings (weighted ensemble)",
        (_WE_BASE, replace(_WE_BASE, noise=0.2, name="we-b")),
        "we",
        ("we-a", "we-b"),
    ),
    "cd-pair": SyntheticSet(
        "cd-pair",
        "an amateur and a 3x wider, deeper expert of its family, ~10x costlier per token (contrastive decoding)",
        (
            _CD_AMATEUR,
            replace(_CD_AMATEUR, widen=3, widen_scale=0.1, extra_layers=4, extra_scale=0.05, name="cd-expert"),
        ),
        "cd",
        ("cd-amateur", "cd-expert"),
    ),
    "we-unrelated": SyntheticSet(
        "we-unrelated",
        "two same-size models with unrelated weights (they rarely agree)",
        (_WE_BASE, replace(_WE_BASE, seed=22, name="we-u")),
        "we",
        ("we-a", "we-u"),
    ),
    "we-pair-152k": SyntheticSet(
        "we-pair-152k",
        "two same-size siblings with Qwen2.5's 152k vocabulary (host overhead at a large vocabulary)",
        (_WE_152K, replace(_WE_152K, noise=0.2, name="we152k-b")),
        "we",
        ("we152k-a", "we152k-b"),
    ),
    "we-triple": SyntheticSet(
        "we-triple",
        "three same-size siblings (three-model weighted ensemble)",
        (
            _WE_BASE,
            replace(_WE_BASE, noise=0.2, name="we-b"),
            replace(_WE_BASE, noise=0.2, noise_seed=2, name="we-c"),
        ),
        "we",
        ("we-a", "we-b", "we-c"),
    ),
}


def ensure_set(
    name: str,
    progress: Callable[[str], None] | None = None,
    directory: Path | None = None,
    dtype: str | None = None,
) -> list[Path]:
    """Paths of the models of a synthetic set, building (and caching) any that are missing.

    `dtype` overrides the set's weight type (f32, f16, bf16, q8_0, q4_0)."""
    if name not in SETS:
        raise KeyError(name)
    where = (directory or cache_dir() / "synthetic")
    paths = []
    for spec in SETS[name].specs:
        if dtype is not None:
            spec = replace(spec, dtype=dtype)
        if not cached_path(spec, where).exists() and progress:
            progress(f"building synthetic model {spec.name} (once; cached in {where})")
        paths.append(cached_model(spec, where))
    return paths
