"""`localcos bench`: the CoS paper's comparison, measured side by side in one process, at the
level the models decode at.

Every configuration (a method and its draft length, and a model of the ensemble decoding alone
on its own tokens: what a user weighs the ensemble against) runs on the same prompts with the
same seeds, interleaved: for each temperature, each prompt and each repeat, all configurations
run one after the other, and the standard ensemble runs both first and last (A-B-A), so drift of
the machine's speed cancels out of the ratio and the two baseline runs show how noisy the timing
is. Speed is counted in the level's unit (`Level.unit`): tokens, or characters where the models
decode through their byte views (what their text and a model alone on its own tokens have in
common). Every speedup is a ratio of speeds measured in the same conditions, seconds apart.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import resource
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, fields
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ..config.specs import GenerationConfig
from ..core.speedmodel import expected_speedup
from ..ensemble import Ensemble, LevelEnsemble
from ..files import atomic_write
from ..runtime.models import scheduler_for
from ..runtime.profile import cpu_name
from ..stats import GenerationStats, describe_plans


ALONE = "alone"  # the method name of a model decoding by itself (plain decoding, on its own tokens)


@dataclass(frozen=True)
class Config:
    """One column of the comparison: a method and its draft length (in the level's setting:
    `Level.draft_length`), or one model alone."""

    method: str
    gamma: int | str | None  # None for the ensemble's step; an int, or "auto"
    member: int | None = None  # method "alone": which model

    @property
    def label(self) -> str:
        if self.method == ALONE:
            return f"alone-{self.member}"
        return self.method if self.gamma is None else f"{self.method}/{self.gamma}"


@dataclass
class Run:
    """One generation of the benchmark: where it ran, its text and its statistics."""

    task: str
    prompt: int
    temperature: float
    repeat: int
    method: str
    gamma: int | str | None
    stats: GenerationStats
    again: bool = False  # the ensemble's second run of this prompt (after the other configurations)
    member: int | None = None  # method "alone": which model
    text: str = ""

    @property
    def config(self) -> str:
        return Config(self.method, self.gamma, self.member).label

    @property
    def tokens(self) -> int:
        """What max_tokens counts: a model's own tokens, the lead's where the models decode through
        their byte views."""
        return self.stats.tokens

    @property
    def chars(self) -> int:
        return len(self.text)

    def length(self, unit: str) -> int:
        """The text's length in `unit` (`Level.unit`: tokens or chars)."""
        return int(getattr(self, unit))

    def to_dict(self) -> dict:
        fixed = {k: v for k, v in asdict(self).items() if k != "stats"}
        return {**fixed, "config": self.config, "tokens": self.tokens, "chars": self.chars, "seconds": self.stats.seconds,
                "llama_seconds": self.stats.llama_seconds, "stats": self.stats.to_dict()}  # fmt: skip


@dataclass
class Row:
    """Aggregated results of one configuration on one task at one temperature, in the level's
    unit (`unit`; the JSON names the unit's fields by it: `to_dict`). A value the level does not
    count is None: the cost model's (acceptance rate, c, b, expected) are the token level's; the
    draft symbols judged, rounds without a draft and paths are the byte and mixed levels'."""

    task: str
    temperature: float
    config: str
    method: str
    gamma: int | str | None
    member: int | None  # method "alone": which model
    length: int  # the text, in `unit`
    seconds: float
    per_second: float  # `length` per second
    speedup: float | None  # over the standard ensemble, on all prompts' text and seconds
    min_prompt_speedup: float | None  # the prompt where it did worst
    acceptance: float | None
    mean_accepted: float | None
    accepted: int
    drafted: int | None
    ensemble_steps: int | None  # cos at the byte level: rounds where no model drafted
    calls_per_unit: list[float]  # per model (a model alone: its own, the others' 0)
    most_paths: list[int] | None
    cost_ratio: float | None
    batch_cost: float | None
    expected: float | None
    measured_over_expected: float | None
    expected_with_batch_cost: float | None
    host_fraction: float
    same_text: int | None = None  # generations (prompt, repeat) where it wrote the ensemble's very text (None: the ensemble's own row)
    vs_ensemble_there: float | None = None  # its speed over those prompts against the ensemble's
    of_largest: float | None = None  # speed as a fraction of the largest model's alone
    unit: str = "tokens"

    def to_dict(self) -> dict[str, Any]:
        """The row for JSON and CSV, its unit's fields named by the unit (tokens, tokens_per_second,
        calls_per_token; chars, chars_per_second, calls_per_char)."""
        names = {"length": self.unit, "per_second": f"{self.unit}_per_second", "calls_per_unit": f"calls_per_{self.unit.rstrip('s')}"}
        return {names.get(f.name, f.name): getattr(self, f.name) for f in fields(self) if f.name != "unit"}


