"""`localcos score`: perplexity and multiple-choice accuracy of a combination and of its models."""

from __future__ import annotations

import argparse
import csv
import json
import time
from types import TracebackType
from pathlib import Path

from ..errors import ConfigError
from ..files import atomic_write, write_text
from ..tools.plotting import plot_sweep, require_matplotlib
from .options import add_options, loading_progress, resolve

# At the byte level score keeps every tokenisation (up to the cap): pruning bounds how far the
# distribution of *sampled* text moves (by the mass dropped), but not one given text's
# probability, which a dropped tokenisation the text then follows can hold most of.
BYTE_DEFAULTS = {"byte_prune": 0.0, "byte_paths": 16}
# At the byte level windows (or a choice's options) are scored side by side, each in sequences of
# its own (`scoring.bytescore`): at most this many at once.
MAX_LANES = 4


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "score",
        help="perplexity / multiple-choice accuracy of a combination and of each model alone",
        description="Score a combination: the perplexity of a text (--file; llama-perplexity's windows: chunks of "
        "--ctx tokens, the second half of each scored) or the accuracy on a multiple-choice set (--choices, JSON "
        "lines {context, choices, answer}), under the combined distribution r and under each model alone, "
        "optionally over a grid of combinations (--sweep), which costs the models nothing more.",
    )
    what = p.add_argument_group("what to score")
    what.add_argument("--file", help="a text file: its perplexity")
    what.add_argument("--choices", help="a JSON-lines multiple-choice set: accuracy")
    what.add_argument(
        "--sweep", action="append", help="a grid: weights=0:1:0.1 (the first model's weight), mu=0,0.05,0.1,0.2, "
        "plausibility=0.05,0.1 or gate=0.3,0.5,0.9; give it twice for the grid of two parameters"
    )
    add_options(p, ["models", "hardware", "combination", "level"], defaults=BYTE_DEFAULTS,
                exclude={"synthetic", "synthetic_dtype", "byte_gamma"})
    refused = p.add_argument_group("not for score")
    for flag in ("--json-schema", "--grammar", "--json-object"):
        refused.add_argument(flag, dest=f"refused_{flag[2:].replace('-', '_')}", nargs="?", const=True, default=None,
                             help="structured output constrains generation; score measures the models' own distributions")  # fmt: skip
    out = p.add_argument_group("output")
    out.add_argument("--json", help="write every figure as JSON")
    out.add_argument("--csv", help="write the table as CSV")
    out.add_argument("--plot", help="write a PNG of the figure over the --sweep grid (needs matplotlib)")
    p.set_defaults(func=run, ctx=None)


def run(args: argparse.Namespace) -> int:
    from ..ensemble import Ensemble, load_at
    from ..scoring import choices as choice_task, perplexity as perplexity_task
    from ..scoring.sweep import combiners_for, grid as sweep_grid, label, parse_sweep
    from ..runtime.scoring import SCORING_LOGIT_ROWS
    from ..tools.bench import RssSampler, current_rss_mb

    text, items = _what_to_score(args)
    sweep = [parse_sweep(text) for text in args.sweep or ()]
    points = sweep_grid(sweep)
    if args.plot:
        if not sweep:
            raise ConfigError("--plot draws the figure over a --sweep grid; give --sweep", param="plot")
        require_matplotlib()
    settings = resolve(args, {"ctx": 512 if args.file else 2048, **BYTE_DEFAULTS})
    for s in sweep:
        wanted = combiners_for(s.name)
        if wanted is not None and settings.combine.combine not in wanted:
            raise ConfigError(f"--sweep {s.name} needs --combine {' or '.join(wanted)} (it is {settings.combine.combine})", param="sweep")
    grid = [settings.with_values(point) for point in points]  # each point checked like an option
    labels = [label(point) for point in points]
    from ..config.levels import decoding_level

    # the byte level's scorer (bits per byte, each model on its own tokens) is its own: the one
    # branch on the level here, where the scorer is chosen
    if decoding_level(settings, scoring=True).in_bytes:
        return _score_bytes(args, settings, text, items, grid, labels, sweep)
    with load_at(settings.load, settings.combiner(), progress=loading_progress, max_logit_rows=SCORING_LOGIT_ROWS) as ens:
        assert isinstance(ens, Ensemble), "the token level's models, as decoding_level said"
        combiners = [s.combiner() for s in grid]
        names = ens.names
        rss_loaded = current_rss_mb()
        llama0 = sum(m.stats.seconds for m in ens.loaded)
        t0 = time.perf_counter()
        with _Progress("windows" if args.file else "items") as bar, RssSampler() as rss:
            if text is not None:
                result = perplexity_task.perplexity(ens, text, combiners, progress=bar.update, second_prompt=settings.generation.negative_prompt)
            else:
                assert items is not None, "--file or --choices, one of them"
                choices = choice_task.score_choices(ens, items, combiners, progress=bar.update, second_prompt=settings.generation.negative_prompt)
        seconds = time.perf_counter() - t0
        llama = sum(m.stats.seconds for m in ens.loaded) - llama0
        bound = [ens.bind(c).description for c in combiners]
    if args.file:
        rows, speed = _perplexity_rows(args.file, result, bound, labels, names, seconds)
    else:
        rows, speed = _choice_rows(args.choices, choices, bound, labels, names, seconds)
    host = (seconds - llama) / seconds if seconds > 0 else 0.0
    print(f"\n{seconds:.2f}s, {speed}; {host:.0%} of the time outside llama.cpp (combining); peak host memory +{rss.peak - rss_loaded:.0f} MiB")
    report: dict = {
        "models": [str(p) for p in settings.load.paths],
        "kind": "perplexity" if args.file else "choices",
        "sweep": [{"name": x.name, "values": list(x.values)} for x in sweep],
        "rows": [{"kind": k, "label": label, "value": v, "extra": e} for k, label, v, e in rows],
        "seconds": seconds,
        "llama_seconds": llama,
        "peak_memory_mib": rss.peak - rss_loaded,
    }
    if text is not None:
        report.update(tokens=result.tokens, windows=result.windows, n_ctx=result.n_ctx)
    else:
        assert items is not None
        report.update(
            items=len(items),
            loglikelihoods={"combined": choices.combined, "members": choices.members, "tokens": choices.tokens},
        )
    header = ["kind", "label", "perplexity" if args.file else "accuracy", "error" if args.file else "accuracy_per_token"]
    _write(args, report, header, rows, sweep, "perplexity" if args.file else "accuracy")
    return 0


