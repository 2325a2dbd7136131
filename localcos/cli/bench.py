"""`localcos bench`: the paper's comparison of ensemble, sd, naive-cos and cos, side by side."""

from __future__ import annotations

import argparse
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from collections.abc import Callable, Iterator

from ..core.level import Level
from ..core.sizes import largest
from ..errors import ConfigError
from ..tools.plotting import plot_speedups, require_matplotlib
from .options import add_options, loading_progress, resolve

DEFAULTS = {"ctx": 2048}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="compare ensemble, sd, naive-cos and cos side by side",
        description="Run the standard ensemble and the speculative methods interleaved on the same prompts and "
        "seeds, and print tokens/s, speedups, acceptance, calls per token, the measured cost ratio c and the "
        "speedup the CoS paper's cost model expects; and each configuration's speed as a fraction of the largest "
        "model decoding alone (/big: what the ensemble costs over the big model).",
    )
    add_options(p, ["models", "hardware", "combination", "level"], defaults=DEFAULTS, exclude={"parallel", "byte_gamma", "negative_prompt", "cfg_scale"})
    g = p.add_argument_group("what to compare")
    g.add_argument("--methods", default=None, help="default: all four (at the byte level: ensemble,cos)")
    g.add_argument("--alone", default="largest", help="models that also decode alone: largest (default), all, none, or indices (0,1)")
    g.add_argument("--gamma", dest="gammas", default=None, help="proposal lengths to sweep, and/or auto (default auto,1,3,5)")
    g.add_argument("--byte-gamma", dest="byte_gammas", default=None,
                   help="at the byte level (models of different tokenizers): cos draft lengths in bytes to sweep, and/or auto (default auto,8)")  # fmt: skip
    g.add_argument("--proposer", default=None, help="index of the proposer (default: the cheapest model)")
    g.add_argument("--temperature", dest="temperatures", default="0,1", help="temperatures, comma-separated (default 0,1)")
    g.add_argument("--prompts", default="builtin", help="builtin, or a file of prompts separated by lines '---'")
    g.add_argument("--limit-prompts", default=None, help="use only the first N prompts")
    g.add_argument("--max-tokens", default="64", help="tokens per generation (default 64; at the byte and mixed levels the lead model's tokens)")
    g.add_argument("--repeat", default="1", help="runs per prompt and setting (default 1)")
    g.add_argument("--seed", default="0", help="seed of the first run (default 0)")
    g.add_argument("--per-task", action="store_true", help="also print a table per task")
    g.add_argument(
        "--sequences", default=None, metavar="N,N",
        help="instead: aggregate tokens/s with this many sequences decoded together (e.g. 1,2,4,8), each method and gamma",
    )  # fmt: skip
    g = p.add_argument_group("output")
    g.add_argument("--json", help="write every run and the summary as JSON")
    g.add_argument("--csv", help="write the summary as CSV")
    g.add_argument("--plot", help="write a PNG of speedup against gamma (needs matplotlib)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..core.sizes import cheapest
    from ..ensemble import Ensemble, load_at
    from ..runtime.bytelevel import decoding_level
    from ..tools import bench

    if args.plot:
        require_matplotlib()
    settings = resolve(args, DEFAULTS)
    level = decoding_level(settings, also_given=["byte_gamma"] if args.byte_gammas is not None else [])  # the bench's own list
    if level.in_bytes:  # the byte level's bench (characters per second, each model alone on its own tokens) is its own: chosen here once
        return _bench_bytes(args, settings, level)
    settings, plan = _token_plan(args, settings)
    rss_start = bench.current_rss_mb()
    with load_at(settings.load, settings.combiner(), progress=loading_progress) as ens:
        assert isinstance(ens, Ensemble), "the token level's models, as decoding_level said"
        rss_loaded = bench.current_rss_mb()
        proposer = cheapest(ens.n_params) if plan.proposer is None else plan.proposer
        big = largest(ens.n_params)
        alone = [big] if plan.members == "largest" else plan.members
        configs = bench.configurations(plan.methods, plan.gammas, members=[] if plan.levels else alone)
        names = [Path(p).name for p in settings.load.paths]
        with _progress_bar() as progress, bench.RssSampler() as rss:
            if plan.levels:
                throughput = bench.run_throughput(ens, plan.prompts, configs, plan.temperatures, plan.levels, max_tokens=plan.max_tokens,
                                                  rounds=plan.repeat, seed=plan.seed, proposer=proposer, progress=progress)  # fmt: skip
            else:
                runs = bench.run_benchmark(ens, plan.prompts, configs, plan.temperatures, max_tokens=plan.max_tokens, repeat=plan.repeat,
                                           seed=plan.seed, proposer=proposer, progress=progress)  # fmt: skip
        if plan.levels:
            print(
                f"localcos bench: {', '.join(names)} | combine {ens.combiner.description} | sequences decoded together: "
                f"{', '.join(map(str, plan.levels))} | {len(plan.prompts)} prompts in turn | max {plan.max_tokens} tokens | {plan.repeat} pass(es)"
            )
            print(bench.format_throughput(throughput, names))
            if args.json:
                bench.write_json(args.json, {"machine": bench.machine(), "throughput": [asdict(r) for r in throughput]})
            return 0
        _report_runs(args, settings, plan, ens, runs, names, proposer, big, alone, (rss_start, rss_loaded, rss.peak))
    return 0


@dataclass(frozen=True)
class _TokenPlan:
    """What the token-level bench runs, read from its options before anything loads."""

    methods: list[str]
    gammas: list[int | str]
    temperatures: list[float]
    max_tokens: int
    repeat: int
    seed: int
    prompts: list[tuple[str, str]]
    levels: list[int] | None  # sequences decoded together (--sequences), or None
    members: list[int] | str  # the models alone beside, or "largest"
    proposer: int | None


def _token_plan(args: argparse.Namespace, settings):
    """The settings (with the sequences --sequences needs) and the plan of the token-level bench;
    every generation's rules checked before anything loads."""
    from dataclasses import replace

    from ..config import GenerationConfig, check_for_models
    from ..config.parse import parse_choice, parse_gamma, parse_int, parse_ints
    from ..core.decoding import METHODS

    methods = [parse_choice(m, "--methods", METHODS) for m in (args.methods or "ensemble,sd,naive-cos,cos").split(",")]
    gammas: list[int | str] = []
    for g in (args.gammas or "auto,1,3,5").split(","):
        gamma = parse_gamma(g)
        if isinstance(gamma, tuple):  # cannot happen for one item; keeps the types honest
            raise ConfigError(f"--gamma sweeps single values, got {g!r}", param="gamma")
        gammas.append(gamma)  # type: ignore[arg-type]
    temperatures, max_tokens, repeat, seed, prompts = _common(args)
    levels = sorted(set(parse_ints(args.sequences, "--sequences", minimum=1))) if args.sequences else None
    if levels:
        settings = replace(settings, load=replace(settings.load, parallel=max(levels)))
    n_models = len(settings.load.paths)
    members = _members(args.alone, n_models)
    proposer = parse_int(args.proposer, "--proposer", minimum=0) if args.proposer is not None else None
    for method in methods:
        check_for_models(GenerationConfig(method=method, proposer=proposer), n_models)
    return settings, _TokenPlan(methods, gammas, temperatures, max_tokens, repeat, seed, prompts, levels, members, proposer)


@contextmanager
def _progress_bar() -> Iterator[Callable[[int, int, str], None]]:
    """A progress bar on stderr (where it is a terminal) and the callback that moves it."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    console = Console(stderr=True)
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as bar:
        task_id = bar.add_task("bench", total=None)

        def progress(done: int, total: int, what: str) -> None:
            bar.update(task_id, completed=done, total=total, description=what)

        yield progress


def _report_runs(args: argparse.Namespace, settings, plan: _TokenPlan, ens, runs, names: list[str], proposer: int, big: int, alone: list[int],
                 memory: tuple[float, float, float]) -> None:  # fmt: skip
    """The bench's table, its notes (timing noise, call costs, memory), --json, --csv, --plot."""
    from ..models.weights import type_name
    from ..runtime.profile import advice, cpu_name, describe
    from ..tools import bench

    rss_start, rss_loaded, peak = memory
    rows = bench.summarize(runs, proposer, len(names), largest_model=big)
    tasks = sorted({t for t, _ in plan.prompts})
    shown = rows if args.per_task else [r for r in rows if r.task == "all"]
    print(
        f"localcos bench: {', '.join(names)} | combine {ens.combiner.description} | proposer {names[proposer]} | "
        f"{len(plan.prompts)} prompts ({', '.join(tasks)}) x {plan.repeat} | max {plan.max_tokens} tokens"
    )
    print(bench.format_table(shown, names, f"{settings.name} "))
    if alone:
        print(f"\nalone-I: model I decoding by itself ({', '.join(f'{i} = {names[i]}' for i in alone)}); "
              f"/big: tokens/s as a fraction of the largest model alone ({names[big]})")
    noise = sorted(bench.timing_noise(runs))
    if noise:
        print(
            f"\ntiming noise: the ensemble ran each prompt twice (before and after the others); the two runs "
            f"differ by {noise[len(noise) // 2]:.1%} in the median, {noise[-1]:.1%} at most. Speedups use both."
        )
    print(f"\nbatched calls on this machine ({cpu_name()}, {ens.models[0].n_threads} threads), from the models' profiles:")
    for name, model, profile in zip(names, ens.models, ens.profiles):
        print(f"  {name}: {describe(profile)}")
        file_type = model.meta("general.file_type") or ""
        tip = advice((type_name(int(file_type)) if file_type.isdigit() else None) or "?", profile)
        if tip:
            print(f"    {tip}")
    sizes = sum(m.size_bytes for m in ens.models) / 2**20
    print(
        f"\nmemory: {rss_start:.0f} MiB before loading the models, {rss_loaded:.0f} MiB after, "
        f"peak while generating {peak:.0f} MiB (+{peak - rss_loaded:.0f} MiB; model weights {sizes:.0f} MiB)"
    )
    report = {
        "models": [str(p) for p in settings.load.paths],
        "combiner": ens.combiner.description,
        "proposer": proposer,
        "settings": {"methods": plan.methods, "gammas": plan.gammas, "temperatures": plan.temperatures, "max_tokens": plan.max_tokens,
                     "repeat": plan.repeat, "prompts": len(plan.prompts)},  # fmt: skip
        "machine": bench.machine(),
        "memory_mib": {"before_load": rss_start, "after_load": rss_loaded, "peak": peak, "weights": sizes},
        "timing_noise": noise,
        "summary": [asdict(r) for r in rows],
        "runs": [r.to_dict() for r in runs],
    }
    if args.json:
        bench.write_json(args.json, report)
    if args.csv:
        bench.write_csv(args.csv, rows)
    if args.plot:
        plot_speedups(args.plot, rows, settings.name or "bench")


def _common(args: argparse.Namespace):
    """The options every bench reads: temperatures, length, repeats, seed, prompts."""
    from ..config import OPTIONS
    from ..config.parse import parse_int
    from ..tools.prompts import load_prompts

    temperatures = [OPTIONS["temperature"].check(t) for t in args.temperatures.split(",")]
    max_tokens = OPTIONS["max_tokens"].check(args.max_tokens)
    repeat = parse_int(args.repeat, "--repeat", minimum=1)
    seed = parse_int(args.seed, "--seed", minimum=0)
    limit = parse_int(args.limit_prompts, "--limit-prompts", minimum=1) if args.limit_prompts is not None else None
    try:
        prompts = load_prompts(args.prompts)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(str(e), param="prompts") from None
    return temperatures, max_tokens, repeat, seed, prompts[:limit] if limit else prompts


def _bench_bytes(args: argparse.Namespace, settings, level: Level) -> int:
    """The bench at the byte level: the byte-level ensemble and cos at each --byte-gamma, and the
    largest model alone (its own token path), in characters per second."""
    import json

    from ..config import OPTIONS, default_method
    from ..config.parse import parse_choice
    from ..ensemble import Ensemble, load_at
    from ..files import write_text
    from ..runtime.bytelevel import ByteModels
    from ..runtime.profile import cpu_name, describe
    from ..tools import bench, bytebench

    refused = [(args.gammas is not None, "gamma", "--gamma counts tokens; at the byte level drafts are counted in bytes: --byte-gamma N,N"),
               (args.sequences is not None, "sequences", "--sequences: the byte level decodes one generation at a time"),
               (args.proposer is not None, "proposer", "--proposer: at the byte level the models take turns proposing (cos)"),
               (args.plot is not None or args.csv is not None, "plot", "--plot and --csv: not available at the byte level yet; --json is"),
               (args.per_task, "per_task", "--per-task: not available at the byte level yet")]  # fmt: skip
    for bad, param, message in refused:
        if bad:
            raise ConfigError(message, param=param)
    # where the level's default method is the ensemble's step (the mixed level's), that alone
    default_methods = "ensemble" if default_method(len(settings.load.paths), level) == "ensemble" else "ensemble,cos"
    methods = [parse_choice(m, "--methods", ("ensemble", "cos")) for m in (args.methods or default_methods).split(",")]
    gammas = [OPTIONS["byte_gamma"].check(g) for g in (args.byte_gammas or "auto,8").split(",")]
    temperatures, max_tokens, repeat, seed, prompts = _common(args)
    prompts = [p for p in prompts for _ in range(repeat)]
    with load_at(settings.load, settings.combiner(), progress=loading_progress) as models:
        assert isinstance(models, ByteModels), "the byte level's models, as decoding_level said"
        n_models = len(models.models)
        members = _members(args.alone, n_models)
        alone_ids = [largest([m.n_params for m in models.models])] if isinstance(members, str) else list(members)
        alone = {i: Ensemble.beside(models, i) for i in alone_ids}
        configs = bytebench.byte_configurations(methods, gammas, alone_ids)
        runs = bytebench.run_byte_benchmark(models, alone, prompts, configs, temperatures, max_tokens=max_tokens, seed=seed)
        names = [Path(p).name for p in settings.load.paths]
        rows = bytebench.summarize_bytes(runs)
        print(f"localcos bench ({level.value} level): {', '.join(names)} | combine {models.combiner.description} | {len(prompts)} prompts | "
              f"max {max_tokens} tokens | --byte-paths {settings.load.byte_paths}, --byte-prune {settings.load.byte_prune:g} | {cpu_name()}")  # fmt: skip
        print(bytebench.format_byte_table(rows, names))
        if alone_ids:
            print(f"\nalone-I: model I on its own token path ({', '.join(f'{i} = {names[i]}' for i in alone_ids)}); same text: the "
                  "prompts where it wrote the ensemble's very text, x ens there: its speed there against the ensemble's")  # fmt: skip
        for r in rows:
            if r.same_text and r.vs_ensemble_there:
                print(f"the {level.value} level, where {r.config} wrote the same text ({r.same_text} of {len(prompts)} prompts at T={r.temperature:g}): "
                      f"{1 / r.vs_ensemble_there:.2f}x its speed")  # fmt: skip
        noise = sorted(bytebench.timing_noise(runs))
        if noise:
            print(f"\ntiming noise: the ensemble ran each prompt twice (before and after the others); the two runs differ by "
                  f"{noise[len(noise) // 2]:.1%} in the median, {noise[-1]:.1%} at most. Ratios use both.")  # fmt: skip
        print("\nbatched calls on this machine, from the models' profiles (what --byte-gamma auto plans with):")
        for name, profile in zip(names, models.costs.profiles):
            print(f"  {name}: {describe(profile)}")
    if args.json:
        report = {"models": [str(p) for p in settings.load.paths], "level": level.value, "machine": bench.machine(),
                  "summary": [r.__dict__ for r in rows], "runs": [r.to_dict() for r in runs]}  # fmt: skip
        write_text(args.json, json.dumps(report, indent=1))
    return 0


def _members(value: str, n_models: int) -> list[int] | str:
    """--alone: which models also decode alone ("largest": known once the models are loaded)."""
    from ..config.parse import parse_ints

    text = value.strip()
    if text == "none":
        return []
    if text == "all":
        return list(range(n_models))
    if text == "largest":
        return text
    members = list(parse_ints(text, "--alone", minimum=0))
    if any(m >= n_models for m in members):
        raise ConfigError(f"--alone takes model indices from 0 to {n_models - 1}, got {value!r}", param="alone")
    return members