def configurations(methods: Sequence[str], gammas: Sequence[int | str], members: Sequence[int] = ()) -> list[Config]:
    """Each of `members` decoding alone, the ensemble once, every other method once per draft
    length of the sweep."""
    out = [Config(ALONE, None, m) for m in members]
    for m in methods:
        if m == "ensemble":
            out.append(Config("ensemble", None))
        else:
            out.extend(Config(m, g) for g in gammas)
    if not any(c.method == "ensemble" for c in out):
        out.insert(len(members), Config("ensemble", None))  # speedups need the baseline
    return out


def run_benchmark(
    models: LevelEnsemble,
    prompts: Sequence[tuple[str, str | Sequence[int]]],
    configs: Sequence[Config],
    temperatures: Sequence[float],
    *,
    max_tokens: int = 64,
    repeat: int = 1,
    seed: int = 0,
    proposer: int | None = None,
    progress: Callable[[int, int, str], None] | None = None,
) -> list[Run]:
    """Run every configuration on every (task, prompt), interleaved, the ensemble first and again
    last; returns one `Run` per generation. A draft length goes to the level's setting
    (`Level.draft_length`); a model alone decodes on its own tokens, on the weights loaded here
    (`Ensemble.beside`); `proposer` None: the level's default. A prompt is text, or token ids
    (a rendered chat)."""
    draft = models.level.draft_length
    alone = {c.member: Ensemble.beside(models, c.member) for c in configs if c.member is not None}
    rounds = [(c, False) for c in configs] + [(c, True) for c in configs if c.method == "ensemble"]
    total = len(temperatures) * len(prompts) * repeat * len(rounds)
    done = 0
    # warm up: fault in the model weights and let the CPU settle before anything is timed
    models.generate(prompts[0][1], method="ensemble", max_tokens=8, temperature=0, ignore_eos=True)
    runs: list[Run] = []
    for temperature in temperatures:
        for p, (task, prompt) in enumerate(prompts):
            for r in range(repeat):
                run_seed = seed + 1000 * p + r
                for config, again in rounds:
                    if progress:
                        progress(done, total, f"T={temperature:g} prompt {p + 1}/{len(prompts)} {config.label}")
                    common: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature, "seed": run_seed, "ignore_eos": True}
                    if config.member is not None:
                        out = alone[config.member].generate(prompt, method="ensemble", **common)
                    else:
                        drafting: dict[str, Any] = {} if config.gamma is None else {draft: config.gamma, "proposer": proposer}
                        out = models.generate(prompt, method=config.method, **drafting, **common)
                    runs.append(Run(task, p, temperature, r, config.method, config.gamma, out.stats, again, config.member, out.text))
                    done += 1
    if progress:
        progress(done, total, "done")
    return runs