def _what_to_score(args: argparse.Namespace) -> tuple[str | None, list | None]:
    """(the text of --file, or None; the items of --choices, or None), read and checked."""
    from ..scoring import choices as choice_task

    given = [flag for flag in ("json_schema", "grammar", "json_object") if getattr(args, f"refused_{flag}") is not None]
    if given:
        raise ConfigError(
            f"score measures the models' own distributions, unconstrained: --{given[0].replace('_', '-')} is for generate, chat and serve",
            param=given[0],
        )
    if bool(args.file) == bool(args.choices):
        raise ConfigError("give --file TEXT (perplexity) or --choices FILE.jsonl (accuracy)", param="file")
    if not args.file:
        return None, choice_task.load_choices(args.choices)
    path = Path(args.file)
    if not path.is_file():
        raise ConfigError(f"text file not found: {args.file}", param="file")
    text = path.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        raise ConfigError(f"{args.file} is empty", param="file")
    return text, None


def _perplexity_rows(file: str, result, bound: list[str], labels: list[str], names: list[str], seconds: float) -> tuple[list, str]:
    """The perplexity table printed; its rows (what, label, value, error) and the speed."""
    scored = sum(n.count for n in result.combined[:1])
    print(f"localcos score: perplexity of {file} ({result.tokens} tokens; {result.windows} windows of {result.n_ctx}, {scored} tokens scored)")
    print(f"{'':<34}{'perplexity':>14}{'+/-':>12}")
    rows = [("r", label or desc, nll.perplexity, nll.error) for desc, label, nll in zip(bound, labels, result.combined)]
    rows += [("model", name, nll.perplexity, nll.error) for name, nll in zip(names, result.members)]
    for kind, label, value, err in rows:
        print(f"{(f'r {label}' if kind == 'r' else f'{label} alone')[:33]:<34}{value:>14.6g}{err:>12.4g}")
    return rows, f"{scored / seconds:.1f} scored tokens/s" if seconds > 0 else ""


def _choice_rows(file: str, choices, bound: list[str], labels: list[str], names: list[str], seconds: float, unit: str = "token",
                 where: str = "") -> tuple[list, str]:  # fmt: skip
    """The accuracy table printed; its rows (what, label, accuracy, per `unit` of the choices:
    token, or byte at the byte level) and the speed."""
    print(f"localcos score: {len(choices.tokens)} multiple-choice items from {file}{where}")
    print(f"{'':<34}{'accuracy':>10}{'per ' + unit:>11}")
    rows = [("r", label or desc, choices.accuracy(sums), choices.accuracy(sums, per_token=True)) for desc, label, sums in zip(bound, labels, choices.combined)]
    rows += [("model", name, choices.accuracy(sums), choices.accuracy(sums, per_token=True)) for name, sums in zip(names, choices.members)]
    for kind, label, acc, acc_tok in rows:
        print(f"{(f'r {label}' if kind == 'r' else f'{label} alone')[:33]:<34}{acc:>10.1%}{acc_tok:>11.1%}")
    return rows, f"{sum(map(sum, choices.tokens)) / seconds:.1f} choice {unit}s/s" if seconds > 0 else ""


