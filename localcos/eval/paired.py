"""pass@1 with its interval, and configurations compared problem by problem with a baseline."""

from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Sequence

Z95 = 1.959963984540054  # the normal quantile of 0.975


def wilson(passed: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a rate passed / n (95% by default); (0, 1) for n = 0."""
    if n == 0:
        return 0.0, 1.0
    p = passed / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half))  # p inside, whatever the rounding


def mcnemar_exact(won: int, lost: int) -> float:
    """Two-sided exact McNemar p: of the problems where two configurations disagree, the chance
    of a split at least this uneven if each were equally likely to win it."""
    n = won + lost
    if n == 0:
        return 1.0
    k = min(won, lost)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


@dataclass(frozen=True)
class Paired:
    """One configuration against a baseline on the problems both ran: problems it won (passed
    where the baseline failed) and lost, the difference in pass@1 and its exact McNemar p."""

    n: int
    won: int
    lost: int

    @property
    def difference(self) -> float:
        return (self.won - self.lost) / self.n if self.n else 0.0

    @property
    def p(self) -> float:
        return mcnemar_exact(self.won, self.lost)


def paired(results: Sequence[bool], baseline: Sequence[bool]) -> Paired:
    """`results` against `baseline`, problem by problem (the same problems, in one order)."""
    if len(results) != len(baseline):
        raise ValueError("paired results need the same problems")
    won = sum(a and not b for a, b in zip(results, baseline))
    lost = sum(b and not a for a, b in zip(results, baseline))
    return Paired(len(results), won, lost)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of p values from several comparisons (each configuration
    against one baseline): the k-th smallest is multiplied by (m - k + 1), kept at least the one
    before and at most 1. A difference is significant at level a after the correction where the
    adjusted p is below a, whatever the number of comparisons."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    out = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out
