"""A constraint kept in step with a completion's tokens (`SequenceConstraint`): which tokens are
allowed at each position of committed + pending, and distributions restricted to them. The
decoder asks it at every position it samples or verifies; a rejection rolls it back with the
caches."""

from __future__ import annotations

from typing import TYPE_CHECKING
from collections.abc import Callable, Sequence

import numpy as np

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..grammar import Matcher


class SequenceConstraint:
    """`matcher` (structured output) following a completion's sequence after its `n_prompt`
    prompt tokens: `sequence()` the tokens so far (committed, then pending), `committed()` how many
    of them are committed. The matcher follows lazily, to the position asked; masks are kept per
    position while that position can still be verified."""

    def __init__(self, matcher: Matcher, n_prompt: int, sequence: Callable[[], list[int]], committed: Callable[[], int]) -> None:
        self.matcher = matcher
        self.n_prompt = n_prompt
        self._sequence = sequence
        self._committed = committed
        self.masks: dict[int, np.ndarray] = {}  # masks[p]: the tokens allowed at position p
        self._allowed: np.ndarray | None = None  # a reused vocabulary-sized buffer
        self._settled = 0  # tokens after the prompt the matcher consumed that are committed

    @property
    def consumed(self) -> list[int]:
        """The tokens the matcher has consumed (after the prompt)."""
        return self.matcher.consumed

    def mask(self, position: int) -> np.ndarray | None:
        """The bitmask at `position`: the tokens allowed after sequence()[:position]; None past a
        pending token the constraint refuses (a draft made without it), where r does not matter:
        verification rejects that token first, as r gives it nothing."""
        if position in self.masks:
            return self.masks[position]
        if not self._sync(position):
            return None
        kept = self.masks[position] = self.matcher.mask()
        return kept

    def allows(self, token: int, position: int) -> bool:
        mask = self.mask(position)
        return mask is not None and self.matcher.allows(token, mask)

    def restrict(self, rows: np.ndarray, positions: Sequence[int], logits: bool = False) -> np.ndarray:
        """Rows (probabilities, renormalised, or logits) with the disallowed tokens removed, in
        place. A row the constraint leaves without mass (r is zero, in float32, on every allowed
        token) becomes uniform over the allowed tokens."""
        from ..grammar import unpack

        vocab = rows.shape[1]
        if self._allowed is None or len(self._allowed) != vocab:
            self._allowed = np.empty(vocab, dtype=bool)
        for row, position in zip(rows, positions):
            mask = self.mask(position)
            if mask is None:
                continue  # past a refused draft token: never sampled from (see `mask`)
            allowed = unpack(mask, vocab, out=self._allowed)
            if logits:
                row[~allowed] = -np.inf
                continue
            row[~allowed] = 0.0
            total = row.sum(dtype=np.float64)
            if total > 0:
                row /= np.float32(total)
                continue
            n_allowed = int(allowed.sum())
            if n_allowed == 0:
                raise ConfigError("the constraint allows no token of this vocabulary here (does it fit these models' tokenizer?)", param=self.matcher.kind)
            row[allowed] = np.float32(1.0 / n_allowed)
        return rows

    def forget(self, before: int | None = None, after: int | None = None) -> None:
        """Drop the masks of positions before `before` (committed: never verified again) or after
        `after` (rolled back)."""
        for p in [p for p in self.masks if (before is not None and p < before) or (after is not None and p > after)]:
            del self.masks[p]

    def _sync(self, position: int) -> bool:
        """Bring the matcher to exactly the tokens after the prompt before `position`; False when
        one of them is refused (the matcher stops before it)."""
        want = self._sequence()[self.n_prompt : position]
        have = self.matcher.consumed
        n = min(len(want), len(have))
        k = min(self._settled, n)  # committed tokens it consumed never change
        while k < n and want[k] == have[k]:
            k += 1
        self.matcher.rollback(len(have) - k)
        committed = self._committed() - self.n_prompt
        self._settled = min(k, committed)
        for token in want[k:]:
            if not self.matcher.consume(token):
                return False
        self._settled = min(len(want), committed)
        return True
