"""The llama.cpp layer: GGUF models in llama.cpp contexts, and tokenizer compatibility.

Nothing here knows about combining models or decoding strategies; everything above talks to
llama.cpp only through `Model` (or `RemoteModel`, the same interface for a model on RPC servers).
"""

from .gguf_file import GGUFInfo, check_gguf_file, check_model_file, read_info
from .llamacpp import default_threads, set_verbose
from .model import MIN_CTX, Model
from .slot import ModelStats, Slot, common_prefix
from .rpc import Endpoint, parse_endpoint, rpc_available
from .vocab import shared_vocab_size, tokenize_alike
from .worker import RemoteModel

__all__ = [
    "MIN_CTX",
    "Endpoint",
    "Model",
    "ModelStats",
    "RemoteModel",
    "Slot",
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
