"""A grid over one combination parameter (`localcos score --sweep`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import ConfigError


@dataclass(frozen=True)
class Sweep:
    """A grid over one combination parameter: weights (of the first of two models; the second
    gets the rest), mu or plausibility."""

    name: str
    values: tuple[float, ...] = field(default_factory=tuple)

    def settings(self) -> list[dict[str, object]]:
        """Option values for each point of the grid."""
        if self.name == "weights":
            return [{"weights": (v, 1.0 - v)} for v in self.values]
        return [{self.name: v} for v in self.values]


def parse_sweep(text: str) -> Sweep:
    """weights=0:1:0.1 (start:stop:step, both ends included), mu=0,0.05,0.1 or plausibility=..."""
    name, sep, spec = text.partition("=")
    name = name.strip()
    if not sep or name not in ("weights", "mu", "plausibility"):
        raise ConfigError(f"--sweep must look like weights=0:1:0.1, mu=0,0.1,0.2 or plausibility=0.05,0.1; got {text!r}", param="sweep")
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
