"""A constraint kept in step with a completion's tokens (`SequenceConstraint`): which tokens are
allowed at each position of committed + pending, and distributions restricted to them. The
decoder asks it at every position it samples or verifies; a rejection rolls it back with the
caches."""

from __future__ import annotations

from typing import Protocol
from collections.abc import Callable, Sequence

import numpy as np

from ..errors import ConfigError


class TokenMatcher(Protocol):
    """What a constraint's state over one completion answers (`grammar.Matcher`: structured
    output; `core.healing.Healing`: the cursor's token healed): the tokens consumed, whether it
    constrains the next token at all, and the mask of those allowed (one bit per token id, in
    int32 words)."""

    @property
    def kind(self) -> str: ...
    @property
    def consumed(self) -> list[int]: ...
    def binds(self) -> bool: ...
    def mask(self) -> np.ndarray: ...
    def consume(self, token: int) -> bool: ...
    def rollback(self, n: int) -> None: ...


# the mask of a position the constraint leaves free: every token, nothing to restrict
FREE = np.zeros(0, dtype=np.int32)


def allowed(mask: np.ndarray, token: int) -> bool:
    """Whether `mask` (one bit per token id) has `token`'s bit."""
    return mask is FREE or bool((int(mask[token >> 5]) >> (token & 31)) & 1)


class Both:
    """Two matchers at once (the cursor's token healed under a grammar): a token both allow."""

    def __init__(self, first: TokenMatcher, second: TokenMatcher) -> None:
        self.first, self.second = first, second
        self.kind = second.kind

    @property
    def consumed(self) -> list[int]:
        return self.first.consumed

    def binds(self) -> bool:
        return self.first.binds() or self.second.binds()

    def mask(self) -> np.ndarray:
        if not self.first.binds():
            return self.second.mask()
        if not self.second.binds():
            return self.first.mask()
        return self.first.mask() & self.second.mask()

    def consume(self, token: int) -> bool:
        if not self.first.consume(token):
            return False
        if not self.second.consume(token):
            self.first.rollback(1)
            return False
        return True

    def rollback(self, n: int) -> None:
        self.first.rollback(n)
        self.second.rollback(n)


class SequenceConstraint:
    """`matcher` (structured output, the cursor's token healed) following a completion's
    sequence after its `n_prompt` prompt tokens: `sequence()` the tokens so far (committed, then
    pending), `committed()` how many of them are committed. The matcher follows lazily, to the
    position asked; masks are kept per position while that position can still be verified (`FREE`
    where the matcher no longer binds)."""

    def __init__(self, matcher: TokenMatcher, n_prompt: int, sequence: Callable[[], list[int]], committed: Callable[[], int]) -> None:
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
        kept = self.masks[position] = self.matcher.mask() if self.matcher.binds() else FREE
        return kept

    def binds(self, position: int) -> bool:
        """Whether the constraint restricts anything at `position`."""
        return self.mask(position) is not FREE

    def allows(self, token: int, position: int) -> bool:
        mask = self.mask(position)
        return mask is not None and allowed(mask, token)

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
            if mask is None or mask is FREE:
                continue  # past a refused draft token: never sampled from (see `mask`); or free
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