def _score_bytes(args: argparse.Namespace, settings, text: str | None, items: list | None, grid: list, labels: list[str], sweep) -> int:
    """score at the byte level: bits per byte of the text (--file), or the accuracy on a
    multiple-choice set (--choices), under r and each model alone."""
    from ..ensemble import load_at
    from ..scoring.bytescore import bits_per_byte, byte_choices, windows_of
    from ..runtime.bytelevel import ByteModels

    window = settings.load.n_ctx - 2  # bytes: a window's tokens fit the context (a token has 1 byte or more), BOS too
    if text is not None:
        texts = len(windows_of(text.encode("utf-8"), window))
    else:
        assert items is not None, "--file or --choices, one of them"
        texts = max(len(item.choices) for item in items)
    lanes = max(1, min(texts, MAX_LANES))
    with load_at(settings.load, settings.combiner(), progress=loading_progress, lanes=lanes) as models:
        assert isinstance(models, ByteModels), "the byte level's models, as decoding_level said"
        t0 = time.perf_counter()
        combiners = [s.combiner() for s in grid]
        with _Progress("bytes" if text is not None else "items") as bar:
            if text is not None:
                result = bits_per_byte(models, text, combiners, window=window, progress=bar.update)
            else:
                assert items is not None
                choices = byte_choices(models, items, combiners, progress=bar.update)
        seconds = time.perf_counter() - t0
        names = models.names
        bound = [c.bind(len(models.models), [m.n_params for m in models.models]).description for c in combiners]
    report: dict = {"models": [str(p) for p in settings.load.paths], "level": "byte", "seconds": seconds,
                    "sweep": [{"name": x.name, "values": list(x.values)} for x in sweep]}  # fmt: skip
    if text is not None:
        scored = result.combined[0].count
        windows = f"{result.windows} window" + ("s" if result.windows != 1 else "")
        print(f"localcos score: bits per byte of {args.file} at the byte level ({result.bytes} bytes; {windows} of "
              f"{result.window} bytes, {scored} bytes scored)")  # fmt: skip
        print(f"{'':<34}{'bits/byte':>12}")
        rows = [("r", label or desc, bits.per_byte, None) for desc, label, bits in zip(bound, labels, result.combined)]
        rows += [("model", name, bits.per_byte, None) for name, bits in zip(names, result.members)]
        for kind, label, value, _ in rows:
            print(f"{(f'r {label}' if kind == 'r' else f'{label} alone')[:33]:<34}{value:>12.4f}")
        pruned = ", ".join(f"{n}: {d:.2g} of its mass over a window dropped, {u} bytes outside its held paths (rebuilt)"
                           for n, d, u in zip(names, result.dropped, result.unreachable))
        print(f"\n{seconds:.2f}s, {scored / seconds:.1f} scored bytes/s; pruning (--byte-prune {settings.load.byte_prune:g}): {pruned}")
        report.update(kind="bits_per_byte", bytes=result.bytes, windows=result.windows, window=result.window,
                      dropped_mass=result.dropped, unreachable_bytes=result.unreachable)  # fmt: skip
        metric, header = "bits per byte", ["kind", "label", "bits_per_byte"]
    else:
        assert items is not None
        rows, speed = _choice_rows(args.choices, choices, bound, labels, names, seconds, "byte", " at the byte level")
        print(f"\n{seconds:.2f}s, {speed}")
        report.update(
            kind="choices",
            items=len(items),
            loglikelihoods={"combined": choices.combined, "members": choices.members, "bytes": choices.tokens},
        )
        metric, header = "accuracy", ["kind", "label", "accuracy", "accuracy_per_byte"]
    report["rows"] = [{"kind": k, "label": label, "value": v, "extra": e} for k, label, v, e in rows]
    _write(args, report, header, rows, sweep, metric)
    return 0


def _write(args: argparse.Namespace, report: dict, header: list[str], rows: list[tuple], sweep, metric: str) -> None:
    """--json, --csv and --plot, as asked."""
    if args.json:
        write_text(args.json, json.dumps(report, indent=1))
    if args.csv:
        with atomic_write(args.csv, newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows(r[: len(header)] for r in rows)
    if args.plot:
        assert sweep
        plot_sweep(args.plot, sweep, rows, metric)


class _Progress:
    """A progress bar on stderr while scoring (only on a terminal)."""

    def __init__(self, unit: str) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        console = Console(stderr=True)
        self._bar = Progress(
            TextColumn(f"scoring {unit}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=True,
            disable=not console.is_terminal,
        )
        self._task = self._bar.add_task("score", total=None)

    def update(self, done: int, total: int) -> None:
        self._bar.update(self._task, completed=done, total=total)

    def __enter__(self) -> _Progress:
        self._bar.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self._bar.__exit__(kind, error, trace)
