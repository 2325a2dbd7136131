"""`localcos bench`: the CoS paper's comparison, measured side by side in one process.

Every configuration (method x gamma, and a model of the ensemble decoding alone: what a user
weighs the ensemble against) runs on the same prompts with the same seeds, interleaved:
for each temperature, each prompt and each repeat, all configurations run one after the other,
and the standard ensemble runs both first and last (A-B-A), so drift of the machine's speed
cancels out of the ratio and the two baseline runs show how noisy the timing is. Every speedup is
a ratio of tokens/second measured in the same conditions, seconds apart.
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
from dataclasses import asdict, dataclass
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from ..core.combiners import WeightedEnsemble
from ..core.speedmodel import expected_speedup
from ..ensemble import Ensemble
from ..files import atomic_write
from ..runtime.profile import cpu_name
from ..stats import GenerationStats


ALONE = "alone"  # the method name of a model decoding by itself (plain decoding)


@dataclass(frozen=True)
class Config:
    """One column of the comparison: a method and its proposal length, or one model alone."""

    method: str
    gamma: int | str | None  # None for ensemble; an int, or "auto"
    member: int | None = None  # method "alone": which model

    @property
    def label(self) -> str:
        if self.method == ALONE:
            return f"model {self.member} alone"
        return self.method if self.gamma is None else f"{self.method}/{self.gamma}"


@dataclass
class Run:
    """One generation of the benchmark: where it ran, and its statistics."""

    task: str
    prompt: int
    temperature: float
    repeat: int
    method: str
    gamma: int | str | None
    stats: GenerationStats
    again: bool = False  # the ensemble's second run of this prompt (after the other configurations)
    member: int | None = None  # method "alone": which model

    def to_dict(self) -> dict:
        return {**{k: v for k, v in asdict(self).items() if k != "stats"}, "stats": self.stats.to_dict()}


@dataclass
class Row:
    """Aggregated results of one configuration on one task at one temperature."""

    task: str
    temperature: float
    method: str
    gamma: int | str | None
    member: int | None  # method "alone": which model
    tokens: int
    seconds: float
    tokens_per_second: float
    speedup: float | None
    min_prompt_speedup: float | None
    acceptance: float | None
    mean_accepted: float | None
    calls_per_token: list[float]
    cost_ratio: float | None
    batch_cost: float | None
    expected: float | None
    measured_over_expected: float | None
    expected_with_batch_cost: float | None
    host_fraction: float
    of_largest: float | None = None  # tokens/s as a fraction of the largest model's alone


def alone(n_models: int, member: int) -> WeightedEnsemble:
    """r = that model's own distribution: the ensemble then evaluates only it (plain decoding)."""
    return WeightedEnsemble([1.0 if i == member else 0.0 for i in range(n_models)])


