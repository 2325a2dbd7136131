"""The llama.cpp layer: GGUF models in llama.cpp contexts, and tokenizer compatibility.

Nothing here knows about combining models or decoding strategies; everything above talks to
llama.cpp only through `Model` (or `RemoteModel`, the same interface for a model on RPC servers).
"""

from .gguf_file import GGUFInfo, check_gguf_file, check_model_file, read_info
from .model import (
    MIN_CTX,
    Model,
    ModelStats,
    common_prefix,
    default_threads,
    set_verbose,
)
from .rpc import Endpoint, parse_endpoint, rpc_available
from .vocab import shared_vocab_size, tokenize_alike
from .worker import RemoteModel

__all__ = [
    "MIN_CTX",
    "Endpoint",
    "Model",
    "ModelStats",
    "RemoteModel",
    "GGUFInfo",
    "check_gguf_file",
    "check_model_file",
    "read_info",
    "common_prefix",
    "default_threads",
    "parse_endpoint",
    "rpc_available",
    "set_verbose",
    "shared_vocab_size",
    "tokenize_alike",
]
