"""One sequence of a model's KV cache (`Slot`): exactly the tokens it holds, evaluated, rolled
back, shared and prefilled on its own or in one call with other slots (`Model.decode`); the
counters of a model's and a slot's calls (`ModelStats`); and the calls a prompt goes in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from ..errors import Cancelled

# the most prompt tokens one call evaluates (within n_batch): a scheduler interleaves a long
# prompt's calls with other sequences' rounds, and a prompt is evaluated in calls of this many
# tokens from its start wherever it must be computed as a fresh process computes it
PROMPT_CHUNK = 256


@dataclass
class ModelStats:
    """Work done by one model: llama_decode calls, tokens evaluated, seconds inside llama.cpp."""

    calls: int = 0
    tokens: int = 0
    seconds: float = 0.0

    def reset(self) -> None:
        self.calls, self.tokens, self.seconds = 0, 0, 0.0

    def snapshot(self) -> ModelStats:
        return ModelStats(self.calls, self.tokens, self.seconds)

    def minus(self, earlier: ModelStats) -> ModelStats:
        return ModelStats(
            self.calls - earlier.calls, self.tokens - earlier.tokens, self.seconds - earlier.seconds
        )

    def plus(self, other: ModelStats) -> ModelStats:
        return ModelStats(self.calls + other.calls, self.tokens + other.tokens, self.seconds + other.seconds)


# the rows per call `CallTimes` keeps (drafts and verifications; a prompt's calls are larger),
# and how fast what it keeps fades: by a factor per call of the model, so a count stale for a
# few hundred calls weighs little, and a plan that stopped making it tries it again
MEASURED_ROWS = 16
CALL_DECAY = 0.995


class CallTimes:
    """What one model's calls of each row count took in this process, as they ran (`Model.decode`
    records every call): decayed sums of calls and seconds per row count up to `MEASURED_ROWS`,
    which the auto plans read against the load-time profile (`core.speedmodel.Costs.current`)."""

    def __init__(self) -> None:
        self.calls: dict[int, float] = {}
        self.seconds: dict[int, float] = {}
        self.warm = False  # the model's first call was made (and not kept)

    def reset(self) -> None:
        """Forget every call (the model stays warm)."""
        self.calls.clear()
        self.seconds.clear()

    def record(self, rows: int, seconds: float) -> None:
        """One call of `rows` rows took `seconds`; every count's record fades by `CALL_DECAY`. The
        model's first call is not kept: it pays for paging the weights in and growing llama.cpp's
        buffers, which no later call pays again."""
        if not self.warm:
            self.warm = True
            return
        if not 1 <= rows <= MEASURED_ROWS or not seconds > 0:
            return
        for n in self.calls:
            self.calls[n] *= CALL_DECAY
            self.seconds[n] *= CALL_DECAY
        self.calls[rows] = self.calls.get(rows, 0.0) + 1.0
        self.seconds[rows] = self.seconds.get(rows, 0.0) + seconds

    def mean(self, rows: int) -> float | None:
        """The mean seconds of a call of `rows` rows (None before one was made)."""
        calls = self.calls.get(rows, 0.0)
        return self.seconds[rows] / calls if calls > 0 else None


def prompt_calls(prompt: Sequence[int], start: int, chunk: int) -> Iterator[tuple[Sequence[int], int]]:
    """The calls that evaluate `prompt` from position `start` in calls of `chunk` tokens: (tokens,
    logits rows asked), the last call asking for the row after the prompt. From a multiple of
    `chunk` these are the calls a fresh evaluation makes there (`Model.restore_prompt`)."""
    for first in range(start, len(prompt), chunk):
        yield prompt[first : first + chunk], int(first + chunk >= len(prompt))


class Sequences(Protocol):
    """What a slot needs of its model (`Model`, `RemoteModel`): the calls that evaluate its
    tokens, and its cells in the model's KV cache by sequence id."""

    name: str
    n_ctx: int
    n_batch: int
    max_logit_rows: int
    logits_vocab: int
    slots: list[Slot]

    @property
    def prompt_chunk(self) -> int: ...

    def decode(self, parts: Sequence[tuple[Slot, Sequence[int], int, int]]) -> list[np.ndarray]: ...
    def restore_prompt(self, slot: Slot, prompt: Sequence[int]) -> np.ndarray | None: ...
    def keep_prompt(self, slot: Slot, prompt: Sequence[int], row: np.ndarray) -> None: ...
    def remove_cells(self, seq_id: int, n: int) -> None: ...
    def share_cells(self, source: int, target: int, n: int) -> None: ...
    def kv_positions(self, seq_id: int) -> int: ...


