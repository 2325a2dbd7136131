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
    g.add_argument("--methods", default=None,
                   help="default: every method the level decodes (all four; at the byte level ensemble,cos; at the mixed level ensemble)")  # fmt: skip
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
    g.add_argument("--per-task", action="store_true", help="also a table per task (in --json and --csv too)")
    g.add_argument(
        "--sequences", default=None, metavar="N,N",
        help="instead: aggregate tokens/s with this many sequences decoded together (e.g. 1,2,4,8), each method and gamma",
    )  # fmt: skip
    g = p.add_argument_group("output")
    g.add_argument("--json", help="write every run and the summary as JSON")
    g.add_argument("--csv", help="write the summary as CSV")
    g.add_argument("--plot", help="write a PNG of speedup against gamma (needs matplotlib)")
    p.set_defaults(func=run)


# what each level's draft length sweeps where none is given (`Level.draft_length` names the setting)
DRAFT_SWEEPS = {"gamma": "auto,1,3,5", "byte_gamma": "auto,8"}


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from ..config.parse import parse_ints
    from ..ensemble import load_at
    from ..config.levels import decoding_level
    from ..tools import bench

    if args.plot:
        require_matplotlib()
    settings = resolve(args, DEFAULTS)
    sequences = sorted(set(parse_ints(args.sequences, "--sequences", minimum=1))) if args.sequences else None
    if sequences:  # the sequences decoded together are the models' parallel
        settings = replace(settings, load=replace(settings.load, parallel=max(sequences)))
    given = [name for name, value in _drafts(args).items() if value is not None]  # the bench's own options
    level = decoding_level(settings, also_given=given, parallel_flag="--sequences")
    plan = _plan(args, settings, level, sequences)
    rss_start = bench.current_rss_mb()
    models = load_at(settings.load, settings.combiner(), progress=loading_progress)
    with models:
        rss_loaded = bench.current_rss_mb()
        names = [Path(p).name for p in settings.load.paths]
        if plan.sequences:
            configs = bench.configurations(plan.methods, plan.gammas)
            with _progress_bar() as progress:
                throughput = bench.run_throughput(models, plan.prompts, configs, plan.temperatures, plan.sequences, max_tokens=plan.max_tokens,
                                                  rounds=plan.repeat, seed=plan.seed, proposer=plan.proposer, progress=progress)  # fmt: skip
            print(
                f"localcos bench: {', '.join(names)} | combine {models.combiner.description} | sequences decoded together: "
                f"{', '.join(map(str, plan.sequences))} | {len(plan.prompts)} prompts in turn | max {plan.max_tokens} tokens | {plan.repeat} pass(es)"
            )
            print(bench.format_throughput(throughput, names))
            if args.json:
                bench.write_json(args.json, {"machine": bench.machine(), "throughput": [asdict(r) for r in throughput]})
            return 0
        big = largest(models.n_params)
        alone = [big] if isinstance(plan.members, str) else plan.members  # "largest"
        configs = bench.configurations(plan.methods, plan.gammas, members=alone)
        with _progress_bar() as progress, bench.RssSampler() as rss:
            runs = bench.run_benchmark(models, plan.prompts, configs, plan.temperatures, max_tokens=plan.max_tokens, repeat=plan.repeat,
                                       seed=plan.seed, proposer=plan.proposer, progress=progress)  # fmt: skip
        _report_runs(args, settings, plan, models, runs, names, big, alone, (rss_start, rss_loaded, rss.peak))
    return 0


def _drafts(args: argparse.Namespace) -> dict[str, str | None]:
    """The draft lengths given, by the setting each is (gamma: tokens; byte_gamma: bytes)."""
    return {"gamma": args.gammas, "byte_gamma": args.byte_gammas}


@dataclass(frozen=True)
class _Plan:
    """What the bench runs, read from its options before anything loads."""

    methods: list[str]
    gammas: list[int | str]  # draft lengths, in the level's setting (`Level.draft_length`)
    temperatures: list[float]
    max_tokens: int
    repeat: int
    seed: int
    prompts: list[tuple[str, str]]
    sequences: list[int] | None  # sequences decoded together (--sequences), or None
    members: list[int] | str  # the models alone beside, or "largest"
    proposer: int | None


def _plan(args: argparse.Namespace, settings, level: Level, sequences: list[int] | None) -> _Plan:
    """The plan of the bench at `level`: the methods it decodes (default: all of them; the
    ensemble's step for one model), the draft lengths in its setting; every generation's rules
    checked before anything loads (a draft length or a proposer the level does not read is
    refused by the level's rules: `config.levels.check_level`)."""
    from ..config import GenerationConfig, check_for_models, check_level, level_methods
    from ..config.parse import parse_choice, parse_int
    from ..core.decoding import METHODS

    n_models = len(settings.load.paths)
    # one model: the ensemble's step is all it decodes (a draft needs a second member)
    default_methods = level_methods(level) if n_models > 1 else ("ensemble",)
    methods = [parse_choice(m, "--methods", METHODS) for m in args.methods.split(",")] if args.methods else list(default_methods)
    drafts = _drafts(args)
    sweep = drafts[level.draft_length] or DRAFT_SWEEPS[level.draft_length]
    gammas = [_one_draft_length(level.draft_length, g) for g in sweep.split(",")]
    other = {name: [_one_draft_length(name, g) for g in given.split(",")] for name, given in drafts.items()
             if given is not None and name != level.draft_length}  # fmt: skip
    temperatures, max_tokens, repeat, seed, prompts = _common(args)
    members = _members(args.alone, n_models)
    proposer = parse_int(args.proposer, "--proposer", minimum=0) if args.proposer is not None else None
    for method in methods:
        configs = [GenerationConfig(method=method, proposer=proposer).with_values({name: g})
                   for name, values in [(level.draft_length, gammas), *other.items()] for g in values]  # fmt: skip
        for config in configs:
            check_for_models(config, n_models)
            check_level(level, config, gated=True)  # the gate: the settings' own, checked with them (`decoding_level`)
    return _Plan(methods, gammas, temperatures, max_tokens, repeat, seed, prompts, sequences, members, proposer)