def configurations(methods: Sequence[str], gammas: Sequence[int | str], members: Sequence[int] = ()) -> list[Config]:
    """ensemble once, every other method once per gamma of the sweep, and each of `members`
    decoding alone."""
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
    ens: Ensemble,
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
    last; returns one `Run` per generation. A prompt is text, or token ids (a rendered chat)."""
    rounds = [(c, False) for c in configs] + [(c, True) for c in configs if c.method == "ensemble"]
    total = len(temperatures) * len(prompts) * repeat * len(rounds)
    done = 0
    # warm up: fault in the model weights and let the CPU settle before anything is timed
    ens.generate(prompts[0][1], method="ensemble", max_tokens=8, temperature=0, ignore_eos=True)
    runs: list[Run] = []
    for temperature in temperatures:
        for p, (task, prompt) in enumerate(prompts):
            for r in range(repeat):
                run_seed = seed + 1000 * p + r
                for config, again in rounds:
                    if progress:
                        progress(done, total, f"T={temperature:g} prompt {p + 1}/{len(prompts)} {config.label}")
                    single = config.method == ALONE
                    out = ens.generate(
                        prompt,
                        method="ensemble" if single else config.method,
                        combiner=alone(len(ens.models), config.member) if single else None,  # type: ignore[arg-type]
                        gamma=config.gamma,
                        proposer=proposer,
                        max_tokens=max_tokens,
                        temperature=temperature,
                        seed=run_seed,
                        ignore_eos=True,
                    )
                    runs.append(Run(task, p, temperature, r, config.method, config.gamma, out.stats, again, config.member))
                    done += 1
    if progress:
        progress(done, total, "done")
    return runs


@dataclass
class ThroughputRow:
    """Aggregate speed of `sequences` generations decoded together (`Batch`), one configuration."""

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
    ens: Ensemble,
    prompts: Sequence[tuple[str, str | Sequence[int]]],
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
    """Aggregate tokens/s with 1, 2, 4, ... sequences decoded together (`levels`; the ensemble is
    loaded with parallel >= max(levels)): each level decodes as many sequences as it allows, over
    `rounds` passes in which every level runs once, interleaved, so the ratios are measured side
    by side. Every sequence takes its own prompt (the prompts in turn)."""
    from ..config.specs import GenerationConfig
    from ..runtime.plan import plan
    from ..runtime.scheduler import Scheduler

    ens.generate(prompts[0][1], method="ensemble", max_tokens=8, temperature=0, ignore_eos=True)  # warm up
    rows: dict[tuple, ThroughputRow] = {}
    total = rounds * len(temperatures) * len(configs) * len(levels)
    done = 0
    for r in range(rounds):
        for temperature in temperatures:
            for config in configs:
                for level in levels:
                    if progress:
                        progress(done, total, f"T={temperature:g} {config.label} x{level}")
                    scheduler = Scheduler(ens, slots=range(level))
                    calls0 = [m.stats.calls for m in ens.models]
                    for k in range(level):
                        prompt = prompts[(k + r) % len(prompts)][1]
                        settings = GenerationConfig(method=config.method, gamma=config.gamma, proposer=proposer, temperature=temperature,
                                                    max_tokens=max_tokens, seed=seed + k, ignore_eos=True)  # fmt: skip
                        scheduler.submit(plan(ens, prompt, settings), np.random.default_rng(seed + k + 1000 * r))
                    t0 = time.perf_counter()
                    tokens = sum(done.completion.length for done in scheduler.run() if done.completion is not None)
                    seconds = time.perf_counter() - t0
                    key = (config.method, config.gamma, temperature, level)
                    row = rows.setdefault(key, ThroughputRow(config.method, config.gamma, temperature, level, 0, 0.0, [0] * len(ens.models)))
                    row.tokens += tokens
                    row.seconds += seconds
                    row.calls = [c + m.stats.calls - c0 for c, m, c0 in zip(row.calls, ens.models, calls0)]
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


def summarize(runs: Sequence[Run], proposer: int, n_models: int, largest_model: int | None = None) -> list[Row]:
    """Rows per (task, temperature, configuration), plus task "all". With `largest_model` (and
    its runs alone), every row's speed is also given as a fraction of that model's alone."""
    groups: dict[tuple, list[Run]] = defaultdict(list)
    for run in runs:
        for task in (run.task, "all"):
            groups[(task, run.temperature, run.method, run.gamma, run.member)].append(run)
    rows = []
    for (task, temperature, method, gamma, member), group in groups.items():
        baseline = groups.get((task, temperature, "ensemble", None, None), [])
        row = _row(task, temperature, method, gamma, group, baseline, proposer, n_models)
        row.member = member
        big = _tps(_total(groups.get((task, temperature, ALONE, None, largest_model), [])))
        row.of_largest = row.tokens_per_second / big if big > 0 else None
        rows.append(row)
    order = {"all": 0}
    rank = {ALONE: 0, "ensemble": 1}
    rows.sort(key=lambda r: (order.get(r.task, 1), r.task, r.temperature, rank.get(r.method, 2), r.method, r.member or 0, str(r.gamma)))
    return rows


def timing_noise(runs: Sequence[Run]) -> list[float]:
    """|1 - tok/s of the ensemble's second run / its first| for each prompt, temperature and
    repeat: the same work timed twice, seconds apart (how far apart identical runs land here)."""
    first = {(r.temperature, r.prompt, r.repeat): r for r in runs if r.method == "ensemble" and not r.again}
    out = []
    for r in runs:
        if r.method == "ensemble" and r.again and (r.temperature, r.prompt, r.repeat) in first:
            a, b = first[(r.temperature, r.prompt, r.repeat)].stats.tokens_per_second, r.stats.tokens_per_second
            if a and b:
                out.append(abs(1.0 - b / a))
    return out


def _total(runs: Iterable[Run]) -> GenerationStats | None:
    runs = list(runs)
    return GenerationStats.aggregate([r.stats for r in runs]) if runs else None


def _tps(stats: GenerationStats | None) -> float:
    return (stats.tokens_per_second or 0.0) if stats else 0.0


def _seconds_per_call(stats: GenerationStats) -> list[float]:
    return [m.seconds / max(1, m.calls) for m in stats.models]


def _row(task, temperature, method, gamma, group, baseline, proposer, n_models) -> Row:
    total = _total(group)
    base = _total(baseline)
    assert total is not None
    tps = _tps(total)
    base_tps = _tps(base)
    speedup = tps / base_tps if base_tps > 0 else None
    # worst prompt: the method against the ensemble on the same prompt (and repeats)
    per_prompt = []
    for p in sorted({r.prompt for r in group}):
        theirs = _tps(_total(r for r in baseline if r.prompt == p))
        if theirs > 0:
            per_prompt.append(_tps(_total(r for r in group if r.prompt == p)) / theirs)
    acceptance = total.acceptance_rate
    # cost ratio c: one proposer call / one call of the costliest other model, from the
    # ensemble's single-token calls
    c = b = None
    if base is not None and n_models >= 2 and method != ALONE:
        base_call = _seconds_per_call(base)
        others = [i for i in range(n_models) if i != proposer]
        verifier = max(others, key=lambda i: base_call[i])
        if base_call[verifier] > 0:
            c = base_call[proposer] / base_call[verifier]
            # b: what the verifier's calls cost here (batched) relative to a single-token call
            b = _seconds_per_call(total)[verifier] / base_call[verifier]
    expected = expected_b = None
    if method == "ensemble":
        expected = expected_b = 1.0
    elif method == ALONE:
        pass
    elif n_models == 2 and acceptance is not None and c is not None and isinstance(gamma, int):
        # the paper's cost model (a verifier pass costs one call whatever its length), and the
        # same with the batch cost b measured here
        expected = expected_speedup(method, acceptance, gamma, c)
        expected_b = expected_speedup(method, acceptance, gamma, c, batch_cost=b)
    return Row(
        task=task,
        temperature=temperature,
        method=method,
        gamma=gamma,
        member=None,
        tokens=total.tokens,
        seconds=total.seconds,
        tokens_per_second=tps,
        speedup=speedup,
        min_prompt_speedup=min(per_prompt) if per_prompt else None,
        acceptance=acceptance,
        mean_accepted=total.mean_accepted,
        calls_per_token=[x or 0.0 for x in total.model_calls_per_token()],
        cost_ratio=c,
        batch_cost=b,
        expected=expected,
        measured_over_expected=(speedup / expected) if speedup and expected else None,
        expected_with_batch_cost=expected_b,
        host_fraction=total.host_fraction or 0.0,
    )


def _f(x: float | None, fmt: str, none: str = "-") -> str:
    return none if x is None else format(x, fmt)


def format_table(rows: Sequence[Row], names: Sequence[str], title: str = "") -> str:
    """Plain-text tables, one per (task, temperature); a model alone is "alone-I" (model I)."""
    lines: list[str] = []
    header = (
        f"{'method':<11}{'gamma':>6}{'tok/s':>9}{'speedup':>9}{'worst':>7}{'/big':>7}{'accept':>8}{'acc/ver':>8}"
        f"{'calls/tok':>16}{'c':>7}{'b':>6}{'expect':>8}{'meas/exp':>9}{'exp(b)':>8}{'host':>7}"
    )
    current = None
    for r in rows:
        key = (r.task, r.temperature)
        if key != current:
            current = key
            if lines:
                lines.append("")
            lines.append(f"{title}task {r.task}, temperature {r.temperature:g}  (calls/tok: {' / '.join(names)})")
            lines.append(header)
        calls = "/".join(f"{c:.2f}" for c in r.calls_per_token)
        method = f"alone-{r.member}" if r.method == ALONE else r.method
        lines.append(
            f"{method:<11}{'-' if r.gamma is None else str(r.gamma):>6}{r.tokens_per_second:>9.1f}"
            f"{_f(r.speedup, '.2f'):>8}x{_f(r.min_prompt_speedup, '.2f'):>6}x{_f(r.of_largest, '.2f'):>6}x{_f(r.acceptance, '.0%'):>8}"
            f"{_f(r.mean_accepted, '.2f'):>8}{calls:>16}{_f(r.cost_ratio, '.3f'):>7}{_f(r.batch_cost, '.2f'):>6}"
            f"{_f(r.expected, '.2f'):>7}x{_f(r.measured_over_expected, '.2f'):>9}{_f(r.expected_with_batch_cost, '.2f'):>7}x"
            f"{r.host_fraction:>7.1%}"
        )
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
        w.writerow(list(Row.__dataclass_fields__))
        for r in rows:
            d = asdict(r)
            d["calls_per_token"] = "/".join(f"{c:.4f}" for c in r.calls_per_token)
            w.writerow(list(d.values()))


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
