"""The summary of an eval run (`summarize`, `table`): each configuration's level and pass@1 with
its Wilson interval, and each against a baseline problem by problem (won, lost, the exact McNemar
p and, for the several configurations compared, Holm's corrected p), with its speed relative to
the baseline's, over all problems and where both wrote the same text (the cost of the same work;
the slowest such text of `LONG_TEXT` characters or more in the JSON), and the share of its time
outside llama.cpp. Reads the results file; no I/O of its own."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any
from collections.abc import Iterable, Sequence

from .paired import Paired, holm, paired, wilson

if TYPE_CHECKING:
    from .codetasks import CodeTask
    from .configs import EvalConfig
    from .results import ResultsFile


@dataclass(frozen=True)
class ConfigSummary:
    """One configuration's results on the problems it completed, and how it compares with the
    baseline on the problems both completed."""

    name: str
    level: str  # the level it decoded at (a model alone in a byte-level run: token, its own tokens)
    n: int
    passed: int
    length: int
    seconds: float
    against: Paired | None  # None for the baseline itself
    speed: float | None  # its length per second over the baseline's, on the problems both ran
    host: float | None = None  # the share of its decoding time outside llama.cpp
    p_holm: float | None = None  # the McNemar p corrected for every configuration compared with the baseline (Holm)
    same: int = 0  # problems where it wrote the baseline's text
    same_speed: float | None = None  # its speed over the baseline's there: the cost of the same work
    slowest: float | None = None  # the lowest such ratio over a text of `LONG_TEXT` characters or more

    @property
    def pass_at_1(self) -> float:
        return self.passed / self.n if self.n else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(self.passed, self.n)

    @property
    def per_second(self) -> float | None:
        return self.length / self.seconds if self.seconds > 0 else None

    def to_dict(self) -> dict[str, Any]:
        lo, hi = self.interval
        out: dict[str, Any] = {"config": self.name, "level": self.level, "problems": self.n, "passed": self.passed, "pass_at_1": self.pass_at_1,
                               "interval_95": [lo, hi], "per_second": self.per_second, "speed_vs_baseline": self.speed}  # fmt: skip
        out["host_share"] = self.host
        if self.against is not None:
            a = self.against
            out["vs_baseline"] = {"problems": a.n, "won": a.won, "lost": a.lost, "difference": a.difference, "p_mcnemar": a.p, "p_holm": self.p_holm,
                                  "same_text": self.same, "speed_on_same_text": self.same_speed, "slowest_same_text": self.slowest}  # fmt: skip
        return out


LONG_TEXT = 100  # characters: a shared text this long or longer is timed well enough to be named alone (`slowest`)


def summarize(results: ResultsFile, tasks: Sequence[CodeTask], configs: Sequence[EvalConfig], baseline: str | None) -> tuple[str, list[ConfigSummary]]:
    """(the baseline's name, each configuration's summary) over `tasks`. The default baseline is
    the best model alone (most problems passed), else the first configuration."""
    ids = [t.task_id for t in tasks]
    done = {c.name: [results.get(c.name, i) for i in ids] for c in configs}
    if baseline is None:
        alone = [c for c in configs if c.alone]
        pool = alone or list(configs[:1])
        baseline = max(pool, key=lambda c: sum(bool(r and r["passed"]) for r in done[c.name])).name
    assert baseline in done, "the command line checks the baseline's name"
    base = done[baseline]
    out = []
    for c in configs:
        mine = done[c.name]
        ran = [r for r in mine if r is not None]
        both = [(r, b) for r, b in zip(mine, base) if r is not None and b is not None]
        against = None if c.name == baseline else paired([r["passed"] for r, _ in both], [b["passed"] for _, b in both])
        speed = _rate([r for r, _ in both]) / _rate([b for _, b in both]) if both and _rate([b for _, b in both]) else None
        seconds = sum(r["seconds"] for r in ran)
        host = (seconds - sum(r["llama_seconds"] for r in ran)) / seconds if seconds > 0 else None
        same = [(r, b) for r, b in both if r["completion"] == b["completion"]] if c.name != baseline else []
        same_speed = _rate([r for r, _ in same]) / _rate([b for _, b in same]) if same and _rate([b for _, b in same]) else None
        long = [_rate([r]) / _rate([b]) for r, b in same if len(r["completion"]) >= LONG_TEXT and _rate([b])]
        out.append(ConfigSummary(c.name, c.level.value, len(ran), sum(r["passed"] for r in ran), sum(r["length"] for r in ran), seconds, against, speed, host,
                                 same=len(same), same_speed=same_speed, slowest=min(long) if long else None))  # fmt: skip
    compared = [s for s in out if s.against is not None]
    corrected = dict(zip((s.name for s in compared), holm([s.against.p for s in compared])))  # type: ignore[union-attr]
    return baseline, [replace(s, p_holm=corrected.get(s.name)) for s in out]


def _rate(records: Iterable[dict[str, Any]]) -> float:
    records = list(records)
    seconds = sum(r["seconds"] for r in records)
    return sum(r["length"] for r in records) / seconds if seconds > 0 else 0.0


def table(baseline: str, summaries: Sequence[ConfigSummary], unit: str) -> list[list[str]]:
    """The rows people read: a header, then one row per configuration."""
    compared = sum(s.against is not None for s in summaries)
    rows = [["configuration", "level", "problems", "pass@1", "95% interval", "vs baseline", "won", "lost", "p (McNemar)", f"p (Holm, {compared})",
             f"{unit}/s", "speed", "host", "same text", "speed there"]]  # fmt: skip
    for s in summaries:
        lo, hi = s.interval
        a = s.against
        rows.append([
            s.name + (" (baseline)" if s.name == baseline else ""), s.level, str(s.n), f"{100 * s.pass_at_1:.1f}%", f"{100 * lo:.1f}-{100 * hi:.1f}",
            "" if a is None else f"{100 * a.difference:+.1f}", "" if a is None else str(a.won), "" if a is None else str(a.lost),
            "" if a is None else f"{a.p:.3g}", "" if s.p_holm is None else f"{s.p_holm:.3g}", "-" if s.per_second is None else f"{s.per_second:.1f}",
            "" if s.speed is None or a is None else f"{s.speed:.2f}x", "-" if s.host is None else f"{100 * s.host:.0f}%",
            "" if a is None else str(s.same), "" if s.same_speed is None else f"{s.same_speed:.2f}x",
        ])  # fmt: skip
    return rows
