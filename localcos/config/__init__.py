"""The settings layer: every option declared once (`options`), one parser per kind of value
(`parse`), the frozen specs front ends hand to the library (`specs`), and `resolve`, which makes
them from option values as the command line, the chat's form or a request has them. Everything
that can be checked without the models is checked here, once; data runs one way: front end ->
config -> runtime.
"""

from .options import GROUPS, OPTIONS, Option
from .levels import check_level, decoding_level, default_method, level_methods
from .parse import Gamma, format_gamma, format_rpc, parse_gamma, parse_rpc, parse_served_combine
from .resolve import resolve, resolve_server
from .specs import (
    CombineSpec,
    GenerationConfig,
    LoadSpec,
    ServerSpec,
    Settings,
    check_for_models,
    default_parallel,
)

__all__ = [
    "GROUPS",
    "OPTIONS",
    "CombineSpec",
    "Gamma",
    "GenerationConfig",
    "LoadSpec",
    "Option",
    "ServerSpec",
    "Settings",
    "check_for_models",
    "check_level",
    "decoding_level",
    "default_method",
    "default_parallel",
    "format_gamma",
    "format_rpc",
    "level_methods",
    "parse_gamma",
    "parse_rpc",
    "parse_served_combine",
    "resolve",
    "resolve_server",
]
