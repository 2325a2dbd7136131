"""`localcos chat`: the terminal chat (the Textual app in localcos.tui), and its kept conversations."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, LocalcosError
from ..tui.prefs import CHAT_DEFAULTS
from .options import add_options, resolve

if TYPE_CHECKING:
    from ..config import Settings
    from ..conversations import ConversationStore


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "chat",
        help="chat with an ensemble in the terminal",
        description="A terminal chat with an ensemble of models, showing speculation at work. Every conversation is kept as it "
        "happens, in localcos's data folder ($LOCALCOS_DATA, else $XDG_DATA_HOME/localcos): Ctrl+O lists them in the chat.",
    )
    p.add_argument("--demo", action="store_true", help="chat with the built-in synthetic demo pair")
    kept = p.add_argument_group("kept conversations")
    kept.add_argument("--continue", dest="resume", action="store_true", help="reopen the last conversation, with its own models and settings")
    kept.add_argument("--open", metavar="ID", help="reopen conversation ID (see --list), with its own models and settings")
    kept.add_argument("--list", action="store_true", help="print the kept conversations and exit")
    kept.add_argument("--import", dest="import_file", metavar="FILE", help="keep a conversation exported as JSON, and open it")
    add_options(
        p,
        ["models", "hardware", "combination", "method", "level", "sampling", "output", "chat"],
        defaults=CHAT_DEFAULTS,
        exclude={"synthetic", "synthetic_dtype"},
    )
    p.set_defaults(func=run)


def settings_for(args: argparse.Namespace, held: dict[str, Any] | None = None) -> Settings:
    """The chat's settings from its command line (--demo: the synthetic demo pair); a reopened
    conversation's own (`held`: its models and options) under what the command line gives."""
    if args.demo and (args.models or args.preset):
        raise ConfigError("give --demo or --models/--preset, not both", param="demo")
    from ..config.levels import decoding_level

    if held and not (args.demo or args.models or args.preset):  # (held: models, or the synthetic set of --demo)
        given = {k: v for k, v in vars(args).items() if v not in (None, False, [])}
        try:
            settings = resolve(argparse.Namespace(**{**held, **given}), CHAT_DEFAULTS)
        except LocalcosError as e:
            raise ConfigError(f"this conversation was held with {held.get('models') or held.get('synthetic')}: {e}", param="models") from None
    else:
        settings = resolve(args, {**CHAT_DEFAULTS, "synthetic": "demo"} if args.demo else CHAT_DEFAULTS)
    decoding_level(settings)  # an option the level chosen would not read is refused here
    return settings


def run(args: argparse.Namespace) -> int:
    from ..conversations import ConversationStore

    try:
        from ..tui.app import run_chat
        from ..tui.prefs import Prefs
    except ImportError as e:  # installed without its chat interface
        raise LocalcosError(f"the chat interface is not installed ({e})") from None
    reopen = [flag for flag, given in (("--continue", args.resume), ("--open", args.open), ("--import", args.import_file)) if given]
    if len(reopen) > 1:
        raise ConfigError(f"give one of {', '.join(reopen)}", param="open")
    store = ConversationStore()
    try:
        if args.list:
            return _list(store)
        open_id = _reopened(args, store)
        held = store.get(open_id).settings if open_id is not None else None
        settings = settings_for(args, held)
    except BaseException:
        store.close()
        raise
    return run_chat(settings, open_id=open_id, store=store, prefs=Prefs.load())


def _reopened(args: argparse.Namespace, store: ConversationStore) -> int | None:
    """The kept conversation to open: the last (--continue), one by id (--open), or an
    imported one (--import); None for a new one."""
    if args.resume:
        latest = store.latest()
        if latest is None:
            raise ConfigError("no conversation is kept yet: start one with `localcos chat --models ...`", param="continue")
        return latest
    if args.open is not None:
        try:
            return store.get(int(args.open)).id
        except ValueError:
            raise ConfigError(f"--open takes a conversation's number (see --list), got {args.open!r}", param="open") from None
    if args.import_file is not None:
        from ..files import read_text

        text = read_text(args.import_file, "--import")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"--import {args.import_file}: not JSON ({e.msg}, line {e.lineno})", param="import") from None
        return store.import_json(data, f"--import {args.import_file}")
    return None


def _list(store: ConversationStore) -> int:
    kept = store.conversations()
    if not kept:
        print(f"no conversations kept yet (in {store.path})")
        return 0
    print(f"{'id':>4}  {'last':<16}  {'messages':>8}  {'models':<40}  title")
    for k in kept:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(k.updated))
        models = ", ".join(Path(m).name if "/" in m else m for m in k.models)  # a file by its name, a named model as named
        print(f"{k.id:>4}  {when:<16}  {k.count:>8}  {models[:40]:<40}  {k.title}")
    print(f"\n(in {store.path}; `localcos chat --open ID` reopens one, --continue the last)")
    return 0
