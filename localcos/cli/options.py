"""The command line's side of the settings layer: argparse options made from the declarations in
`localcos.config`, and the helpers every subcommand shares (one-line errors, progress lines)."""

from __future__ import annotations

import argparse
import ipaddress
import socket
import sys
from typing import Any
from collections.abc import Iterable, Mapping

from ..errors import ConfigError
from ..config import GROUPS, OPTIONS, Settings
from ..config.flags import FlagParser, add_flags
from ..config import resolve as resolve_settings

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130

GROUP_TITLES = {
    "models": "models",
    "hardware": "hardware",
    "combination": "combination (how the models' distributions are combined)",
    "method": "decoding method",
    "level": "level (tokens, or bytes for models with different tokenizers)",
    "sampling": "sampling",
    "output": "output",
    "chat": "chat",
}


class Parser(FlagParser):
    """The command line's parser: a usage error is one line (status 2), like every other bad
    input."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise SystemExit(fail(f"{message} (see {self.prog} --help)"))


def fail(message: str) -> int:
    print(f"localcos: error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def info(message: str) -> None:
    """Progress for people: on stderr, only when it is a terminal."""
    if sys.stderr.isatty():
        print(message, file=sys.stderr, flush=True)


def say(message: str) -> None:
    """A line on stderr for long work (building models), terminal or not."""
    print(message, file=sys.stderr, flush=True)


def note(message: str) -> None:
    print(f"localcos: {message}", file=sys.stderr, flush=True)


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses (127.0.0.0/8, ::1): this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_port_free(host: str, port: int) -> None:
    """Fail before loading anything, not after, when the port is taken."""
    bind(host, port).close()


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (0: a free port), or one line saying why not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host, port))
    except OSError as e:
        s.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e}", param="port") from None
    return s


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (0: a free port), or one line saying why not."""
    s = bind(host, port)
    # accepted connections inherit it: without, small responses wait for delayed ACKs (~40 ms)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.listen(2048)
    return s


def add_options(
    parser: argparse.ArgumentParser,
    groups: Iterable[str],
    *,
    defaults: Mapping[str, Any] | None = None,
    exclude: Iterable[str] = (),
) -> None:
    """Add the declared options of `groups` to `parser` (every value arrives as typed, and is
    checked by the settings layer). `defaults` are this command's own defaults, shown in help."""
    skip = set(exclude)
    for group in groups:
        add_flags(parser.add_argument_group(GROUP_TITLES.get(group, group)), [o for o in GROUPS[group] if o.name not in skip], defaults)


def option_values(args: argparse.Namespace) -> dict[str, Any]:
    """The declared options found in `args` (None where not given)."""
    return {name: getattr(args, name) for name in OPTIONS if hasattr(args, name)}


def resolve(args: argparse.Namespace, defaults: Mapping[str, Any] | None = None, decoded: bool = True) -> Settings:
    """The command's settings: its options through the settings layer (`decoded`: see
    `config.resolve.resolve`)."""
    return resolve_settings(option_values(args), defaults=defaults, progress=info, building=say, decoded=decoded)


def loading_progress(i: int, n: int, name: str) -> None:
    info(f"loading {name} ({i + 1}/{n})")