@dataclass
class ThroughputRow:
    """Aggregate speed of `sequences` generations decoded together, one configuration."""

    method: str
    gamma: int | str | None
    temperature: float
    sequences: int
    tokens: int
    seconds: float
    calls: list[int]  # llama_decode calls per model

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def run_throughput(
    models: LevelEnsemble,
    prompts: Sequence[tuple[str, str]],
    configs: Sequence[Config],
    temperatures: Sequence[float],
    levels: Sequence[int],
    *,
    max_tokens: int = 64,
    rounds: int = 2,
    seed: int = 0,
    proposer: int | None = None,
    progress: Callable[[int, int, str], None] | None = None,
) -> list[ThroughputRow]:
    """Aggregate tokens/s with 1, 2, 4, ... sequences decoded together (`levels`; the models are
    loaded with parallel >= max(levels)): each level decodes as many sequences as it allows, over
    `rounds` passes in which every level runs once, interleaved, so the ratios are measured side
    by side. Every sequence takes its own prompt (the prompts in turn)."""
    draft = models.level.draft_length
    models.generate(prompts[0][1], method="ensemble", max_tokens=8, temperature=0, ignore_eos=True)  # warm up
    rows: dict[tuple, ThroughputRow] = {}
    total = rounds * len(temperatures) * len(configs) * len(levels)
    done = 0
    for r in range(rounds):
        for temperature in temperatures:
            for config in configs:
                for level in levels:
                    if progress:
                        progress(done, total, f"T={temperature:g} {config.label} x{level}")
                    scheduler = scheduler_for(models, list(range(level)))
                    calls0 = [m.stats.calls for m in models.models]
                    drafting: dict[str, Any] = {} if config.gamma is None else {draft: config.gamma, "proposer": proposer}
                    for k in range(level):
                        prompt = prompts[(k + r) % len(prompts)][1]
                        settings = GenerationConfig(method=config.method, temperature=temperature, max_tokens=max_tokens, seed=seed + k,
                                                    ignore_eos=True).with_values(drafting)  # fmt: skip
                        scheduler.submit(models.plan(prompt, settings), np.random.default_rng(seed + k + 1000 * r))
                    t0 = time.perf_counter()
                    tokens = sum(s.completion.stats.tokens for s in scheduler.run() if s.completion is not None)
                    seconds = time.perf_counter() - t0
                    key = (config.method, config.gamma, temperature, level)
                    row = rows.setdefault(key, ThroughputRow(config.method, config.gamma, temperature, level, 0, 0.0, [0] * len(models.models)))
                    row.tokens += tokens
                    row.seconds += seconds
                    row.calls = [c + m.stats.calls - c0 for c, m, c0 in zip(row.calls, models.models, calls0)]
                    done += 1
    if progress:
        progress(done, total, "done")
    return list(rows.values())


def format_throughput(rows: Sequence[ThroughputRow], names: Sequence[str]) -> str:
    """The throughput table: aggregate tokens/s per number of sequences, and its ratio to one."""
    lines = [f"{'method':<11}{'gamma':>6}{'T':>5}{'seqs':>6}{'tok/s':>9}{'vs 1':>7}{'calls/tok':>16}"]
    one = {(r.method, r.gamma, r.temperature): r.tokens_per_second for r in rows if r.sequences == 1}
    for r in sorted(rows, key=lambda r: (r.temperature, r.method != "ensemble", r.method, str(r.gamma), r.sequences)):
        base = one.get((r.method, r.gamma, r.temperature))
        calls = "/".join(f"{c / r.tokens:.2f}" if r.tokens else "-" for c in r.calls)
        ratio = f"{r.tokens_per_second / base:.2f}x" if base else "-"
        gamma = "-" if r.gamma is None else str(r.gamma)
        lines.append(f"{r.method:<11}{gamma:>6}{r.temperature:>5g}{r.sequences:>6}{r.tokens_per_second:>9.1f}{ratio:>7}{calls:>16}")
    lines.append(f"(calls/tok: llama_decode calls per generated token, {' / '.join(names)})")
    return "\n".join(lines)


