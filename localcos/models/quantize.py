"""Quantising GGUF files with llama.cpp's own quantiser (`llama_model_quantize`), as users'
quantised files are made: the synthetic models' q8_0 / q4_0 / q4_k_m, and `localcos models
quantize` (a downloaded model requantised to a type whose batched CPU calls are cheap), whose
files live in the cache as NAME@TYPE and are used by that name."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from collections.abc import Callable

from ..backend import check_model_file, read_info
from ..errors import ConfigError
from ..files import CACHE_HINT, atomic_path
from ..paths import cache_dir
from .weights import QUANTIZE_TYPES, file_type, type_name


def quantize(
    source: str | os.PathLike[str], target: str | os.PathLike[str], dtype: str, *, allow_requantize: bool = False, hint: str = ""
) -> Path:
    """Write `source` quantised to weight type `dtype` (q8_0, q4_0, iq4_nl, q4_k_m, ...: llama.cpp
    picks each tensor's type for it) to `target`, whole or not at all (a temporary file renamed
    when complete; `hint`: what to do when the disk refuses). `allow_requantize` lets the source
    be quantised already (a Q4_K_M file requantised to Q4_0 loses some quality)."""
    from ..backend.llamacpp import default_threads, last_llama_error  # loads llama.cpp's libraries
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = file_type(dtype).value
    params.nthread = default_threads()
    params.allow_requantize = allow_requantize
    with atomic_path(target, hint) as temp:
        last_llama_error()
        rc = llama_cpp.llama_model_quantize(str(source).encode(), str(temp).encode(), ctypes.byref(params))
        if rc != 0:
            raise RuntimeError(f"llama.cpp could not quantise {source} to {dtype}: {last_llama_error() or f'status {rc}'}")
    return Path(target)


def quantized_dir() -> Path:
    """Where `models quantize` keeps its files by default."""
    return cache_dir() / "quantized"


def quantized_path(name: str, dtype: str) -> Path:
    """The cache file of model `name` (a models.toml name or a file's stem) quantised to `dtype`."""
    return quantized_dir() / f"{name}@{dtype}.gguf"


def check_quantize_type(dtype: str) -> str:
    """`dtype` if `models quantize` makes it (`ConfigError` otherwise)."""
    dtype = dtype.lower()
    if dtype not in QUANTIZE_TYPES:
        raise ConfigError(
            f"--type {dtype!r} is not offered; choose {', '.join(QUANTIZE_TYPES)} (types whose batched calls llama.cpp's CPU kernels make cheap, and q8_0)",
            param="type",
        )
    return dtype


def requantize(source: Path, dtype: str, target: Path, hint: str = CACHE_HINT, on_start: Callable[[], None] | None = None) -> Path:
    """`source` (checked whole) quantised to `dtype` at `target`; a `ConfigError` when it has that
    type already. `on_start()` is called once the checks passed, before the long part."""
    check_model_file(source)
    have = type_name(read_info(source, tokens=False).metadata.get("general.file_type"))
    if have == dtype:
        raise ConfigError(f"{source} has {dtype} weights already", param="type")
    if on_start is not None:
        on_start()
    return quantize(source, target, dtype, allow_requantize=have not in (None, "f32", "f16", "bf16"), hint=hint)


def builtin_text() -> str:
    """The text `models quantize` measures the perplexity change on: the source of Python's own
    `textwrap` module (code and English prose, on every installation)."""
    import inspect
    import textwrap

    return inspect.getsource(textwrap)
