"""A free proposer: draft tokens looked up in the context itself.

Code, chat about a text, edits and retrieval answers repeat what is already in the context. The
lookup proposer finds the longest suffix of the tokens so far (prompt included, the pending draft
too) that occurred before, at most `ngram_max` and at least `ngram_min` tokens long, the most
recent occurrence among the longest, and proposes the tokens that followed it (at most
`max_tokens`, never past the current end). It costs no model call: its tokens are verified in
the calls the models make anyway, as extra rows.

Its draft distribution is a point mass q = 1{x}: verification accepts x with probability r(x) and
on a rejection samples r with x removed and renormalised (`verify.verify`), which keeps the output
distributed exactly as r for any combiner and temperature; at T = 0 it accepts exactly when x is
r's argmax. (llama.cpp's ngram-simple looks up a fixed 12-gram and drafts up to 48 tokens; vLLM's
n-gram proposer tries sizes from a maximum down to a minimum, as here.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Callable, Sequence

import numpy as np

from .speedmodel import Acceptance

LOOKUP_MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class LookupSettings:
    """`mode`: off, on (draft whenever the context has a match) or auto (only when the extra
    verification rows are expected to cost less than the tokens they save)."""

    mode: str = "auto"
    ngram_min: int = 3
    ngram_max: int = 12
    max_tokens: int = 16


class ContextIndex:
    """The tokens of one completion so far, searchable for earlier occurrences of their suffix."""

    def __init__(self, tokens: Sequence[int], capacity: int) -> None:
        self._tokens = np.zeros(max(capacity, len(tokens), 1), dtype=np.int64)
        self.n = 0
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        k = len(tokens)
        if self.n + k > len(self._tokens):
            grown = np.zeros(max(2 * len(self._tokens), self.n + k), dtype=np.int64)
            grown[: self.n] = self._tokens[: self.n]
            self._tokens = grown
        self._tokens[self.n : self.n + k] = tokens
        self.n += k

    def truncate(self, n: int) -> None:
        self.n = min(self.n, n)

    def continuation(self, tail: Sequence[int], settings: LookupSettings) -> list[int]:
        """The tokens that followed the longest earlier occurrence of the suffix of
        tokens + `tail` (the pending draft), at most `settings.max_tokens` of them."""
        seq = self._tokens[: self.n]
        if tail:
            seq = np.concatenate([seq, np.asarray(tail, dtype=np.int64)])
        n = len(seq)
        lo = settings.ngram_min
        if n <= lo:
            return []
        # every earlier start j whose lo tokens equal the last lo tokens (vectorised over j)
        last = seq[n - lo :]
        hits = np.ones(n - lo, dtype=bool)
        for k in range(lo):
            hits &= seq[k : n - lo + k] == last[k]
        starts = np.flatnonzero(hits)
        if len(starts) == 0:
            return []
        # extend each match backwards, up to ngram_max; the longest, then the most recent, wins
        best_start, best_len = -1, 0
        for j in starts[::-1][:64]:  # the most recent first; a few dozen candidates at most
            length = lo
            while length < settings.ngram_max and j - (length - lo) - 1 >= 0 and seq[j - (length - lo) - 1] == seq[n - length - 1]:
                length += 1
            if length > best_len:
                best_start, best_len = int(j), length
                if length == settings.ngram_max:
                    break
        follow = best_start + lo
        return [int(t) for t in seq[follow : min(n, follow + settings.max_tokens)]]


def lookup_outcomes() -> Acceptance:
    """How lookup drafts fare, one completion's: the acceptance of their tokens, forgetting
    slowly (a text's repeats come and go over hundreds of tokens) from an even prior."""
    return Acceptance(decay=0.995, prior_alpha=0.5, prior_weight=4.0)


def worth_drafting(
    candidate: Sequence[int],
    alpha: float,
    extra_cost: Callable[[int], float],
    saving: float,
) -> int:
    """How many of `candidate`'s tokens are worth verifying (0: none): the k that maximises the
    expected cost saved, sum_{j<=k} alpha^j saving (`saving`: what one accepted token saves),
    minus `extra_cost(k)`, what k more rows add to the models' calls."""
    best_k, best_gain, saved, p = 0, 0.0, 0.0, 1.0
    for k in range(1, len(candidate) + 1):
        p *= alpha
        saved += p * saving
        gain = saved - extra_cost(k)
        if gain > best_gain:
            best_k, best_gain = k, gain
    return best_k


@dataclass
class LookupState:
    """One completion's lookup: its context index, how its drafts fare, the continuation it
    watches, and what the models' cells held after the prompt (`held`)."""

    settings: LookupSettings
    index: ContextIndex
    outcomes: Acceptance = field(default_factory=lookup_outcomes)
    # The tokens the cells held after this prompt when it began: the last completion of a prompt
    # this one begins (an editor's last suggestion, where the characters typed since are its
    # first). While the text follows them they are drafted first, all at once: they were
    # written from this very prefix.
    held: list[int] = field(default_factory=list)
    held_from: int = 0  # the position of held[0]
    # A continuation auto left out, watched against what gets committed. Every committed token is
    # a sample of r, so it equals a looked-up x with probability r(x), the probability that x's
    # verification would accept it: these verdicts cost nothing, and auto learns from them when
    # drafting would pay before it drafts.
    watched: list[int] = field(default_factory=list)  # the pending drafts' tokens, then the continuation
    watched_from: int = 0  # the position of watched[0]
    watched_drafts: int = 0  # how many of watched are pending drafts (their outcome is not lookup's)

    def drafts(self, position: int, pending: Sequence[int], room: int, extra_cost: Callable[[], Callable[[int], float]],
               saving: Callable[[], float]) -> list[int]:  # fmt: skip
        """The looked-up continuation of `pending` (the draft tokens after the committed ones,
        which end at `position`) to draft now, at most `room` tokens: all of it where the mode is
        on; in auto mode as many as pay (`worth_drafting`: an accepted one saves `saving()`,
        against what k of their rows add to the next calls, `extra_cost()(k)`), and where none
        does, the continuation watched instead. The costs are asked for only in auto mode, with
        a candidate to price."""
        if self.settings.mode == "off" or room <= 0:
            return []
        candidate = self.index.continuation(list(pending), self.settings)[:room]
        if not candidate:
            return []
        k = len(candidate)
        if self.settings.mode == "auto":
            k = worth_drafting(candidate, self.outcomes.alpha, extra_cost(), saving())
            if k == 0:
                self.watch(position, pending, candidate)
        return list(candidate[:k])

    def held_after(self, position: int, pending: Sequence[int]) -> list[int]:
        """The held tokens after `pending` (the draft tokens after the committed ones, which end
        at `position`), where the text so far follows them; else none."""
        i = position - self.held_from
        if not self.held or i < 0 or list(pending) != self.held[i : i + len(pending)]:
            return []
        return self.held[i + len(pending) :]

    def watch(self, position: int, drafts: Sequence[int], continuation: Sequence[int]) -> None:
        """Watch `continuation`, which would follow `drafts` from `position` on (one at a time)."""
        if not self.watched:
            self.watched, self.watched_from, self.watched_drafts = [*drafts, *continuation], position, len(drafts)

    def committed(self, position: int, token: int) -> None:
        """`token` was committed at `position`: a verdict on the watched continuation, maybe;
        the held tokens are let go where it is not theirs."""
        if self.held and 0 <= position - self.held_from < len(self.held) and self.held[position - self.held_from] != token:
            self.held = []
        i = position - self.watched_from
        if not self.watched or i < 0:
            return
        looked_up = i - self.watched_drafts  # tokens of the continuation before this one
        if i >= len(self.watched) or token != self.watched[i]:
            if looked_up >= 0 and i < len(self.watched):
                self.outcomes.observe(looked_up, 1)
            self.watched = []
        elif i + 1 == len(self.watched):
            self.outcomes.observe(len(self.watched) - self.watched_drafts, 0)
            self.watched = []