class Slot:
    """One sequence of a model's KV cache (llama.cpp's seq_id `seq_id`) and exactly the tokens it
    holds. Evaluated, rolled back and prefilled on its own, or in one call with other slots
    (`Model.decode`); `stats` counts the calls it took part in, except those it shared with its
    `partner`, which count there."""

    def __init__(self, model: Sequences, seq_id: int) -> None:
        self.model = model
        self.seq_id = seq_id
        self.tokens: list[int] = []
        self.stats = ModelStats()
        # the slot this one's calls count with (a second prompt's member's, which reads the lead's
        # model, the lead's; a lookahead branch's, its own sequence's): a call they share counts
        # once (`charged_slots`)
        self.partner: Slot | None = None
        # (tokens, llama.cpp's KV positions) after the last call that changed the sequence,
        # published by the thread that drives the model for other threads to read
        self.cache_state: tuple[int, int] = (0, 0)
        self._prefill_row: tuple[tuple[int, ...], np.ndarray] | None = None  # see prefill()

    @property
    def name(self) -> str:
        return self.model.name

    def evaluate(
        self, tokens: Sequence[int], n_logits: int | None = None, *, cancelled: Callable[[], bool] | None = None
    ) -> np.ndarray:
        """Append `tokens` to this sequence and return logits for the last `n_logits` of them.

        Row i of the result is the model's next-token logits after the i-th of those tokens, as a
        float32 array of shape [n_logits, logits_vocab]. `n_logits` defaults to all tokens; 0
        evaluates without returning logits. Tokens go in calls of up to `n_batch`; when
        `cancelled()` turns true between two calls, `Cancelled` is raised and the sequence holds
        the tokens evaluated so far (`tokens` stays exact).
        """
        model = self.model
        n = len(tokens)
        n_logits = n if n_logits is None else n_logits
        if not 0 <= n_logits <= n:
            raise ValueError("n_logits must be between 0 and len(tokens)")
        self._check_room(n)
        out = np.empty((n_logits, model.logits_vocab), dtype=np.float32)
        first_logit = n - n_logits
        done = 0
        while done < n:
            if cancelled is not None and cancelled():
                raise Cancelled(f"{self.name}: cancelled after {done} of {n} tokens")
            chunk = min(model.n_batch, n - done)
            lo = min(max(first_logit - done, 0), chunk)
            if chunk - lo > model.max_logit_rows:  # llama.cpp returns at most that many rows a call
                chunk = lo + model.max_logit_rows
            (rows,) = model.decode([(self, tokens[done : done + chunk], lo, chunk)])
            out[done + lo - first_logit : done + chunk - first_logit] = rows
            done += chunk
        return out

    def evaluate_view(self, tokens: Sequence[int], first: int, end: int) -> np.ndarray:
        """Append `tokens` (at most `n_batch`) in one llama_decode call and return llama.cpp's own
        logits rows after tokens[first:end], without copying them: a read-only view of shape
        [end - first, logits_vocab], valid until the model's next call. For scoring long texts
        with host memory bounded by what the caller takes of it at a time."""
        n = len(tokens)
        if not 0 <= first <= end <= n:
            raise ValueError("need 0 <= first <= end <= len(tokens)")
        (rows,) = self.model.decode([(self, tokens, first, end)])
        rows.flags.writeable = False
        return rows

    def _check_room(self, n: int) -> None:
        if self.model.n_ctx == 0:
            raise RuntimeError(f"{self.name} was loaded with vocab_only")
        if len(self.tokens) + n > self.model.n_ctx:
            raise ValueError(
                f"{self.name}: evaluating {n} tokens at position {len(self.tokens)} exceeds the context of {self.model.n_ctx}"
            )

    def prefill(self, prompt: Sequence[int], *, cancelled: Callable[[], bool] | None = None) -> np.ndarray:
        """Bring this sequence to exactly `prompt` and return the logits row after it.

        What it already holds of the prompt is kept (a chat's earlier turns, the same prompt
        again), and a longer prefix another slot of the model holds is shared (`share_prefix`); at
        least the last token is evaluated again for its row, unless the row of this very prompt
        is still known from the last call. `cancelled` as in `evaluate`.
        """
        row = self.known_row(prompt)
        if row is not None:
            return row
        keep = min(len(self.tokens), len(prompt) - 1)
        row = self.evaluate(prompt[keep:], 1, cancelled=cancelled)[0]
        self.remember_row(prompt, row)
        return row

    def start_prompt(self, prompt: Sequence[int]) -> np.ndarray:
        """Bring this sequence to exactly `prompt`, as a fresh process evaluates it, and return
        the row after it: the model's cache emptied, what the last kept prompt holds of it
        exactly put back (`Model.restore_prompt`), the rest in `prompt_calls`, and kept in turn
        for the next start. A generation begun here gives the same text whatever ran before it."""
        if not prompt:
            raise ValueError("an empty prompt has no row after it")
        model = self.model
        row = model.restore_prompt(self, prompt)
        if row is None:
            for tokens, n_logits in prompt_calls(prompt, len(self.tokens), model.prompt_chunk):
                rows = self.evaluate(tokens, n_logits)
            row = rows[0]
            model.keep_prompt(self, prompt, row)
        return row

    def known_row(self, prompt: Sequence[int]) -> np.ndarray | None:
        """Prepare a prefill of `prompt`: the sequence keeps (or shares) the longest prefix of it
        it can, but never the whole prompt (its last token is evaluated for the row after it);
        returns that row instead when it is still known from the last prefill of this prompt,
        in this slot or in another that still holds it (whose cells it then shares: a request
        repeated lands in whichever slot is free)."""
        key = tuple(prompt)
        for holder in (self, *(other for other in self.model.slots if other is not self)):
            known = holder._prefill_row
            if known is not None and known[0] == key and common_prefix(holder.tokens, prompt) == len(prompt):
                if holder is self:
                    self.truncate(len(prompt))
                else:
                    self.hold(holder, len(prompt))
                    self._prefill_row = known
                return known[1]
        self.share_prefix(prompt)
        self.truncate(min(common_prefix(self.tokens, prompt), len(prompt) - 1))
        return None

    def remember_row(self, prompt: Sequence[int], row: np.ndarray) -> None:
        self._prefill_row = (tuple(prompt), row)

    def share_prefix(self, tokens: Sequence[int]) -> None:
        """Take over the longest prefix of `tokens` that another slot of the model holds, when it
        is longer than what this one holds: the cache cells are shared, not evaluated again (the
        `n` completions of one prompt, a conversation's earlier turns served in another slot)."""
        own = common_prefix(self.tokens, tokens)
        donor, best = None, own
        for other in self.model.slots:
            if other is not self:
                k = common_prefix(other.tokens, tokens)
                if k > best:
                    donor, best = other, k
        if donor is not None:
            self.hold(donor, best)

    def hold(self, other: Slot, n: int | None = None) -> None:
        """Hold exactly `other`'s first `n` tokens (default all): its cells, shared, not
        evaluated again (llama.cpp's seq_cp)."""
        n = len(other.tokens) if n is None else n
        self.truncate(0)
        self.model.share_cells(other.seq_id, self.seq_id, n)
        self.tokens.extend(other.tokens[:n])
        self._publish()

    def kv_length(self) -> int:
        """How many positions llama.cpp's KV cache holds for this sequence (equals
        len(self.tokens) unless something went wrong: a consistency check)."""
        return self.model.kv_positions(self.seq_id)

    def truncate(self, n: int) -> None:
        """Remove every token at position >= n from this sequence."""
        if n >= len(self.tokens):
            return
        if n < 0:
            raise ValueError("n must be >= 0")
        self.model.remove_cells(self.seq_id, n)
        del self.tokens[n:]
        self._publish()

    def reset(self) -> None:
        self.truncate(0)

    def _publish(self) -> None:
        self.cache_state = (len(self.tokens), self.kv_length())

    def __repr__(self) -> str:
        return f"Slot({self.name!r}, seq {self.seq_id}, {len(self.tokens)} tokens)"


def charged_slots(slots: Sequence[Slot]) -> set[Slot]:
    """The slots of one call that count it: of the slots sharing a partner (followed to the
    sequence that has none: a second prompt's member's sequence to the lead's, a lookahead
    branch's to its own), one: that sequence where it is in the call, else the first of them."""
    groups: dict[int, list[Slot]] = {}
    for slot in slots:
        root = slot
        while root.partner is not None:
            root = root.partner
        groups.setdefault(id(root), []).append(slot)
    return {next((s for s in group if s.partner is None), group[0]) for group in groups.values()}


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