def summarize(runs: Sequence[Run], n_models: int, *, unit: str = "tokens", proposer: int | None = None,
              largest_model: int | None = None) -> list[Row]:  # fmt: skip
    """Rows per (task, temperature, configuration), plus task "all", in `unit` (`Level.unit`).
    `proposer`: the model whose calls the cost ratio c puts over the others' (None: no cost
    model, as at the byte level, where the models take turns). With `largest_model` (and its
    runs alone), every row's speed is also given as a fraction of that model's alone."""
    groups: dict[tuple, list[Run]] = defaultdict(list)
    for run in runs:
        for task in (run.task, "all"):
            groups[(task, run.temperature, run.method, run.gamma, run.member)].append(run)
    rows = []
    for (task, temperature, *_), group in groups.items():
        baseline = groups.get((task, temperature, "ensemble", None, None), [])
        row = _row(task, temperature, group, baseline, proposer, n_models, unit)
        big = _speed(groups.get((task, temperature, ALONE, None, largest_model), []), unit)
        row.of_largest = row.per_second / big if big > 0 else None
        rows.append(row)
    order = {"all": 0}
    rank = {"ensemble": 0, ALONE: 2}
    rows.sort(key=lambda r: (order.get(r.task, 1), r.task, r.temperature, rank.get(r.method, 1), r.method, r.member or 0, str(r.gamma)))
    return rows


def timing_noise(runs: Sequence[Run]) -> list[float]:
    """|1 - speed of the ensemble's second run / its first| for each prompt, temperature and
    repeat: the same work timed twice, seconds apart (how far apart identical runs land here)."""
    first = {(r.temperature, r.prompt, r.repeat): r for r in runs if r.method == "ensemble" and not r.again}
    out = []
    for r in runs:
        if r.method == "ensemble" and r.again and (r.temperature, r.prompt, r.repeat) in first:
            a, b = first[(r.temperature, r.prompt, r.repeat)].stats.seconds, r.stats.seconds
            if a > 0 and b > 0:
                out.append(abs(1.0 - a / b))  # the same text both times: speeds are as their seconds' inverse
    return out


def auto_plans(runs: Sequence[Run], unit: str) -> list[str]:
    """What --gamma auto planned, a line per configuration, temperature and prompt (its repeats
    together): its speed against the ensemble's on that prompt, then its plans (`describe_plans`)."""
    groups: dict[tuple, list[Run]] = defaultdict(list)
    for r in runs:
        if r.gamma == "auto" or r.method == "ensemble":
            groups[(r.config, r.temperature, r.prompt)].append(r)
    lines = []
    for (config, temperature, prompt), group in sorted(groups.items(), key=lambda kv: kv[0]):
        base = _speed(groups.get(("ensemble", temperature, prompt), []), unit)
        if config == "ensemble" or base <= 0:
            continue
        total = GenerationStats.aggregate([r.stats for r in group])
        plans = describe_plans(total) if total.plans else "-"
        lines.append(f"{config} T={temperature:g} {group[0].task} #{prompt}: {_speed(group, unit) / base:.2f}x  {plans}")
    return lines


def _speed(runs: Iterable[Run], unit: str) -> float:
    runs = list(runs)
    seconds = sum(r.stats.seconds for r in runs)
    return sum(r.length(unit) for r in runs) / seconds if seconds > 0 else 0.0


def _by_prompt(runs: Iterable[Run]) -> dict[int, list[Run]]:
    groups: dict[int, list[Run]] = defaultdict(list)
    for r in runs:
        groups[r.prompt].append(r)
    return groups


def _seconds_per_call(stats: GenerationStats) -> list[float]:
    return [m.seconds / max(1, m.calls) for m in stats.models]


def _calls_per_model(stats: GenerationStats, member: int | None, n_models: int) -> list[int]:
    """Each model's calls; a model alone (its own statistics, one model) at its index, the others 0."""
    if member is None or len(stats.calls) == n_models:
        return stats.calls
    return [stats.calls[0] if i == member else 0 for i in range(n_models)]


