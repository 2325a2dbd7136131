"""Quantising GGUF files with llama.cpp's own quantiser (`llama_model_quantize`), as users'
quantised files are made: the synthetic models' q8_0 / q4_0 / q4_k_m, and `localcos models
quantize` (a downloaded model requantised to a type whose batched CPU calls are cheap)."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from .weights import file_type


def quantize(source: str | os.PathLike[str], target: str | os.PathLike[str], dtype: str, *, allow_requantize: bool = False) -> Path:
    """Write `source` quantised to weight type `dtype` (q8_0, q4_0, iq4_nl, q4_k_m, ...: llama.cpp
    picks each tensor's type for it) to `target`. `allow_requantize` lets the source be quantised
    already (a Q4_K_M file requantised to Q4_0 loses some quality)."""
    from ..backend.model import default_threads, last_llama_error  # loads llama.cpp's libraries
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = file_type(dtype).value
    params.nthread = default_threads()
    params.allow_requantize = allow_requantize
    last_llama_error()
    rc = llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama.cpp could not quantise {source} to {dtype}: {last_llama_error() or f'status {rc}'}")
    return Path(target)
