"""A grid over one or two combination parameters (`localcos score --sweep`, given once or twice)."""

from __future__ import annotations

import math
import itertools
from dataclasses import dataclass, field
from collections.abc import Sequence

from ..core.combiners import COMBINERS
from ..errors import ConfigError


SWEEPABLE = ("weights", "mu", "plausibility", "gate")


def combiners_for(parameter: str) -> tuple[str, ...] | None:
    """The built-in combiners a swept parameter belongs to: those the registry says read it
    (a combiner registered later included); None for the gate, which every combiner takes."""
    if parameter == "gate":
        return None
    return tuple(name for name, kind in COMBINERS.items() if parameter in kind.reads)


@dataclass(frozen=True)
class Sweep:
    """A grid over one combination parameter: weights (of the first of two models; the second
    gets the rest), mu, plausibility or gate."""

    name: str
    values: tuple[float, ...] = field(default_factory=tuple)

    def settings(self) -> list[dict[str, object]]:
        """Option values for each point of the grid."""
        if self.name == "weights":
            return [{"weights": (v, 1.0 - v)} for v in self.values]
        return [{self.name: v} for v in self.values]


def parse_sweep(text: str) -> Sweep:
    """weights=0:1:0.1 (start:stop:step, both ends included), mu=0,0.05,0.1, plausibility=... or
    gate=..."""
    name, sep, spec = text.partition("=")
    name = name.strip()
    if not sep or name not in SWEEPABLE:
        raise ConfigError(f"--sweep must look like weights=0:1:0.1, mu=0,0.1,0.2, plausibility=0.05,0.1 or gate=0.3,0.5,0.9; got {text!r}",
                          param="sweep")  # fmt: skip
    try:
        if ":" in spec:
            start, stop, step = (float(x) for x in spec.split(":"))
            if step <= 0 or stop < start:
                raise ValueError
            count = int(round((stop - start) / step)) + 1
            values = tuple(round(start + i * step, 10) for i in range(count) if start + i * step <= stop + 1e-9)
        else:
            values = tuple(float(x) for x in spec.split(","))
    except ValueError:
        raise ConfigError(f"--sweep {name}: values must be START:STOP:STEP or comma-separated numbers, got {spec!r}", param="sweep") from None
    if not values or any(not math.isfinite(v) for v in values):
        raise ConfigError(f"--sweep {name}: no values in {spec!r}", param="sweep")
    if name == "weights" and any(not 0 <= v <= 1 for v in values):
        raise ConfigError("--sweep weights takes the first model's weight, from 0 to 1", param="sweep")
    return Sweep(name, values)


def grid(sweeps: Sequence[Sweep]) -> list[dict[str, object]]:
    """Option values at every point of the grid of one or two sweeps (the second varies fastest);
    one point with nothing changed for none."""
    if len({s.name for s in sweeps}) < len(sweeps):
        raise ConfigError("--sweep: each parameter once", param="sweep")
    if len(sweeps) > 2:
        raise ConfigError("--sweep: two parameters at most (a grid of their values)", param="sweep")
    return [dict(item for point in points for item in point.items()) for points in itertools.product(*(s.settings() for s in sweeps))]


def label(point: dict[str, object]) -> str:
    """How a point of the grid is shown: "gate 0.5, mu 0.1" ("" for none)."""
    parts = []
    for key, value in point.items():
        if key == "weights":
            parts.append("weights " + ",".join(f"{w:g}" for w in value))  # type: ignore[attr-defined]
        else:
            parts.append(f"{key} {value:g}")
    return ", ".join(parts)