def _row(task: str, temperature: float, group: list[Run], baseline: list[Run], proposer: int | None, n_models: int, unit: str) -> Row:
    first = group[0]
    method, gamma = first.method, first.gamma
    total = GenerationStats.aggregate([r.stats for r in group])
    counted = total.to_dict()  # null where the level does not count a value
    base = GenerationStats.aggregate([r.stats for r in baseline]) if baseline else None
    speed, base_speed = _speed(group, unit), _speed(baseline, unit)
    speedup = speed / base_speed if base_speed > 0 else None
    # worst prompt: the configuration against the ensemble on the same prompt (and repeats)
    theirs = _by_prompt(baseline)
    mine = _by_prompt(group)
    their_speed = {p: _speed(runs, unit) for p, runs in theirs.items()}
    per_prompt = [_speed(runs, unit) / their_speed[p] for p, runs in mine.items() if their_speed.get(p, 0.0) > 0]
    # the generations (a prompt at a repeat: one seed) where it wrote the ensemble's very text,
    # and its speed there against the ensemble's
    ensemble_text = {(r.prompt, r.repeat): r.text for r in baseline if not r.again}
    same = {(r.prompt, r.repeat) for r in group if ensemble_text.get((r.prompt, r.repeat)) == r.text}
    there = _speed([r for r in baseline if (r.prompt, r.repeat) in same], unit)
    length = sum(r.length(unit) for r in group)
    acceptance = counted["acceptance_rate"]
    # cost ratio c: one proposer call / one call of the costliest other model, from the
    # ensemble's single-token calls
    c = b = None
    if base is not None and proposer is not None and n_models >= 2 and method != ALONE:
        base_call = _seconds_per_call(base)
        others = [i for i in range(n_models) if i != proposer]
        verifier = max(others, key=lambda i: base_call[i])
        if base_call[verifier] > 0:
            c = base_call[proposer] / base_call[verifier]
            # b: what the verifier's calls cost here (batched) relative to a single-token call
            b = _seconds_per_call(total)[verifier] / base_call[verifier]
    expected = expected_b = None
    if method == "ensemble" and proposer is not None:
        expected = expected_b = 1.0
    elif n_models == 2 and acceptance is not None and c is not None and isinstance(gamma, int):
        # the paper's cost model (a verifier pass costs one call whatever its length), and the
        # same with the batch cost b measured here
        expected = expected_speedup(method, acceptance, gamma, c)
        expected_b = expected_speedup(method, acceptance, gamma, c, batch_cost=b)
    return Row(
        task=task,
        temperature=temperature,
        config=first.config,
        method=method,
        gamma=gamma,
        member=first.member,
        length=length,
        seconds=total.seconds,
        per_second=speed,
        speedup=speedup,
        min_prompt_speedup=min(per_prompt) if per_prompt else None,
        acceptance=acceptance,
        mean_accepted=counted["mean_accepted"],
        accepted=total.accepted,
        drafted=counted["drafted"],
        ensemble_steps=counted["ensemble_steps"] if method == "cos" else None,
        calls_per_unit=[calls / length if length else 0.0 for calls in _calls_per_model(total, first.member, n_models)],
        most_paths=counted["most_paths"],
        cost_ratio=c,
        batch_cost=b,
        expected=expected,
        measured_over_expected=(speedup / expected) if speedup and expected else None,
        expected_with_batch_cost=expected_b,
        host_fraction=total.host_fraction or 0.0,
        same_text=None if method == "ensemble" else len(same),
        vs_ensemble_there=_speed([r for r in group if (r.prompt, r.repeat) in same], unit) / there if method != "ensemble" and there > 0 else None,
        unit=unit,
    )


def _f(x: float | None, fmt: str, suffix: str = "") -> str:
    return "-" if x is None else format(x, fmt) + suffix


def _accept(r: Row) -> str:
    """What of the drafts was accepted: the rate where the level counts rejections, else accepted
    of the draft symbols judged."""
    if r.acceptance is not None:
        return format(r.acceptance, ".0%")
    return f"{r.accepted}/{r.drafted}" if r.drafted else "-"


