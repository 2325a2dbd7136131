"""The `localcos` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from . import __version__
from .errors import ConfigError, LocalcosError

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
METHOD_CHOICES = ("ensemble", "sd", "naive-cos", "cos")
SYNTHETIC_DTYPES = ("f32", "f16", "bf16", "q8_0", "q4_0")  # testmodels' weight types (kept here: no gguf import at start-up)


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


def _note(message: str) -> None:
    print(f"localcos: {message}", file=sys.stderr, flush=True)


# --- shared option groups ----------------------------------------------------------------------


def add_model_options(p: argparse.ArgumentParser, *, synthetic: bool = False) -> None:
    g = p.add_argument_group("models")
    g.add_argument(
        "--models", "-m", help="comma-separated models in ensemble order: GGUF paths, names from models.toml, or hf:OWNER/REPO/FILE"
    )
    g.add_argument("--preset", help="a named ensemble from models.toml: its models, combiner, method and gamma")
    if synthetic:
        g.add_argument("--synthetic", help="a built-in synthetic set: we-pair, cd-pair, we-triple, we-pair-152k (built once, cached)")
        g.add_argument(
            "--synthetic-dtype",
            choices=SYNTHETIC_DTYPES,
            default=None,
            help="weight type of the synthetic set (default bf16: the cheapest batched verification on CPUs with BF16 instructions)",
        )
    g.add_argument("--config", help="an extra models.toml (merged over the built-in and your own)")
    g.add_argument("--ctx", type=int, default=4096, help="context length per model (default 4096)")
    g = p.add_argument_group("hardware")
    g.add_argument(
        "--n-gpu-layers",
        default=None,
        help="layers to offload to the GPU: one value or one per model; -1 = all (default: models.toml, else 0)",
    )
    g.add_argument("--main-gpu", type=int, default=0, help="GPU for the whole model when not splitting (default 0)")
    g.add_argument("--split-mode", choices=("none", "layer", "row"), default="layer", help="how to split across GPUs")
    g.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto", help="flash attention (default auto)")
    g.add_argument("--threads", type=int, default=None, help="CPU threads per model (default: physical cores)")
    g.add_argument("--verbose", action="store_true", help="show llama.cpp's own log lines")


def add_combine_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("combination (how the models' distributions are combined)")
    g.add_argument("--combine", default=None, help="we (weighted ensemble), cd (contrastive), logit-mix, or FILE.py:FUNCTION (default we)")
    g.add_argument("--weights", help="we / logit-mix weights, one per model (default: equal)")
    g.add_argument("--mu", type=float, default=None, help="cd: amateur weight mu (default 0.1)")
    g.add_argument("--plausibility", type=float, default=None, help="cd: plausibility threshold alpha (default off)")
    g.add_argument("--expert", type=int, default=None, help="cd: index of the expert model (default: the larger)")
    g.add_argument("--combine-level", choices=("logits", "probs"), default="logits", help="custom combiner: what FUNCTION receives")


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
        choices=METHOD_CHOICES,
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


# --- from arguments to an ensemble -------------------------------------------------------------


@dataclass
class Setup:
    """What the model options resolve to."""

    paths: list[Path]
    refs: list[str]
    n_gpu_layers: list[int]
    chat_template_model: int | None = None


def resolve_setup(args: argparse.Namespace) -> Setup:
    """Resolve --models / --preset through models.toml (downloading hub files if needed) and fill
    the options a preset sets but the command line left open."""
    from .registry import Registry

    registry = Registry.load(getattr(args, "config", None))
    preset = None
    if getattr(args, "preset", None):
        preset = registry.ensembles.get(args.preset)
        if preset is None:
            raise ConfigError(f"unknown preset {args.preset!r}; see `localcos models list`")
    if args.models and preset:
        raise ConfigError("give either --models or --preset, not both")
    refs = list(preset.models) if preset else _csv(args.models or "")
    if not refs:
        raise ConfigError("no models: give --models A,B or --preset NAME")
    if preset:
        for key in ("combine", "mu", "plausibility", "expert", "method"):
            if getattr(args, key, None) is None and getattr(preset, key) is not None:
                setattr(args, key, getattr(preset, key))
        if getattr(args, "weights", None) is None and preset.weights is not None:
            args.weights = ",".join(str(w) for w in preset.weights)
        if getattr(args, "gamma", None) is None and preset.gamma is not None:
            g = preset.gamma
            args.gamma = g if isinstance(g, str) else ",".join(str(x) for x in (g if isinstance(g, tuple) else (g,)))
    paths = []
    for i, ref in enumerate(refs):
        if len(refs) > 1:
            _info(f"model {i + 1}/{len(refs)}: {ref}")
        paths.append(registry.resolve(ref))
    if args.n_gpu_layers is not None:
        layers = _ints(args.n_gpu_layers, "--n-gpu-layers")
        if len(layers) == 1:
            layers = layers * len(refs)
        if len(layers) != len(refs):
            raise ConfigError(f"got {len(layers)} --n-gpu-layers values for {len(refs)} models")
    else:
        layers = [(registry.models[r].n_gpu_layers or 0) if r in registry.models else 0 for r in refs]
    chat_model = None
    if preset and preset.chat_template:
        chat_model = list(preset.models).index(preset.chat_template)
    return Setup(paths, refs, layers, chat_model)


def build_combiner(args: argparse.Namespace):
    from .combiners import make_combiner

    weights = _floats(args.weights, "--weights") if args.weights else None
    return make_combiner(
        args.combine or "we",
        weights=weights,
        mu=0.1 if args.mu is None else args.mu,
        plausibility=args.plausibility,
        expert=args.expert,
        level=args.combine_level,
    )


def load_ensemble(args: argparse.Namespace, setup: Setup):
    import llama_cpp

    from .backend import set_verbose
    from .ensemble import Ensemble

    if args.verbose:
        set_verbose(True)
    split = {"none": llama_cpp.LLAMA_SPLIT_MODE_NONE, "layer": llama_cpp.LLAMA_SPLIT_MODE_LAYER, "row": llama_cpp.LLAMA_SPLIT_MODE_ROW}
    return Ensemble.load(
        setup.paths,
        build_combiner(args),
        n_ctx=args.ctx,
        n_gpu_layers=setup.n_gpu_layers,
        n_threads=args.threads,
        main_gpu=args.main_gpu,
        split_mode=split[args.split_mode],
        flash_attn={"auto": None, "on": True, "off": False}[args.flash_attn],
        progress=lambda i, n, name: _info(f"loading {name} ({i + 1}/{n})"),
    )


def generation_settings(args: argparse.Namespace, n_models: int) -> dict:
    method = args.method or ("cos" if n_models > 1 else "ensemble")
    gamma: int | tuple[int, ...] | str | None = None
    if args.gamma == "auto":
        gamma = "auto"
    elif args.gamma:
        values = _ints(str(args.gamma), "--gamma")
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
    setup = resolve_setup(args)
    with load_ensemble(args, setup) as ens:
        if args.chat:
            from .chat import ChatFormatter, Message

            template_model = args.chat_template_model if args.chat_template_model is not None else (setup.chat_template_model or 0)
            formatter = ChatFormatter(ens, template_model)
            if formatter.note:
                _note(formatter.note)
            messages = ([Message("system", args.system)] if args.system else []) + [Message("user", prompt)]
            prompt_input: str | list[int] = formatter.tokens(messages)
        else:
            if args.system:
                raise ConfigError("--system needs --chat")
            prompt_input = prompt
        settings = generation_settings(args, len(ens.models))
        settings.update(max_tokens=args.max_tokens, stop=tuple(args.stop or ()), ignore_eos=args.ignore_eos, seed=seed)
        if args.json:
            completions = ens.generate_many(prompt_input, args.n, **settings)
            out = {
                "completions": [c.to_dict() for c in completions],
                "stats": {**aggregate_stats([c.stats for c in completions]), "seed": seed},
            }
            print(json.dumps(out))
            return 0
        completions = []
        if args.n == 1:
            stream = ens.stream(prompt_input, **settings)
            for piece in stream:
                sys.stdout.write(piece)
                sys.stdout.flush()
            sys.stdout.write("\n")
            assert stream.completion is not None
            completions.append(stream.completion)
        else:
            for i, c in enumerate(ens.generate_many(prompt_input, args.n, **settings)):
                if i:
                    sys.stdout.write("\n---\n")
                sys.stdout.write(c.text)
                completions.append(c)
            sys.stdout.write("\n")
        sys.stdout.flush()
        print(_summary_line(aggregate_stats([c.stats for c in completions]), seed), file=sys.stderr)
    return 0


def _summary_line(stats: dict, seed: int | None) -> str:
    parts = [stats["method"], f"{stats['tokens']} tokens in {stats['seconds']:.2f}s"]
    if stats.get("tokens_per_second"):
        parts.append(f"{stats['tokens_per_second']:.1f} tok/s")
    if stats.get("acceptance_rate") is not None:
        parts.append(f"acceptance {stats['acceptance_rate']:.0%}")
        parts.append(f"mean accepted {stats['mean_accepted']:.2f}")
    parts.append("calls " + "/".join(str(c) for c in stats["calls"]))
    if stats["method"] != "ensemble" and stats.get("speedup_estimate"):
        parts.append(f"~{stats['speedup_estimate']:.2f}x the ensemble (est.)")
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
        ens.generate(prompt, method="ensemble", max_tokens=4, ignore_eos=True)  # warm up
        baseline = ens.generate(prompt, method="ensemble", **settings)
        stream = ens.stream(prompt, method="cos", **settings)
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


def cmd_bench(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from . import bench
    from .prompts import load_prompts
    from .synthetic import SETS, ensure_set

    chosen = [x for x in (args.models, args.preset, args.synthetic) if x]
    if len(chosen) != 1:
        raise ConfigError("give one of --models FILES, --preset NAME or --synthetic SET")
    methods = _csv(args.methods)
    for m in methods:
        if m not in METHOD_CHOICES:
            raise ConfigError(f"unknown method {m!r} in --methods")
    gammas: list[int | str] = []
    for g in _csv(args.gamma):
        gammas.extend(["auto"] if g == "auto" else _ints(g, "--gamma"))
    temperatures = _floats(args.temperature, "--temperature")
    try:
        prompts = load_prompts(args.prompts)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(str(e)) from None
    if args.limit_prompts:
        prompts = prompts[: args.limit_prompts]
    title = args.synthetic or args.preset or ""
    if args.synthetic:
        if args.synthetic not in SETS or args.synthetic == "demo":
            raise ConfigError(f"unknown synthetic set {args.synthetic!r}; choose from {', '.join(s for s in SETS if s != 'demo')}")
        if args.combine is None:
            args.combine = SETS[args.synthetic].combine
        paths = ensure_set(args.synthetic, progress=lambda m: print(m, file=sys.stderr, flush=True), dtype=args.synthetic_dtype)
        layers = _ints(args.n_gpu_layers, "--n-gpu-layers") if args.n_gpu_layers else [0]
        setup = Setup(paths, [str(p) for p in paths], layers * len(paths) if len(layers) == 1 else layers)
    else:
        setup = resolve_setup(args)
    rss_start = bench.current_rss_mb()
    with load_ensemble(args, setup) as ens:
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
        names = [Path(p).name for p in setup.paths]
        tasks = sorted({t for t, _ in prompts})
        shown = rows if args.per_task else [r for r in rows if r.task == "all"]
        print(
            f"localcos bench: {', '.join(names)} | combine {ens.combiner.describe()} | proposer {names[proposer]} | "
            f"{len(prompts)} prompts ({', '.join(tasks)}) x {args.repeat} | max {args.max_tokens} tokens"
        )
        print(bench.format_table(shown, names, f"{title} " if title else ""))
        sizes = sum(m.size_bytes for m in ens.models) / 2**20
        print(
            f"\nmemory: {rss_start:.0f} MiB before loading the models, {rss_loaded:.0f} MiB after, "
            f"peak while generating {rss.peak:.0f} MiB (+{rss.peak - rss_loaded:.0f} MiB; model weights {sizes:.0f} MiB)"
        )
        report = {
            "models": [str(p) for p in setup.paths],
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
            "memory_mib": {"before_load": rss_start, "after_load": rss_loaded, "peak": rss.peak, "weights": sizes},
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


def cmd_models(args: argparse.Namespace) -> int:
    from .registry import Registry

    registry = Registry.load(args.config)
    if args.action == "list":
        return _models_list(registry)
    if args.action == "pull":
        if not args.names:
            raise ConfigError("name the models or ensembles to pull")
        for name in args.names:
            refs = list(registry.ensembles[name].models) if name in registry.ensembles else [name]
            for ref in refs:
                print(f"{ref}\t{registry.resolve(ref)}")
        return 0
    if args.action == "info":
        if len(args.names) != 1:
            raise ConfigError("models info takes one FILE or NAME")
        return _models_info(registry.resolve(args.names[0], download=False))
    if args.action == "check":
        refs = [r for name in args.names for r in _csv(name)]
        if len(refs) < 2:
            raise ConfigError("models check takes two or more models: A,B[,C]")
        return _models_check([registry.resolve(r, download=False) for r in refs])
    raise ConfigError(f"unknown action {args.action}")


def _models_list(registry) -> int:
    rows = []
    for m in registry.models.values():
        path = registry.cached(m.name)
        size = f"{path.stat().st_size / 2**30:.2f} GiB" if path else "-"
        rows.append((m.name, "yes" if path else "no", size, m.where))
    width = max(len(r[0]) for r in rows) if rows else 4
    print(f"{'model':<{width}}  {'cached':<6}  {'size':>9}  source")
    for name, cached, size, where in rows:
        print(f"{name:<{width}}  {cached:<6}  {size:>9}  {where}")
    if registry.ensembles:
        print()
        width = max(len(e) for e in registry.ensembles)
        print(f"{'ensemble (--preset)':<{max(width, 19)}}  models")
        for e in registry.ensembles.values():
            ready = all(registry.cached(m) for m in e.models if m in registry.models)
            extra = f"{e.combine}, {e.method or 'cos'}" + ("" if ready else ", not all cached")
            print(f"{e.name:<{max(width, 19)}}  {' + '.join(e.models)}  ({extra})")
    print(f"\nfrom {', '.join(registry.files)}")
    return 0


def _models_info(path: Path) -> int:
    from .ggufinfo import read_info

    info = read_info(path)
    lines = [
        ("file", str(info.path)),
        ("name", info.name),
        ("architecture", info.architecture),
        ("parameters", f"{info.n_params / 1e9:.3f} B" if info.n_params >= 1e8 else f"{info.n_params / 1e6:.2f} M"),
        ("quantization", f"{info.quantization} ({', '.join(f'{k} {v / info.n_params:.0%}' for k, v in info.tensor_types.most_common(3))})"),
        ("size", f"{info.size_bytes / 2**20:.1f} MiB"),
        ("context length", str(info.context_length)),
        ("vocabulary", f"{info.vocab_size} tokens ({info.metadata.get('tokenizer.ggml.model', '?')})"),
        ("tokenizer", f"fingerprint {info.tokenizer_fingerprint}, BOS {info.metadata.get('tokenizer.ggml.bos_token_id')}, EOS {info.metadata.get('tokenizer.ggml.eos_token_id')}"),
        ("chat template", "yes" if info.chat_template else "no"),
        ("GGUF version", str(info.version)),
    ]
    for k, v in lines:
        print(f"{k:<15} {v}")
    return 0


def _models_check(paths: list[Path]) -> int:
    from .backend import Model, shared_vocab_size
    from .errors import TokenizerMismatchError

    models = [Model(p, vocab_only=True) for p in paths]
    try:
        shared = shared_vocab_size(models)
    except TokenizerMismatchError as e:
        print(f"not compatible: {e}")
        return 1
    finally:
        for m in models:
            m.close()
    sizes = ", ".join(f"{m.name} {m.n_vocab}" for m in models)
    padded = [m.name for m in models if m.n_vocab > shared]
    print(f"compatible: one tokenizer, shared vocabulary {shared} tokens ({sizes})")
    if padded:
        print(f"  {', '.join(padded)} pad their vocabulary; logits above id {shared - 1} are ignored")
    return 0


def cmd_make_test_models(args: argparse.Namespace) -> int:
    from .testmodels import standard_test_models

    out = Path(args.dir)
    made = standard_test_models(out, vocab_size=args.vocab, dtype=args.dtype, progress=_info)
    for name, path in made.items():
        print(f"{name}\t{path}")
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    try:
        from tui.app import run_chat
    except ImportError as e:  # the package was installed without its tui
        raise ConfigError(f"the chat interface is not installed ({e})") from None
    return run_chat(args)


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
    p.add_argument("--prompt", "-p", default=None, help="prompt text (default: read stdin); raw text unless --chat")
    g = p.add_argument_group("chat")
    g.add_argument("--chat", action="store_true", help="format the prompt as a user message with the models' chat template")
    g.add_argument("--system", help="system message (with --chat)")
    g.add_argument("--chat-template-model", type=int, default=None, help="index of the model whose chat template is used (default 0)")
    add_combine_options(p)
    add_method_options(p)
    add_sampling_options(p)
    g = p.add_argument_group("output")
    g.add_argument("--max-tokens", "-n-predict", type=int, default=128, help="tokens to generate at most (default 128)")
    g.add_argument("--stop", action="append", help="stop at this string (repeatable)")
    g.add_argument("--ignore-eos", action="store_true", help="never stop at (or sample) end-of-generation tokens")
    g.add_argument("--n", type=int, default=1, help="independent completions of the prompt (default 1)")
    g.add_argument("--json", action="store_true", help="print one JSON object with completions and stats")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("chat", help="chat with an ensemble in the terminal", description="A terminal chat with an ensemble of models, showing speculation at work.")
    add_model_options(p)
    p.add_argument("--demo", action="store_true", help="chat with the built-in synthetic demo pair")
    p.add_argument("--system", help="system message")
    p.add_argument("--chat-template-model", type=int, default=None, help="index of the model whose chat template is used")
    add_combine_options(p)
    add_method_options(p)
    add_sampling_options(p, temperature=0.7)
    p.add_argument("--max-tokens", type=int, default=512, help="tokens per reply at most (default 512)")
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser(
        "bench",
        help="compare ensemble, sd, naive-cos and cos side by side",
        description="Run the standard ensemble and the speculative methods interleaved on the same prompts and "
        "seeds, and print tokens/s, speedups, acceptance, calls per token, the measured cost ratio c and the "
        "speedup the CoS paper's cost model expects.",
    )
    add_model_options(p, synthetic=True)
    p.set_defaults(ctx=2048)
    add_combine_options(p)
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

    p = sub.add_parser(
        "models",
        help="list, download, inspect and check models",
        description="list: the models and ensembles of models.toml; pull NAME...: download them; "
        "info FILE|NAME: what a GGUF file is (read from its header); check A,B[,C]: can these models form an ensemble?",
    )
    p.add_argument("action", choices=("list", "pull", "info", "check"))
    p.add_argument("names", nargs="*", help="model names, ensemble names, paths or hf:OWNER/REPO/FILE")
    p.add_argument("--config", help="an extra models.toml")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("demo", help="run a short CoS generation on built-in synthetic models", description="Build (once) a small synthetic pair and run the standard ensemble and CoS on it.")
    p.add_argument("--prompt", default="The small model writes a draft and the large model", help="prompt text")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser(
        "make-test-models",
        help="write synthetic GGUF test models into DIR",
        description="Write the synthetic test models (a base model, a sibling, a larger model, a different tokenizer, a padded vocabulary) into DIR.",
    )
    p.add_argument("dir")
    p.add_argument("--vocab", type=int, default=2048, help="vocabulary size (default 2048; up to ~152k)")
    p.add_argument("--dtype", choices=SYNTHETIC_DTYPES, default="f32", help="weight type (default f32)")
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
