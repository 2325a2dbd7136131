"""`localcos generate`: text from an ensemble, streamed or as JSON."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace

from ..errors import ConfigError
from .options import add_options, loading_progress, note, resolve

DEFAULTS = {"temperature": 1.0, "max_tokens": 128}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help="generate text with an ensemble of models",
        description="Generate text with an ensemble of GGUF models. Models with different tokenizers are combined at the byte "
        "level (--level): each reads the prompt in its own tokens, and --max-tokens then counts characters.",
    )
    p.add_argument("--prompt", "-p", default=None, help="prompt text (default: read stdin); raw text unless --chat")
    add_options(p, ["models", "hardware", "combination", "method", "level", "sampling", "output"], defaults=DEFAULTS, exclude={"synthetic", "synthetic_dtype"})
    g = p.add_argument_group("chat")
    g.add_argument("--chat", action="store_true", help="format the prompt as a user message with the models' chat template")
    add_options(p, ["chat"], defaults=DEFAULTS)
    g = p.add_argument_group("completions")
    g.add_argument("--n", default="1", help="independent completions of the prompt (default 1)")
    g.add_argument("--json", action="store_true", help="print one JSON object with completions and stats")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..chat import ChatFormatter, Message, second_conversation
    from ..ensemble import Ensemble
    from ..config import default_parallel
    from ..config.parse import parse_int
    from ..config.specs import check_second_prompt
    from ..core.level import Level
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
    settings = resolve(args, DEFAULTS)
    if args.chat and settings.generation.phrasing != "raw":
        raise ConfigError("--phrasing instruct phrases a text prompt as a chat of its own; give it without --chat", param="phrasing")
    check_second_prompt(prompt, settings.generation.negative_prompt)  # before any model loads
    config = settings.generation
    if config.seed is None:  # a seed the user can repeat: printed with the stats
        config = replace(config, seed=int.from_bytes(os.urandom(4), "little"))
    from ..runtime.bytelevel import decoding_level

    if decoding_level(settings).in_bytes:
        return _generate_bytes(args, settings, config, prompt, n)
    if settings.load.parallel is None and n > 1 and not any(settings.load.rpc):  # --n: decode them together
        settings = replace(settings, load=replace(settings.load, parallel=default_parallel(settings.load.n_ctx, n)))
    with Ensemble.from_spec(settings.load, settings.combiner(), progress=loading_progress) as ens:
        second: str | list[int] | None = None  # the second prompt's member's: the negative text (config), or its chat rendering
        if args.chat:
            formatter = ChatFormatter(ens, settings.chat_template_model)
            if formatter.note:
                note(formatter.note)
            messages = ([Message("system", settings.system)] if settings.system else []) + [Message("user", prompt)]
            prompt_input: str | list[int] = formatter.tokens(messages)
            conversation = second_conversation(messages, config.negative_prompt, settings.guide_system)
            if conversation is not None:
                second = formatter.tokens(conversation)
        else:
            prompt_input = prompt
        if args.json:
            completions = ens.generate_many(prompt_input, n, config=config, second_prompt=second)
            print(json.dumps(generation_json(completions, Level.TOKEN, config.seed, ens.combiner.description)))
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


def _generate_bytes(args: argparse.Namespace, settings, config, prompt: str, n: int) -> int:
    """generate at the byte level: each model in its own tokens and chat template."""
    from ..chat import Message, OwnTemplates
    from ..runtime.bytelevel import ByteModels, run_to_end
    from ..runtime.generation import completion_rng
    from ..runtime.report import generation_json

    with ByteModels.load(settings.load, settings.combiner(), progress=loading_progress) as models:
        if args.chat:
            messages = ([Message("system", settings.system)] if settings.system else []) + [Message("user", prompt)]
            prompts = OwnTemplates(models).tokens(messages)
        else:
            prompts = models.prompts(prompt, phrasing=config.phrasing)
        plan = models.plan(prompts, config)
        completions = []
        for k in range(n):
            generation = models.start(plan, completion_rng(config.seed, k))
            if args.json:
                completions.append(run_to_end(generation))
                continue
            if k:
                sys.stdout.write("\n---\n")
            for piece in generation.run():
                sys.stdout.write(piece)
                sys.stdout.flush()
            completions.append(generation.completion)
        if args.json:
            print(json.dumps(generation_json(completions, plan.level, config.seed, models.combiner.description)))
            return 0
        sys.stdout.write("\n")
        sys.stdout.flush()
        for c in completions:
            note(f"{models.combiner.description}, seed {config.seed}, " + c.stats.summary())
    return 0