def _columns(unit: str) -> list[tuple[str, int, Callable[[Row], str | None]]]:
    """The table's columns: header, width and the cell (None: the level does not count it; a
    column no row has a value for is left out)."""
    return [
        (f"{unit}/s", 10, lambda r: f"{r.per_second:.1f}"),
        ("speedup", 9, lambda r: _f(r.speedup, ".2f", "x")),
        ("worst", 7, lambda r: _f(r.min_prompt_speedup, ".2f", "x")),
        ("/big", 7, lambda r: _f(r.of_largest, ".2f", "x")),
        ("accept", 9, lambda r: _accept(r) if r.method != ALONE else "-"),
        ("acc/ver", 8, lambda r: None if r.acceptance is None and r.mean_accepted is None else _f(r.mean_accepted, ".2f")),
        ("no draft", 9, lambda r: None if r.ensemble_steps is None else str(r.ensemble_steps)),
        (f"calls/{unit.rstrip('s')}", 16, lambda r: "/".join(f"{c:.2f}" for c in r.calls_per_unit)),
        ("paths", 8, lambda r: None if not r.most_paths else "/".join(map(str, r.most_paths))),
        ("c", 7, lambda r: None if r.cost_ratio is None else f"{r.cost_ratio:.3f}"),
        ("b", 6, lambda r: None if r.batch_cost is None else f"{r.batch_cost:.2f}"),
        ("expect", 8, lambda r: None if r.expected is None else f"{r.expected:.2f}x"),
        ("meas/exp", 9, lambda r: None if r.measured_over_expected is None else f"{r.measured_over_expected:.2f}"),
        ("exp(b)", 8, lambda r: None if r.expected_with_batch_cost is None else f"{r.expected_with_batch_cost:.2f}x"),
        ("host", 7, lambda r: f"{r.host_fraction:.1%}"),
        ("same", 6, lambda r: None if r.same_text is None else str(r.same_text)),
        ("x there", 9, lambda r: None if r.vs_ensemble_there is None else f"{r.vs_ensemble_there:.2f}x"),
    ]


def format_table(rows: Sequence[Row], names: Sequence[str], title: str = "") -> str:
    """Plain-text tables, one per (task, temperature), in the rows' unit; a model alone is
    "alone-I" (model I). Columns no row has a value for (what the level does not count) are
    left out."""
    if not rows:
        return ""
    columns = [c for c in _columns(rows[0].unit) if any(c[2](r) is not None for r in rows)]
    header = f"{'configuration':<14}" + "".join(f"{name:>{width}}" for name, width, _ in columns)
    lines: list[str] = []
    current = None
    for r in rows:
        key = (r.task, r.temperature)
        if key != current:
            current = key
            if lines:
                lines.append("")
            lines.append(f"{title}task {r.task}, temperature {r.temperature:g}  (calls and paths: {' / '.join(names)})")
            lines.append(header)
        lines.append(f"{r.config:<14}" + "".join(f"{cell(r) or '-':>{width}}" for _, width, cell in columns))
    return "\n".join(lines)


class RssSampler:
    """Samples this process's resident memory in a background thread; `peak` is the highest seen."""

    def __init__(self, interval: float = 0.02) -> None:
        import threading

        self.interval = interval
        self.peak = current_rss_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, current_rss_mb())

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, current_rss_mb())


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def current_rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1024 * 1024)
    except OSError:
        return peak_rss_mb()


def write_json(path: str, report: dict) -> None:
    with atomic_write(path) as f:
        json.dump(report, f, indent=1)


def write_csv(path: str, rows: Sequence[Row]) -> None:
    with atomic_write(path, newline="") as f:
        w = csv.writer(f)
        for i, r in enumerate(rows):
            d = r.to_dict()
            if i == 0:
                w.writerow(list(d))
            w.writerow(["/".join(f"{x:.4f}" for x in v) if isinstance(v, list) else v for v in d.values()])


def machine() -> dict:
    import llama_cpp

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "llama_cpp_python": getattr(llama_cpp, "__version__", "?"),
        "gpu_offload_supported": bool(llama_cpp.llama_supports_gpu_offload()),
    }
