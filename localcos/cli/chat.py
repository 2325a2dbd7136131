"""`localcos chat`: the terminal chat (the Textual app in localcos.tui)."""

from __future__ import annotations

import argparse

from ..errors import ConfigError, LocalcosError
from .options import add_options, resolve

DEFAULTS = {"temperature": 0.7, "max_tokens": 512}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "chat", help="chat with an ensemble in the terminal", description="A terminal chat with an ensemble of models, showing speculation at work."
    )
    p.add_argument("--demo", action="store_true", help="chat with the built-in synthetic demo pair")
    add_options(
        p,
        ["models", "hardware", "combination", "method", "level", "sampling", "output", "chat"],
        defaults=DEFAULTS,
        exclude={"synthetic", "synthetic_dtype"},
    )
    p.set_defaults(func=run)


def settings_for(args: argparse.Namespace):
    """The chat's settings from its command line (--demo: the synthetic demo pair)."""
    if args.demo and (args.models or args.preset):
        raise ConfigError("give --demo or --models/--preset, not both", param="demo")
    from ..runtime.bytelevel import decoding_level

    settings = resolve(args, {**DEFAULTS, "synthetic": "demo"} if args.demo else DEFAULTS)
    decoding_level(settings)  # an option the level chosen would not read is refused here
    return settings


def run(args: argparse.Namespace) -> int:
    try:
        from ..tui.app import run_chat
    except ImportError as e:  # installed without its chat interface
        raise LocalcosError(f"the chat interface is not installed ({e})") from None
    return run_chat(settings_for(args))
