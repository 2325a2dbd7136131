"""Speculative verification against the combined distribution, vectorised over the draft.

Draft token x_j was sampled from q_j (its proposer's distribution); r_j is the combined distribution
at its position. Token j is accepted with probability min(1, r_j(x_j) / q_j(x_j)); at the first
rejection a token is resampled from the residual max(0, r_j - q_j) / Z and every later draft
token is discarded. The emitted tokens are then distributed exactly as r (Leviathan et al. 2023;
CoS paper, Appendix A.1), and the acceptance rate is 1 - TV(r, q).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .sampling import draw

# Rejection happens with probability Z = sum max(0, r - q) = TV(r, q). Below this, r and q agree to
# float32 rounding error, a rejection is a rounding artefact and the residual is noise: sample r
# instead (this changes the output distribution by at most Z).
RESIDUAL_EPS = 1e-6


@dataclass(frozen=True)
class Verdict:
    """Outcome of verifying a draft: how many leading tokens were accepted, and the token
    resampled from the residual in place of the first rejected one (None when every token was
    accepted)."""

    accepted: int
    resample: int | None


def verify(draft: Sequence[int], proposal: np.ndarray, target: np.ndarray, rng: np.random.Generator) -> Verdict:
    """Verify `draft` (m tokens) against `target` rows r given the `proposal` rows q they came from.

    Both arrays have shape [m, vocab] and rows that sum to 1. Uses m + 1 uniforms at most.
    """
    m = len(draft)
    if m == 0:
        return Verdict(0, None)
    x = np.asarray(draft, dtype=np.int64)
    rows = np.arange(m)
    q_x = proposal[rows, x]
    r_x = target[rows, x]
    u = rng.random(m)
    # accept with probability min(1, r/q), written without dividing: u * q < r
    accepted = u * q_x < r_x
    if accepted.all():
        return Verdict(m, None)
    j = int(np.argmin(accepted))
    return Verdict(j, sample_residual(target[j], proposal[j], rng))


def sample_residual(r: np.ndarray, q: np.ndarray, rng: np.random.Generator) -> int:
    """Sample from max(0, r - q) / Z; from r itself when Z is (numerically) zero."""
    residual = np.maximum(r - q, 0.0)
    z = float(residual.sum(dtype=np.float64))
    u = float(rng.random())
    if z <= RESIDUAL_EPS:
        return draw(r, u)
    return draw(residual, u)
