"""The `localcos` command line."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
import os
import sys
import time
from pathlib import Path
from typing import Sequence

from . import __version__
from .errors import ConfigError, LocalcosError

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line (status 2), like every other bad input."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise SystemExit(_fail(f"{message} (see {self.prog} --help)"))


def _fail(message: str) -> int:
    print(f"localcos: error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _csv(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def _floats(text: str, what: str) -> list[float]:
    try:
        return [float(x) for x in _csv(text)]
    except ValueError:
        raise ConfigError(f"{what} must be comma-separated numbers, got {text!r}") from None


def _ints(text: str, what: str) -> list[int]:
    try:
        return [int(x) for x in _csv(text)]
    except ValueError:
        raise ConfigError(f"{what} must be comma-separated integers, got {text!r}") from None


def _info(message: str) -> None:
    """Progress for humans: on stderr, only when it is a terminal."""
    if sys.stderr.isatty():
        print(message, file=sys.stderr, flush=True)


# --- shared option groups ----------------------------------------------------------------------


def add_model_options(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    g = p.add_argument_group("models")
    g.add_argument("--models", "-m", help="comma-separated GGUF files, in ensemble order", required=required)
    g.add_argument("--ctx", type=int, default=4096, help="context length per model (default 4096)")
    g.add_argument(
        "--n-gpu-layers", default="0", help="layers to offload to the GPU: one value or one per model; -1 = all (default 0)"
    )
    g.add_argument("--threads", type=int, default=None, help="CPU threads per model (default: physical cores)")
    g.add_argument("--verbose", action="store_true", help="show llama.cpp's own log lines")


def add_combine_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("combination (how the models' distributions are combined)")
    g.add_argument(
        "--combine",
        default="we",
        help="we (weighted ensemble), cd (contrastive), logit-mix, or FILE.py:FUNCTION (default we)",
    )
    g.add_argument("--weights", help="we / logit-mix weights, one per model (default: equal)")
    g.add_argument("--mu", type=float, default=0.1, help="cd: amateur weight mu (default 0.1)")
    g.add_argument("--plausibility", type=float, default=None, help="cd: plausibility threshold alpha (default off)")
    g.add_argument("--expert", type=int, default=None, help="cd: index of the expert model (default: the larger)")
    g.add_argument(
        "--combine-level", choices=("logits", "probs"), default="logits", help="custom combiner: what FUNCTION receives"
    )


def add_sampling_options(p: argparse.ArgumentParser, *, temperature: float = 1.0) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--temperature", "-t", type=float, default=temperature, help=f"0 = greedy (default {temperature:g})")
    g.add_argument("--top-k", type=int, default=0, help="0 = off (default)")
    g.add_argument("--top-p", type=float, default=1.0, help="1 = off (default)")
    g.add_argument("--min-p", type=float, default=0.0, help="0 = off (default)")
    g.add_argument("--seed", type=int, default=None, help="random seed (default: random, printed in the stats)")


def add_method_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("decoding method")
    g.add_argument(
        "--method",
        choices=("ensemble", "sd", "naive-cos", "cos"),
        default=None,
        help="ensemble (every model, every token), sd, naive-cos, or cos (default: cos; ensemble for one model)",
    )
    g.add_argument(
        "--gamma",
        default=None,
        help="proposal length: one value (the proposer's; others 1), one per model, or auto (chosen online from "
        "measured acceptance and call times; the output then depends on timing, not only on --seed). "
        "Default: from the models' size ratio",
    )
    g.add_argument("--proposer", type=int, default=None, help="index of the default proposer (default: the cheapest model)")


def build_combiner(args: argparse.Namespace):
    from .combiners import make_combiner

    weights = _floats(args.weights, "--weights") if args.weights else None
    return make_combiner(
        args.combine,
        weights=weights,
        mu=args.mu,
        plausibility=args.plausibility,
        expert=args.expert,
        level=args.combine_level,
    )


def load_ensemble(args: argparse.Namespace, paths: Sequence[str] | None = None):
    from .backend import set_verbose
    from .ensemble import Ensemble

    if args.verbose:
        set_verbose(True)
    paths = list(paths) if paths is not None else _csv(args.models)
    if not paths:
        raise ConfigError("--models is empty; give comma-separated GGUF files")
    layers = _ints(args.n_gpu_layers, "--n-gpu-layers")
    combiner = build_combiner(args)
    return Ensemble.load(
        paths,
        combiner,
        n_ctx=args.ctx,
        n_gpu_layers=layers[0] if len(layers) == 1 else layers,
        n_threads=args.threads,
        progress=lambda i, n, name: _info(f"loading {name} ({i + 1}/{n})"),
    )


def generation_settings(args: argparse.Namespace, n_models: int) -> dict:
    method = args.method or ("cos" if n_models > 1 else "ensemble")
    gamma: int | tuple[int, ...] | str | None = None
    if args.gamma == "auto":
        gamma = "auto"
    elif args.gamma:
        values = _ints(args.gamma, "--gamma")
        gamma = values[0] if len(values) == 1 else tuple(values)
    return dict(
        method=method,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        gamma=gamma,
        proposer=args.proposer,
    )


# --- commands ----------------------------------------------------------------------------------


def cmd_generate(args: argparse.Namespace) -> int:
    from .report import aggregate_stats

    prompt = args.prompt
    if prompt is None:
        if sys.stdin.isatty():
            raise ConfigError("no prompt: give --prompt TEXT or pipe the prompt on stdin")
        prompt = sys.stdin.read()
    if args.n < 1:
        raise ConfigError("--n must be >= 1")
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    with load_ensemble(args) as ens:
        settings = generation_settings(args, len(ens.models))
        settings.update(max_tokens=args.max_tokens, stop=tuple(args.stop or ()), ignore_eos=args.ignore_eos, seed=seed)
        if args.json:
            completions = ens.generate_many(prompt, args.n, **settings)
            out = {
                "completions": [c.to_dict() for c in completions],
                "stats": {**aggregate_stats([c.stats for c in completions]), "seed": seed},
            }
            print(json.dumps(out))
            return 0
        completions = []
        if args.n == 1:
            stream = ens.stream(prompt, **settings)
            for piece in stream:
                sys.stdout.write(piece)
                sys.stdout.flush()
            sys.stdout.write("\n")
            assert stream.completion is not None
            completions.append(stream.completion)
        else:
            for i, c in enumerate(ens.generate_many(prompt, args.n, **settings)):
                if i:
                    sys.stdout.write("\n---\n")
                sys.stdout.write(c.text)
                completions.append(c)
            sys.stdout.write("\n")
        sys.stdout.flush()
        stats = aggregate_stats([c.stats for c in completions])
        print(_summary_line(stats, seed), file=sys.stderr)
    return 0


def _summary_line(stats: dict, seed: int | None) -> str:
    parts = [stats["method"], f"{stats['tokens']} tokens in {stats['seconds']:.2f}s"]
    if stats.get("tokens_per_second"):
        parts.append(f"{stats['tokens_per_second']:.1f} tok/s")
    if stats.get("proposed"):
        parts.append(f"acceptance {stats['acceptance_rate']:.0%}")
        parts.append(f"mean accepted {stats['mean_accepted']:.2f}")
    parts.append("calls " + "/".join(str(c) for c in stats["calls"]))
    if seed is not None:
        parts.append(f"seed {seed}")
    return "[localcos] " + " | ".join(parts)


def cmd_demo(args: argparse.Namespace) -> int:
    from .ensemble import Ensemble
    from .synthetic import SETS, ensure_set

    t0 = time.perf_counter()
    paths = ensure_set("demo", progress=lambda m: print(m, file=sys.stderr, flush=True))
    built = time.perf_counter() - t0
    if built > 1:
        print(f"built the demo models in {built:.1f}s", file=sys.stderr)
    prompt = args.prompt
    print(f"localcos demo: {SETS['demo'].description}", file=sys.stderr)
    print(f"prompt: {prompt!r}\n", file=sys.stderr)
    with Ensemble.load([str(p) for p in paths], n_ctx=1024) as ens:
        settings = dict(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed, ignore_eos=True)
        baseline = ens.generate(prompt, method="ensemble", **settings)
        stream = ens.stream(prompt, method="cos", **settings)
        for piece in stream:
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n\n")
        cos = stream.completion
        assert cos is not None
        print(f"ensemble: {baseline.stats.summary()}")
        print(f"cos:      {cos.stats.summary()}")
        if baseline.stats.tokens_per_second and cos.stats.tokens_per_second:
            ratio = cos.stats.tokens_per_second / baseline.stats.tokens_per_second
            print(f"cos is {ratio:.2f}x the speed of the standard ensemble, sampling from the same distribution")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from . import bench
    from .prompts import load_prompts
    from .synthetic import SETS, ensure_set

    if bool(args.models) == bool(args.synthetic):
        raise ConfigError("give either --models FILES or --synthetic SET")
    methods = _csv(args.methods)
    for m in methods:
        if m not in ("ensemble", "sd", "naive-cos", "cos"):
            raise ConfigError(f"unknown method {m!r} in --methods")
    gammas: list[int | str] = []
    for g in _csv(args.gamma):
        if g == "auto":
            gammas.append("auto")
        else:
            gammas.extend(_ints(g, "--gamma"))
    temperatures = _floats(args.temperature, "--temperature")
    try:
        prompts = load_prompts(args.prompts)
    except FileNotFoundError as e:
        raise ConfigError(str(e)) from None
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if args.limit_prompts:
        prompts = prompts[: args.limit_prompts]
    title = args.synthetic or ""
    if args.synthetic:
        if args.synthetic not in SETS:
            raise ConfigError(f"unknown synthetic set {args.synthetic!r}; choose from {', '.join(s for s in SETS if s != 'demo')}")
        if args.combine is None:
            args.combine = SETS[args.synthetic].combine
        paths = [str(p) for p in ensure_set(args.synthetic, progress=lambda m: print(m, file=sys.stderr, flush=True))]
    else:
        paths = _csv(args.models)
    if args.combine is None:
        args.combine = "we"
    rss_start = bench.current_rss_mb()
    with load_ensemble(args, paths) as ens:
        rss_loaded = bench.current_rss_mb()
        proposer = ens.cheapest() if args.proposer is None else args.proposer
        configs = bench.configurations(methods, gammas)
        console = Console(stderr=True)
        columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn()]
        with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as bar:
            task_id = bar.add_task("bench", total=None)

            def progress(done: int, total: int, what: str) -> None:
                bar.update(task_id, completed=done, total=total, description=what)

            with bench.RssSampler() as rss:
                runs = bench.run_benchmark(
                    ens,
                    prompts,
                    configs,
                    temperatures,
                    max_tokens=args.max_tokens,
                    repeat=args.repeat,
                    seed=args.seed if args.seed is not None else 0,
                    proposer=args.proposer,
                    progress=progress,
                )
        rows = bench.summarize(runs, proposer, len(ens.models))
        names = [p.rsplit("/", 1)[-1] for p in paths]
        tasks = sorted({t for t, _ in prompts})
        shown = rows if args.per_task else [r for r in rows if r.task == "all"]
        print(f"localcos bench: {', '.join(names)} | combine {ens.combiner.describe()} | proposer {names[proposer]} | "
              f"{len(prompts)} prompts ({', '.join(tasks)}) x {args.repeat} | max {args.max_tokens} tokens")
        print(bench.format_table(shown, names, f"{title} " if title else ""))
        peak = rss.peak
        sizes = sum(m.size_bytes for m in ens.models) / 2**20
        print(
            f"\nmemory: {rss_start:.0f} MiB before loading the models, {rss_loaded:.0f} MiB after, "
            f"peak while generating {peak:.0f} MiB (+{peak - rss_loaded:.0f} MiB; model weights {sizes:.0f} MiB)"
        )
        report = {
            "models": paths,
            "combiner": ens.combiner.describe(),
            "proposer": proposer,
            "settings": {
                "methods": methods,
                "gammas": gammas,
                "temperatures": temperatures,
                "max_tokens": args.max_tokens,
                "repeat": args.repeat,
                "prompts": len(prompts),
            },
            "machine": bench.machine(),
            "memory_mib": {"before_load": rss_start, "after_load": rss_loaded, "peak": peak, "weights": sizes},
            "summary": [asdict(r) for r in rows],
            "runs": [asdict(r) for r in runs],
        }
        if args.json:
            bench.write_json(args.json, report)
        if args.csv:
            bench.write_csv(args.csv, rows)
        if args.plot:
            bench.plot(args.plot, rows, title or "bench")
    return 0


def cmd_make_test_models(args: argparse.Namespace) -> int:
    from .testmodels import standard_test_models

    out = Path(args.dir)
    made = standard_test_models(out, vocab_size=args.vocab, dtype=args.dtype, progress=_info)
    for name, path in made.items():
        print(f"{name}\t{path}")
    return 0


# --- entry point -------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="localcos",
        description="Collaborative decoding of local GGUF models, made fast by speculation (CoS).",
    )
    parser.add_argument("--version", action="version", version=f"localcos {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("generate", help="generate text with an ensemble of models", description="Generate text with an ensemble of GGUF models.")
    add_model_options(p)
    p.add_argument("--prompt", "-p", default=None, help="raw prompt text (default: read stdin)")
    add_combine_options(p)
    add_method_options(p)
    add_sampling_options(p)
    g = p.add_argument_group("output")
    g.add_argument("--max-tokens", "-n-predict", type=int, default=128, help="tokens to generate at most (default 128)")
    g.add_argument("--stop", action="append", help="stop at this string (repeatable)")
    g.add_argument("--ignore-eos", action="store_true", help="never stop at end-of-generation tokens")
    g.add_argument("--n", type=int, default=1, help="independent completions of the prompt (default 1)")
    g.add_argument("--json", action="store_true", help="print one JSON object with completions and stats")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("demo", help="run a short CoS generation on built-in synthetic models", description="Build (once) a small synthetic pair and run the standard ensemble and CoS on it.")
    p.add_argument("--prompt", default="The small model writes a draft and the large model", help="prompt text")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser(
        "bench",
        help="compare ensemble, sd, naive-cos and cos side by side",
        description="Run the standard ensemble and the speculative methods interleaved on the same prompts and "
        "seeds, and print tokens/s, speedups, acceptance, calls per token, the measured cost ratio c and the "
        "speedup the CoS paper's cost model expects.",
    )
    g = p.add_argument_group("models")
    g.add_argument("--models", "-m", help="comma-separated GGUF files")
    g.add_argument("--synthetic", help="a built-in synthetic set: we-pair, cd-pair or we-triple (built once, cached)")
    g.add_argument("--ctx", type=int, default=2048, help="context length per model (default 2048)")
    g.add_argument("--n-gpu-layers", default="0", help="one value or one per model; -1 = all (default 0)")
    g.add_argument("--threads", type=int, default=None, help="CPU threads per model")
    g.add_argument("--verbose", action="store_true", help="show llama.cpp's own log lines")
    add_combine_options(p)
    p.set_defaults(combine=None)
    g = p.add_argument_group("what to compare")
    g.add_argument("--methods", default="ensemble,sd,naive-cos,cos", help="default: all four")
    g.add_argument("--gamma", default="1,3,5", help="proposal lengths to sweep, and/or auto (default 1,3,5)")
    g.add_argument("--proposer", type=int, default=None, help="index of the proposer (default: the cheapest model)")
    g.add_argument("--temperature", default="0,1", help="temperatures, comma-separated (default 0,1)")
    g.add_argument("--prompts", default="builtin", help="builtin, or a file of prompts separated by lines '---'")
    g.add_argument("--limit-prompts", type=int, default=None, help="use only the first N prompts")
    g.add_argument("--max-tokens", type=int, default=64, help="tokens per generation (default 64)")
    g.add_argument("--repeat", type=int, default=1, help="runs per prompt and setting (default 1)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--per-task", action="store_true", help="also print a table per task")
    g = p.add_argument_group("output")
    g.add_argument("--json", help="write every run and the summary as JSON")
    g.add_argument("--csv", help="write the summary as CSV")
    g.add_argument("--plot", help="write a PNG of speedup against gamma (needs matplotlib)")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("make-test-models", help="write synthetic GGUF test models into DIR", description="Write the synthetic test models (a base model, a sibling, a larger model, a different tokenizer, a padded vocabulary) into DIR.")
    p.add_argument("dir")
    p.add_argument("--vocab", type=int, default=2048, help="vocabulary size (default 2048; up to ~152k)")
    p.add_argument("--dtype", choices=("f32", "f16", "q8_0"), default="f32")
    p.set_defaults(func=cmd_make_test_models)

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    try:
        return args.func(args)
    except LocalcosError as e:
        return _fail(str(e))
    except KeyboardInterrupt:
        sys.stdout.flush()
        print("\ninterrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
