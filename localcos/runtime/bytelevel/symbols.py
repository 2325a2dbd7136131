"""r over the 257 symbols (256 bytes and the end) from the models' symbol distributions."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...core.combiners import BoundCombiner


# Models of different tokenizers rule out different symbols (one may end where the other cannot).
# A logit-level combiner (cd, logit-mix, a user's function) would turn log 0 into an infinite
# preference (cd's -mu * log p_amateur), so a symbol one model rules out and another allows gets
# this probability in the first one's row; a probability-level combiner (we) sees the exact rows.
RULED_OUT = 1e-9


def floor_ruled_out(dists: Sequence[np.ndarray | None]) -> list[np.ndarray | None]:
    """The models' symbol distributions with `RULED_OUT` where a model rules out a symbol another
    allows (symbols every model rules out stay at 0); None (a model not asked) stays None."""
    given = [d for d in dists if d is not None]
    allowed = np.logical_or.reduce([d > 0 for d in given])
    return [None if d is None else np.where(allowed & (d == 0), RULED_OUT, d) for d in dists]


def gate_opens(combiner: BoundCombiner, dists: Sequence[np.ndarray | None]) -> bool | None:
    """The byte level's one decision of a gated combination at a position: whether the gate
    opens there, from the lead's top symbol probability (`Gated.shut`); None without a gate."""
    gate = combiner.gate
    if gate is None:
        return None
    lead = dists[gate.lead]  # type: ignore[index]
    assert lead is not None, "the lead is asked for at every position"
    return not gate.shut(float(lead.max()))


def combine_symbols(combiner: BoundCombiner, dists: Sequence[np.ndarray | None], temperature: float, opened: bool | None = None) -> np.ndarray:
    """r over the 257 symbols from the models' symbol distributions (`RULED_OUT` where a
    logit-level combiner needs it), float64. A model r does not ask for at this position (not
    used by it, or a gate that stays shut) may be None. With a gate, `opened` is the decision the
    caller took (`gate_opens`), decided here the same way where it is None."""
    gate = combiner.gate
    if gate is not None and opened is None:
        opened = gate_opens(combiner, dists)
    if not combiner.mixes_probs:
        dists = floor_ruled_out(dists)
    with np.errstate(divide="ignore"):
        logits = [None if d is None else np.log(d)[None, :] for d in dists]
    r = combiner.combine(logits, temperature) if gate is None else gate.combine(logits, temperature, opened=np.array([opened]))
    return np.asarray(r[0], dtype=np.float64)
