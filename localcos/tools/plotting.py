"""Figures of the bench and of score, drawn with matplotlib (an optional dependency: a command
asked for a plot checks for it before any model loads)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from collections.abc import Sequence

from ..errors import ConfigError
from ..files import atomic_path

if TYPE_CHECKING:
    from ..scoring.sweep import Sweep
    from .bench import Row


def require_matplotlib() -> Any:
    """matplotlib's pyplot (drawing to files), or one line saying how to install it: checked
    before any model loads when a command is asked for a plot."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'localcos[plot]'", param="plot") from None
    return plt


def save(fig: Any, path: str) -> None:
    """Write a figure to `path` whole (in the format its suffix names) or not at all."""
    from pathlib import Path

    with atomic_path(path) as temp:
        fig.savefig(temp, dpi=120, format=Path(path).suffix.lstrip(".") or "png")


def plot_speedups(path: str, rows: Sequence[Row], title: str) -> None:
    """Speedup against gamma, one line per method, one panel per temperature (task "all")."""
    plt = require_matplotlib()
    from matplotlib.ticker import MaxNLocator

    rows = [r for r in rows if r.task == "all"]
    temps = sorted({r.temperature for r in rows})
    fig, axes = plt.subplots(1, len(temps), figsize=(5 * len(temps), 4), squeeze=False)
    for ax, t in zip(axes[0], temps):
        for method in ("sd", "naive-cos", "cos"):
            pts = sorted((r.gamma, r.speedup) for r in rows if r.temperature == t and r.method == method and isinstance(r.gamma, int))
            if pts:
                ax.plot([g for g, _ in pts], [s for _, s in pts], marker="o", label=method)
            auto = [r.speedup for r in rows if r.temperature == t and r.method == method and r.gamma == "auto"]
            if auto and auto[0]:
                ax.axhline(auto[0], linestyle=":", linewidth=1, color=ax.lines[-1].get_color() if pts else None, label=f"{method} auto")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("gamma (proposal length)")
        ax.set_ylabel("speedup over the standard ensemble")
        ax.set_title(f"{title} T={t:g}")
        ax.legend()
    fig.tight_layout()
    save(fig, path)


def plot_sweep(path: str, sweeps: Sequence[Sweep], rows: Sequence[tuple], metric: str) -> None:
    """The score of r over a sweep's grid (two sweeps: one line per value of the second), each
    model alone as a dotted line."""
    plt = require_matplotlib()
    fig, ax = plt.subplots(figsize=(6, 4))
    combined = [v for kind, _, v, _ in rows if kind == "r"]
    first = sweeps[0]
    inner = sweeps[1].values if len(sweeps) > 1 else (None,)
    for j, value in enumerate(inner):
        line = combined[j :: len(inner)]
        ax.plot(list(first.values), line, marker="o", label="combination r" if value is None else f"r, {sweeps[1].name} {value:g}")
    for kind, label, value, _ in rows:
        if kind == "model":
            ax.axhline(value, linestyle=":", linewidth=1, label=f"{label} alone")
    ax.set_xlabel("weight of the first model" if first.name == "weights" else first.name)
    ax.set_ylabel(metric)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save(fig, path)


def plot_eval(path: str, title: str, baseline: str, summaries: Sequence[Any]) -> None:
    """pass@1 of each configuration with its 95% interval (`localcos eval`), the baseline's as a
    dotted line."""
    plt = require_matplotlib()
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(summaries) + 1.5))
    names = [s.name for s in summaries]
    rates = [100 * s.pass_at_1 for s in summaries]
    low = [100 * (s.pass_at_1 - s.interval[0]) for s in summaries]
    high = [100 * (s.interval[1] - s.pass_at_1) for s in summaries]
    ax.barh(names, rates, xerr=[low, high], capsize=3, color=["grey" if n == baseline else "C0" for n in names])
    ax.axvline(100 * next(s.pass_at_1 for s in summaries if s.name == baseline), linestyle=":", color="grey")
    ax.invert_yaxis()
    ax.set_xlabel("pass@1 (%), 95% interval")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    save(fig, path)

