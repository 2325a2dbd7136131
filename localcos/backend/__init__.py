"""The llama.cpp layer: GGUF models in llama.cpp contexts, and tokenizer compatibility.

Nothing here knows about combining models or decoding strategies; everything above talks to
llama.cpp only through `Model`.
"""

from .model import (
    MIN_CTX,
    Model,
    ModelStats,
    check_gguf_file,
    common_prefix,
    default_threads,
    set_verbose,
)
from .vocab import shared_vocab_size, tokenize_alike

__all__ = [
    "MIN_CTX",
    "Model",
    "ModelStats",
    "check_gguf_file",
    "common_prefix",
    "default_threads",
    "set_verbose",
    "shared_vocab_size",
    "tokenize_alike",
]
