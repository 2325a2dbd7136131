"""Byte-level collaborative decoding: models with different tokenizers combined exactly, one byte
at a time.

Each model reads the prompt in its own tokens (and its own chat template) and keeps a
`core.bytelevel.ByteView` of its distribution over the next byte; its paths live in its own
llama.cpp sequences (`ByteMember`), a new path sharing its parent's cache cells (seq_cp) and all
new paths of one byte evaluated in one llama_decode call. A model whose paths are all inside a
token makes no call for that byte. The combiner takes the models' byte distributions as log
probabilities (a [1, 257] row each: bytes, then the end symbol), so WE, CD, logit mixing and user
functions combine at the byte level unchanged; r is sampled byte by byte, restricted to bytes
that keep the text valid UTF-8, and text is emitted as characters complete.
"""

from .generation import ByteGeneration, run_to_end
from .level import byte_vocab
from .member import ByteMember
from .models import ByteModels
from .results import BytePlan
from .symbols import RULED_OUT, combine_symbols, floor_ruled_out, gate_opens

__all__ = [
    "RULED_OUT",
    "ByteGeneration",
    "ByteMember",
    "ByteModels",
    "BytePlan",
    "byte_vocab",
    "combine_symbols",
    "floor_ruled_out",
    "gate_opens",
    "run_to_end",
]
