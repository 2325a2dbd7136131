"""`localcos generate`: text from an ensemble, streamed or as JSON."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .options import add_options, loading_progress, note, resolve

if TYPE_CHECKING:
    from ..config.specs import Settings
    from ..infill import Infill

DEFAULTS = {"temperature": 1.0, "max_tokens": 128}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help="generate text with an ensemble of models",
        description="Generate text with an ensemble of GGUF models. Models with different tokenizers are combined at the byte "
        "level (--level): each reads the prompt in its own tokens, and --max-tokens counts the lead model's tokens.",
    )
    p.add_argument("--prompt", "-p", default=None, help="prompt text (default: read stdin); raw text unless --chat")
    g = p.add_argument_group("fill in the middle", "code completion at a cursor: the prompt is the text before it, the suffix the text "
                             "after it, read through the models' fill-in-the-middle tokens as llama-server's /infill reads them")  # fmt: skip
    g.add_argument("--suffix", default=None, metavar="TEXT", help="the text after the middle to write")
    g.add_argument("--suffix-file", default=None, metavar="FILE", help="read the suffix from FILE")
    g.add_argument("--context-file", action="append", default=None, metavar="FILE",
                   help="another file of the project, read before the prefix as repository-level context (repeatable)")
    add_options(p, ["models", "hardware", "combination", "method", "level", "sampling", "output"], defaults=DEFAULTS, exclude={"synthetic", "synthetic_dtype"})
    g = p.add_argument_group("chat")
    g.add_argument("--chat", action="store_true", help="format the prompt as a user message with the models' chat template")
    add_options(p, ["chat"], defaults=DEFAULTS)
    g = p.add_argument_group("completions")
    g.add_argument("--n", default="1", help="independent completions of the prompt (default 1)")
    g.add_argument("--json", action="store_true", help="print one JSON object with completions and stats")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..config.parse import parse_int
    from ..config.specs import check_second_prompt
    from ..ensemble import load_at
    from ..config.levels import decoding_level
    from ..runtime.report import generation_json
    from ..stats import GenerationStats

    prompt = args.prompt
    if prompt is None:
        if sys.stdin.isatty():
            raise ConfigError("no prompt: give --prompt TEXT or pipe the prompt on stdin", param="prompt")
        prompt = sys.stdin.read()
    n = parse_int(args.n, "--n", minimum=1)
    if args.system is not None and not args.chat:
        raise ConfigError("--system needs --chat", param="system")
    infill = _infill(args, prompt)
    settings = resolve(args, DEFAULTS)
    if args.chat and settings.generation.phrasing != "raw":
        raise ConfigError("--phrasing instruct phrases a text prompt as a chat of its own; give it without --chat", param="phrasing")
    check_second_prompt(prompt, settings.generation.negative_prompt)  # before any model loads
    config = settings.generation
    if config.seed is None:  # a seed the user can repeat: printed with the stats
        config = replace(config, seed=int.from_bytes(os.urandom(4), "little"))
    decoding_level(settings)  # what the level does not decode, refused before anything loads
    if n > 1:  # --n: decode them together
        settings = replace(settings, load=settings.load.decoding_together(n))
    ens = load_at(settings.load, settings.combiner(), progress=loading_progress)
    with ens:
        prompt_input, second = _prompts(args, ens, settings, prompt) if args.chat else (infill or prompt, None)
        if args.json:
            completions = ens.generate_many(prompt_input, n, config=config, second_prompt=second)
            print(json.dumps(generation_json(completions, completions[0].stats.level, config.seed, ens.combiner.description)))
            return 0
        completions = []
        if n == 1:
            stream = ens.stream(prompt_input, config=config, second_prompt=second)
            for piece in stream:
                sys.stdout.write(piece)
                sys.stdout.flush()
            sys.stdout.write("\n")
            assert stream.completion is not None
            completions.append(stream.completion)
        else:
            for i, c in enumerate(ens.generate_many(prompt_input, n, config=config, second_prompt=second)):
                if i:
                    sys.stdout.write("\n---\n")
                sys.stdout.write(c.text)
                completions.append(c)
            sys.stdout.write("\n")
        sys.stdout.flush()
        print("[localcos] " + GenerationStats.aggregate([c.stats for c in completions]).summary(), file=sys.stderr)
    return 0


def _infill(args: argparse.Namespace, prompt: str) -> Infill | None:
    """What to fill in at a cursor, where a suffix is given (`--suffix`, `--suffix-file`), with
    the context files; None for a plain prompt."""
    from ..files import read_text
    from ..infill import ExtraChunk, Infill

    if args.suffix is not None and args.suffix_file is not None:
        raise ConfigError("give --suffix or --suffix-file, not both", param="suffix")
    suffix = read_text(args.suffix_file, "--suffix-file") if args.suffix_file is not None else args.suffix
    if suffix is None:
        if args.context_file:
            raise ConfigError("--context-file is read with a suffix (fill in the middle): give --suffix", param="context_file")
        return None
    if args.chat:
        raise ConfigError("--suffix fills in the middle through the models' FIM tokens, not a chat: leave out --chat", param="suffix")
    extra = tuple(ExtraChunk(read_text(path, "--context-file"), os.path.basename(path)) for path in args.context_file) if args.context_file else None
    return Infill(prompt, suffix, extra=extra)


def _prompts(args: argparse.Namespace, ens: Any, settings: Settings, prompt: str) -> tuple[Any, Any]:
    """`--chat`: the conversation as the models read it, and as a member reading a second prompt
    reads it (None: there is none, or it reads --negative-prompt's text), in the templates of the
    level the models decode at (`chat.chat_templates`)."""
    from ..chat import Message, chat_templates, second_conversation

    formatter = chat_templates(ens, settings.chat_template_model)
    if formatter.note:
        note(formatter.note)
    messages = ([Message("system", settings.system)] if settings.system else []) + [Message("user", prompt)]
    conversation = second_conversation(messages, settings.generation.negative_prompt, settings.guide_system)
    second = formatter.second_tokens(conversation) if conversation is not None and ens.second_member is not None else None
    return formatter.tokens(messages), second
