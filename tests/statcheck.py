"""Statistical checks for sampling tests, on scipy.stats.

Every sampling test draws with a fixed seed, compares counts with the exact distribution by a
chi-square goodness-of-fit test, and fails when the p-value is below `ALPHA`. With a correct
sampler a given seed fails with probability ALPHA, and then deterministically; with a wrong one
the test fails as soon as the sample is large enough to see the error, which the sample sizes are
chosen for.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping

import numpy as np
from scipy import stats

ALPHA = 1e-4


def chi_square(counts: Mapping[int, int], probs: np.ndarray, min_expected: float = 5.0) -> tuple[float, int, float]:
    """Chi-square goodness of fit of observed `counts` (token -> count) to `probs`.

    Categories whose expected count is below `min_expected` are pooled into one "other" bucket
    (also pooled with the smallest category if the bucket itself stays too small), so the
    chi-square approximation holds. Observations of a token with probability 0 make the p-value
    0. Returns (statistic, dof, p-value).
    """
    n = sum(counts.values())
    probs = np.asarray(probs, dtype=np.float64)
    impossible = [t for t, c in counts.items() if c and probs[t] <= 0]
    if impossible:
        return math.inf, 0, 0.0
    expected = probs * n
    big = np.flatnonzero(expected >= min_expected)
    obs = [counts.get(int(t), 0) for t in big]
    exp = list(expected[big])
    rest_obs = n - sum(obs)
    rest_exp = n - sum(exp)
    if rest_exp >= min_expected:
        obs.append(rest_obs)
        exp.append(rest_exp)
    elif rest_exp > 1e-12 and exp:
        j = int(np.argmin(exp))
        obs[j] += rest_obs
        exp[j] += rest_exp
    if len(obs) < 2:
        return 0.0, 0, 1.0
    exp_arr = np.asarray(exp) * (n / sum(exp))  # rounding: scipy wants equal totals
    stat, p = stats.chisquare(np.asarray(obs, dtype=np.float64), exp_arr)
    return float(stat), len(obs) - 1, float(p)


def assert_matches(samples: list[int] | Counter, probs: np.ndarray, what: str = "samples") -> float:
    """Fail unless `samples` are consistent with `probs` at level ALPHA; returns the p-value."""
    counts = samples if isinstance(samples, Counter) else Counter(samples)
    stat, dof, p = chi_square(counts, probs)
    assert p >= ALPHA, f"{what}: chi-square {stat:.1f} on {dof} dof, p = {p:.2e} < {ALPHA} (n = {sum(counts.values())})"
    return p


def assert_law(completions: Iterable, law: Mapping[tuple[int, ...], float], what: str) -> float:
    """Fail unless the completions' token sequences follow `law` (sequence -> probability, every
    sequence of positive probability): none outside it, their counts consistent with it."""
    index = {s: i for i, s in enumerate(law)}
    counts: Counter = Counter()
    for c in completions:
        seq = tuple(c.token_ids)
        assert seq in index, f"{what}: wrote {seq}, which has probability 0"
        counts[index[seq]] += 1
    return assert_matches(counts, np.array(list(law.values())), what)