def _one_draft_length(name: str, value: str) -> int | str:
    """One value of a draft-length sweep (--gamma's or --byte-gamma's): a length, or auto."""
    from ..config import OPTIONS

    length = OPTIONS[name].check(value)
    if isinstance(length, tuple):  # cannot happen for one item; keeps the types honest
        raise ConfigError(f"{OPTIONS[name].what()} sweeps single values, got {value!r}", param=name)
    return length


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


def _report_runs(args: argparse.Namespace, settings, plan: _Plan, models, runs, names: list[str], big: int, alone: list[int],
                 memory: tuple[float, float, float]) -> None:  # fmt: skip
    """The bench's table and notes (timing noise, the level against a model alone, call costs,
    memory), --json, --csv, --plot."""
    from ..models.weights import type_name
    from ..runtime.profile import advice, cpu_name, describe, measured
    from ..tools import bench

    rss_start, rss_loaded, peak = memory
    level = models.level
    # the cost model's proposer: the one given, else the one the drafting runs report (none where the models take turns)
    proposer = plan.proposer if plan.proposer is not None else next((r.stats.proposer for r in runs if r.stats.proposer is not None), None)
    rows = bench.summarize(runs, len(names), unit=level.unit, proposer=proposer, largest_model=big)
    tasks = sorted({t for t, _ in plan.prompts})
    shown = rows if args.per_task else [r for r in rows if r.task == "all"]  # the table, --json's summary and --csv
    drafting = f" | proposer {names[proposer]}" if proposer is not None else ""
    print(
        f"localcos bench ({level.value} level): {', '.join(names)} | combine {models.combiner.description}{drafting} | "
        f"{len(plan.prompts)} prompts ({', '.join(tasks)}) x {plan.repeat} | max {plan.max_tokens} tokens | {cpu_name()}"
    )
    print(bench.format_table(shown, names, f"{settings.name} "))
    if alone:
        print(f"\nalone-I: model I decoding by itself on its own tokens ({', '.join(f'{i} = {names[i]}' for i in alone)}); "
              f"/big: speed as a fraction of the largest model alone ({names[big]}); same: the generations where a configuration wrote "
              "the ensemble's very text, x there: its speed there against the ensemble's")  # fmt: skip
    for r in shown:
        if r.method == bench.ALONE and r.task == "all" and r.same_text and r.vs_ensemble_there:
            generations = len({(x.prompt, x.repeat) for x in runs if x.temperature == r.temperature and x.method == "ensemble"})
            print(f"the {level.value} level, where {r.config} wrote the same text ({r.same_text} of {generations} generations at T={r.temperature:g}): "
                  f"{1 / r.vs_ensemble_there:.2f}x its speed")  # fmt: skip
    planned = bench.auto_plans(runs, level.unit)
    if planned:
        print("\nwhat auto planned, per prompt: its speed against the ensemble's there; who drafted how many tokens (x rounds), "
              "and the rounds with no draft")  # fmt: skip
        for line in planned:
            print(f"  {line}")
    noise = sorted(bench.timing_noise(runs))
    if noise:
        print(
            f"\ntiming noise: the ensemble ran each prompt twice (before and after the others); the two runs "
            f"differ by {noise[len(noise) // 2]:.1%} in the median, {noise[-1]:.1%} at most. Speedups use both."
        )
    print(f"\nbatched calls on this machine ({cpu_name()}, {models.loaded[0].n_threads} threads), from the models' profiles "
          "(what an auto draft length plans with):")  # fmt: skip
    for name, model, profile, plan_profile in zip(names, models.loaded, models.costs.profiles, models.costs.current().profiles):
        print(f"  {name}: {describe(profile)}")
        calls = measured(profile, model.call_times, plan_profile)
        if calls:
            print(f"    {calls}")
        file_type = model.meta("general.file_type") or ""
        tip = advice((type_name(int(file_type)) if file_type.isdigit() else None) or "?", profile)
        if tip:
            print(f"    {tip}")
    sizes = sum(m.size_bytes for m in models.loaded) / 2**20
    print(
        f"\nmemory: {rss_start:.0f} MiB before loading the models, {rss_loaded:.0f} MiB after, "
        f"peak while generating {peak:.0f} MiB (+{peak - rss_loaded:.0f} MiB; model weights {sizes:.0f} MiB)"
    )
    report = {
        "models": [str(p) for p in settings.load.paths],
        "level": level.value,
        "combiner": models.combiner.description,
        "proposer": proposer,
        "settings": {
            "methods": plan.methods,
            level.draft_length: plan.gammas,
            "temperatures": plan.temperatures,
            "max_tokens": plan.max_tokens,
            "repeat": plan.repeat,
            "prompts": len(plan.prompts),
            "byte_paths": settings.load.byte_paths,
            "byte_prune": settings.load.byte_prune,
        },  # fmt: skip
        "machine": bench.machine(),
        "memory_mib": {"before_load": rss_start, "after_load": rss_loaded, "peak": peak, "weights": sizes},
        "timing_noise": noise,
        "summary": [r.to_dict() for r in shown],
        "runs": [r.to_dict() for r in runs],
    }
    if args.json:
        bench.write_json(args.json, report)
    if args.csv:
        bench.write_csv(args.csv, shown)
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
