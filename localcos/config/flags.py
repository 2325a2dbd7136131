"""The declared options as command-line flags: the one reader of flags, for the command line
(`cli.options.add_options`) and for flags given inside a value (eval's `--variant NAME=FLAGS`).
Each flag takes its value as the command line does (`--mu 0.2`, `--mu=0.2`, a switch without
one, a repeatable option once per value); the value is then checked by its option's parser."""

from __future__ import annotations

import argparse
import re
from typing import Any
from collections.abc import Iterable, Mapping, Sequence

from ..errors import ConfigError
from .options import Option

_MISSING = object()  # the value of a flag given without one (`--mu` last, or before another flag)


class FlagParser(argparse.ArgumentParser):
    """argparse that takes "-,HOST:PORT" as a value (--rpc's "this model here, that one there")
    and negative numbers, not as flags."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\d+$|^-\d*\.\d+$|^-,")


def add_flags(group: Any, options: Iterable[Option], defaults: Mapping[str, Any] | None = None, *, missing: Any = None) -> None:
    """Add `options` to an argparse parser or group as flags (every value arrives as typed, to be
    checked by its option's parser). `defaults` are the command's own, shown in the help;
    `missing`: what a value flag given without a value reads as (None: argparse's own error)."""
    defaults = defaults or {}
    for opt in options:
        default = defaults.get(opt.name, opt.default)
        text = opt.help
        if opt.format(default) and not opt.switch:
            text += f" (default {opt.format(default)})"
        kwargs: dict[str, Any] = {"dest": opt.name, "default": None, "help": text}
        if opt.switch:
            kwargs["action"] = "store_true"
        else:
            kwargs["metavar"] = "{" + ",".join(opt.choices) + "}" if opt.choices else (opt.metavar or opt.name.upper())
            if opt.repeat:
                kwargs["action"] = "append"
            if missing is not None:
                kwargs.update(nargs="?", const=missing)
        group.add_argument(*opt.flags, **kwargs)


class _Inside(FlagParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(message, param=self.prog)


def parse_flags(words: Sequence[str], options: Sequence[Option], *, what: str, param: str, refused: str) -> dict[str, Any]:
    """The raw values (as typed) of the `options` given in `words`, read as the command line reads
    its flags. A word that is none of their flags is a `ConfigError` ("`what`: WORD `refused`"),
    as is a value flag without its value ("`what`: FLAG needs a value"); each names `param`."""
    parser = _Inside(prog=param, add_help=False, allow_abbrev=False)
    add_flags(parser, options, missing=_MISSING)
    values, unknown = parser.parse_known_args(list(words))
    if unknown:
        raise ConfigError(f"{what}: {unknown[0]} {refused}", param=param)
    given = {}
    for opt in options:
        value = getattr(values, opt.name)
        if value is None or value is False:
            continue
        if value is _MISSING or (isinstance(value, list) and _MISSING in value):
            raise ConfigError(f"{what}: {opt.flag} needs a value", param=param)
        given[opt.name] = value
    return given
