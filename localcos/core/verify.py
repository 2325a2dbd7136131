"""Speculative verification against the combined distribution, vectorised over the draft.

Draft token x_j was sampled from q_j (its proposer's distribution); r_j is the combined distribution
at its position. Token j is accepted with probability min(1, r_j(x_j) / q_j(x_j)); at the first
rejection a token is resampled from the residual max(0, r_j - q_j) / Z and every later draft
token is discarded. The emitted tokens are then distributed exactly as r (Leviathan et al. 2023;
CoS paper, Appendix A.1), and the acceptance rate is 1 - TV(r, q).

A draft token looked up in the context (`core.lookup`) was not sampled: its q is a point mass at
x. It is accepted with probability r(x), and the residual max(0, r - 1{x}) / Z is r with x
removed, renormalised; the same argument gives r (vLLM's rejection sampler treats n-gram drafts
the same way). Such a draft's proposal row is None: no vocabulary-sized one-hot row is made.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence

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


def verify(
    draft: Sequence[int], proposal: np.ndarray | Sequence[np.ndarray | None], target: np.ndarray, rng: np.random.Generator
) -> Verdict:
    """Verify `draft` (m tokens) against `target` rows r given the `proposal` rows q they came from.

    `target` has shape [m, vocab]; `proposal` too, or is a list of m rows where None stands for
    a point mass at the draft token (a looked-up draft). Rows sum to 1. Uses m + 1 uniforms at
    most.
    """
    m = len(draft)
    if m == 0:
        return Verdict(0, None)
    x = np.asarray(draft, dtype=np.int64)
    rows = np.arange(m)
    if isinstance(proposal, np.ndarray):
        q_x = proposal[rows, x]
    else:
        q_x = np.array([1.0 if q is None else q[t] for q, t in zip(proposal, draft)], dtype=np.float64)
    r_x = target[rows, x]
    u = rng.random(m)
    # accept with probability min(1, r/q), written without dividing: u * q < r
    accepted = u * q_x < r_x
    if accepted.all():
        return Verdict(m, None)
    j = int(np.argmin(accepted))
    q = proposal[j]
    if q is None:
        return Verdict(j, sample_without(target[j], int(x[j]), rng))
    return Verdict(j, sample_residual(target[j], q, rng))


def sample_without(r: np.ndarray, x: int, rng: np.random.Generator) -> int:
    """Sample from r with token x removed, renormalised: the residual of a point mass at x.
    (When r is all x, to rounding, x was rejected with probability below RESIDUAL_EPS: r.)"""
    kept = r[x]
    if 1.0 - float(kept) <= RESIDUAL_EPS:
        return draw(r, float(rng.random()))
    r[x] = 0.0  # r is the decoder's own fresh array; put back below
    try:
        return draw(r, float(rng.random()))
    finally:
        r[x] = kept


def sample_residual(r: np.ndarray, q: np.ndarray, rng: np.random.Generator) -> int:
    """Sample from max(0, r - q) / Z; from r itself when Z is (numerically) zero."""
    residual = np.maximum(r - q, 0.0)
    z = float(residual.sum(dtype=np.float64))
    u = float(rng.random())
    if z <= RESIDUAL_EPS:
        return draw(r, u)
    return draw(residual, u)
