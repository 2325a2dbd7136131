"""Lookahead's branches (`strategies.Lookahead`): beside each member's own sequence, the
sequences that roll out candidate continuations from the committed tokens, sharing its cells
(llama.cpp's seq_cp), and what looking ahead came to."""

from __future__ import annotations

from typing import TYPE_CHECKING
from collections.abc import Sequence

if TYPE_CHECKING:
    from ..backend import Slot


class Branches:
    """Per member, its own sequence and its branches' sequences after it (branch j is index j,
    1 on); the positions looked ahead from (`looked_ahead`) and those where a branch other than
    r's likeliest token won (`changed`). Empty where the models were loaded without branches."""

    def __init__(self, sequences: Sequence[Sequence[Slot]] = ()) -> None:
        self.sequences = [list(member) for member in sequences]
        self.looked_ahead = 0
        self.changed = 0

    def out(self, k: int) -> None:
        """Branches 1 to k of every member hold what its own sequence holds (the same cells): each
        starts from the committed tokens; the sequence itself is left as it is until one wins."""
        assert self.sequences and k < len(self.sequences[0]), "the plan checks that the branches were loaded"
        for own, *others in self.sequences:
            for branch in others[:k]:
                branch.hold(own)

    def keep(self, j: int) -> None:
        """Branch j (1 on) won: every member's own sequence holds what that branch holds (its
        cells), and every branch's sequence is emptied, so nothing of a losing branch stays in
        any cache. Counted: a look ahead, changed where j is not branch 1 (r's likeliest)."""
        for own, *others in self.sequences:
            own.hold(others[j - 1])
            for branch in others:
                branch.truncate(0)
        self.looked_ahead += 1
        self.changed += j != 1
