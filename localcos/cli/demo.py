"""`localcos demo`: the standard ensemble and CoS side by side on one prompt."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

from .options import add_options, loading_progress, resolve, say

DEFAULTS = {"synthetic": "demo", "ctx": 1024, "max_tokens": 64, "temperature": 1.0, "seed": 0}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="run the standard ensemble and CoS on one prompt (synthetic models, or yours)",
        description="Generate once with the standard ensemble and once with CoS, and print both speeds. Without "
        "--models or --preset it builds (once) a small synthetic pair whose text is random by design.",
    )
    p.add_argument("--prompt", default="The small model writes a draft and the large model", help="prompt text")
    add_options(
        p,
        ["models", "hardware", "combination", "sampling"],
        defaults=DEFAULTS,
        exclude={"synthetic", "synthetic_dtype", "negative_prompt", "cfg_scale"},
    )
    add_options(p, ["output"], defaults=DEFAULTS, exclude={"stop"})
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..ensemble import Ensemble
    from ..models.synthetic import SETS

    synthetic = not (args.models or args.preset)
    t0 = time.perf_counter()
    settings = resolve(args, DEFAULTS)
    built = time.perf_counter() - t0
    if synthetic and built > 1:
        say(f"built the demo models in {built:.1f}s")
    if synthetic:
        say(f"localcos demo: {SETS['demo'].description}.")
        say(
            "Their weights are synthetic (untrained), so the text below is random by design: the demo shows speed, "
            "not language. The same demo on real models: localcos demo --models A.gguf,B.gguf (any pair with one "
            "tokenizer) or --preset qwen-1.5b-we"
        )
        config = replace(settings.generation, ignore_eos=True)  # random text: run the full length
    else:
        say(f"localcos demo: {settings.name}")
        config = settings.generation
    say(f"prompt: {args.prompt!r}\n")
    with Ensemble.from_spec(settings.load, settings.combiner(), progress=loading_progress) as ens:
        ens.generate(args.prompt, method="ensemble", max_tokens=4, ignore_eos=True)  # warm up
        baseline = ens.generate(args.prompt, config=replace(config, method="ensemble"))
        stream = ens.stream(args.prompt, config=replace(config, method="cos"))
        for piece in stream:
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n\n")
        cos = stream.completion
        assert cos is not None
        print(f"standard ensemble: {baseline.stats.summary()}")
        print(f"CoS:               {cos.stats.summary()}")
        if baseline.stats.tokens_per_second and cos.stats.tokens_per_second:
            ratio = cos.stats.tokens_per_second / baseline.stats.tokens_per_second
            print(f"CoS ran at {ratio:.2f}x the speed of the standard ensemble, sampling from the same distribution.")
    return 0
