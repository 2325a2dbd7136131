"""Weight types by the names people type (f16, q4_0, iq4_nl, q4_k_m), as the gguf package's
`LlamaFileType` numbers them (llama.cpp's llama_ftype): the one table of them in localcos."""

from __future__ import annotations

from gguf import LlamaFileType

from ..errors import ConfigError

# what the synthetic-model writer offers: three types it stores itself, the rest by llama.cpp's quantiser
WEIGHT_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_k_m")
WRITTEN_TYPES = ("f32", "f16", "bf16")
# what `localcos models quantize` makes: types whose batched CPU calls are cheap (llama.cpp repacks
# Q4_0 and IQ4_NL for matrix-matrix kernels), and Q8_0
QUANTIZE_TYPES = ("q4_0", "iq4_nl", "q8_0")


def file_type(name: str) -> LlamaFileType:
    """The llama_ftype of a weight type name ("q4_0" -> MOSTLY_Q4_0, "f32" -> ALL_F32)."""
    key = "ALL_F32" if name == "f32" else "MOSTLY_" + name.upper()
    try:
        return LlamaFileType[key]
    except KeyError:
        raise ConfigError(f"unknown weight type {name!r}", param="type") from None


def type_name(value: int | None) -> str | None:
    """The name of a `general.file_type` value ("q4_k_m"), None when unknown."""
    try:
        member = LlamaFileType(value) if value is not None else None
    except ValueError:
        return None
    if member is None or member == LlamaFileType.GUESSED:
        return None
    return "f32" if member == LlamaFileType.ALL_F32 else member.name.removeprefix("MOSTLY_").lower()
