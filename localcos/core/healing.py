"""The cursor's token healed: a fill-in-the-middle prompt takes back the last token before the
cursor, and the generation must begin with its bytes, in whatever tokens the model chooses (so the
model, not the tokenizer, decides how the text at the cursor is cut into tokens: ` retu` typed may
go on as ` return`, a line's indentation as the model's own indentation token).

The rule is a constraint on the first tokens only (`Healing`, a matcher as `core.constrained`
follows one): while the healed bytes are not all written, a token is allowed where its bytes
begin with the healed bytes still to come, or are a beginning of them that leaves a rest some
tokens can still write; after that, every token. It
masks r and every draft distribution like any constraint, so each method stays exact for the
constrained r. `TokenBytes` finds the agreeing tokens without a Python loop over the vocabulary:
the tokens sorted by their bytes, those that begin with some bytes a range of that order.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

import numpy as np


class TokenBytes:
    """A vocabulary's tokens by their bytes (`pieces[t]`, b"" for a token that writes no text,
    which never agrees), sorted once."""

    def __init__(self, pieces: Sequence[bytes]) -> None:
        self.pieces = list(pieces)
        self.n_vocab = len(self.pieces)
        order = sorted((p, t) for t, p in enumerate(self.pieces) if p)
        self._sorted = [p for p, _ in order]
        self._ids = np.array([t for _, t in order], dtype=np.int64)
        self._by_bytes: dict[bytes, list[int]] = {}
        for p, t in order:
            self._by_bytes.setdefault(p, []).append(t)

    def beginning_with(self, data: bytes) -> np.ndarray:
        """The ids of the tokens whose bytes begin with `data` (not empty)."""
        lo = bisect_left(self._sorted, data)
        hi = len(self._sorted) if (after := _after(data)) is None else bisect_left(self._sorted, after, lo)
        return self._ids[lo:hi]

    def exactly(self, data: bytes) -> list[int]:
        """The ids of the tokens whose bytes are `data`."""
        return self._by_bytes.get(data, [])


def _after(data: bytes) -> bytes | None:
    """The least bytes greater than every string that begins with `data` (None: none is)."""
    stripped = data.rstrip(b"\xff")
    return stripped[:-1] + bytes([stripped[-1] + 1]) if stripped else None


class Healing:
    """The healed bytes as a matcher over one completion (`core.constrained.SequenceConstraint`
    follows it): the tokens it has consumed, how much of the healed bytes each covered, and the
    mask of the tokens allowed next while the healed bytes are not all written (`binds`)."""

    kind = "infill_layout"  # the option that asked for it, which errors name

    def __init__(self, vocabulary: TokenBytes, healed: bytes) -> None:
        if not healed:
            raise ValueError("nothing to heal")
        self.vocabulary = vocabulary
        self.healed = healed
        self.consumed: list[int] = []
        self._covered = [0]  # of the healed bytes, how many were written after each consumed token
        # writable[i]: some tokens write healed[i:] (and go on); the last token's own bytes always can
        self._writable = [False] * len(healed) + [True]
        for i in range(len(healed) - 1, -1, -1):
            self._writable[i] = len(vocabulary.beginning_with(healed[i:])) > 0 or any(
                self._writable[j] and vocabulary.exactly(healed[i:j]) for j in range(i + 1, len(healed)))

    def binds(self) -> bool:
        """Whether the next token is constrained (some healed bytes are still to be written)."""
        return self._covered[-1] < len(self.healed)

    def mask(self) -> np.ndarray:
        """The tokens allowed next: one bit per token id, in int32 words (as `grammar.Matcher`'s)."""
        allowed = np.zeros((self.vocabulary.n_vocab + 31) // 32 * 32, dtype=bool)
        if self.binds():
            at = self._covered[-1]
            allowed[self.vocabulary.beginning_with(self.healed[at:])] = True
            for j in range(at + 1, len(self.healed)):
                if self._writable[j]:
                    allowed[self.vocabulary.exactly(self.healed[at:j])] = True
        else:
            allowed[: self.vocabulary.n_vocab] = True
        return np.packbits(allowed, bitorder="little").view(np.int32)

    def consume(self, token: int) -> bool:
        """Consume a token; False (and nothing consumed) where it disagrees with the healed bytes."""
        covered = self._covered[-1]
        if covered < len(self.healed):
            piece, rest = self.vocabulary.pieces[token], self.healed[covered:]
            if not piece or not (piece.startswith(rest) or rest.startswith(piece) and self._writable[covered + len(piece)]):
                return False
            covered = min(len(self.healed), covered + len(piece))
        self.consumed.append(int(token))
        self._covered.append(covered)
        return True

    def rollback(self, n: int) -> None:
        if n > 0:
            del self.consumed[-n:]
            del self._covered[-n:]
