"""The byte level's scheduler: byte-level generations run here, one at a time, in arrival order.

It has the token-level `Scheduler`'s face (`submit`, `step`, `idle`, `live`, `drop`), so the
server's engine drives either. A byte-level generation holds every model's sequences for its
paths, so generations do not share calls: `step` admits the first waiting one when none runs and
advances the running one until it has new text (or ends), then hands the text on.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, cast
from collections.abc import Callable, Iterator

import numpy as np

from .bytelevel import BytePlan
from .completion import Completion
from .generation import Chunk
from .scheduler import Rounds, Submission, State

if TYPE_CHECKING:
    from .bytelevel import ByteModels


class ByteScheduler(Rounds):
    """Byte-level generations of `models`, one at a time, first come first served."""

    def __init__(self, models: ByteModels) -> None:
        self.models = models
        self.live: list[Submission] = []
        self.queue: deque[Submission] = deque()

    def submit(
        self,
        plan: BytePlan,
        rng: np.random.Generator,
        *,
        on_chunk: Callable[[Chunk], None] | None = None,
        key: Any = None,
        shares_cells: bool = False,
    ) -> Submission:
        """Queue a generation of `plan` drawing from `rng`; it starts after the ones before it,
        from emptied caches (`ByteMember.start`). No prompt is scored for it at the byte level
        (a request's echo is refused there), so it has no cells to share."""
        assert not shares_cells, "the byte level scores no prompt before a generation"
        sequence = Submission(plan, rng, on_chunk, key)  # type: ignore[arg-type]
        self.queue.append(sequence)
        return sequence

    def step(self) -> list[Submission]:
        """Start the next generation when none runs, and advance the running one to its next
        text. Returns the sequences that finished."""
        finished: list[Submission] = []
        while not self.live and self.queue:
            sequence = self.queue.popleft()
            plan = cast(BytePlan, sequence.plan)  # what `submit` took
            if sequence.cancel_requested:  # cancelled before it started
                self._finish(sequence, self.models.cancelled_completion(plan), finished)
                continue
            sequence.slot = 0
            sequence.state = State.DECODING
            generation = self.models.start(plan, sequence.rng, cancelled=sequence.is_cancelled)
            sequence.work = _texts(generation)  # type: ignore[assignment]
            self.live.append(sequence)
        for sequence in list(self.live):
            work: Iterator[str | Completion] = sequence.work  # type: ignore[assignment]
            item = next(work)
            if isinstance(item, Completion):
                self.live.remove(sequence)
                self._finish(sequence, item, finished)
            elif sequence.on_chunk is not None:
                sequence.on_chunk(Chunk(item, (), tokenless=True))
        return finished

    def drop(self, sequence: Submission) -> None:
        """Abandon the running sequence (after a failed call); the next generation starts afresh."""
        self.live.remove(sequence)
        sequence.state = State.FINISHED

    @staticmethod
    def _finish(sequence: Submission, completion: Completion, finished: list[Submission]) -> None:
        sequence.completion = completion
        sequence.state = State.FINISHED
        finished.append(sequence)


def _texts(generation: Any) -> Iterator[str | Completion]:
    """A generation's text pieces, then its completion."""
    yield from generation.run()
    yield generation.completion


class BothLevels(Rounds):
    """One model served at two levels (a server loaded for the mixed level, whose requests that
    level does not serve decode at the token level: `config.levels.request_level`): the mixed
    level's generations (`ByteScheduler`) and the token level's (`Scheduler` over the same loaded
    model's sequences), one level at a time. A level runs until it is idle; then the other, if it
    has work, takes the model's sequences. A submission goes to its plan's level."""

    def __init__(self, byte: ByteScheduler, token: Any) -> None:
        self.byte = byte
        self.token = token  # a `Scheduler` (runtime.scheduler) over `Ensemble.beside` the byte level's models
        self._running: Rounds = byte

    @property
    def live(self) -> list[Submission]:  # type: ignore[override]
        return self.byte.live + self.token.live

    @property
    def queue(self) -> deque[Submission]:  # type: ignore[override]
        return deque([*self.byte.queue, *self.token.queue])

    def submit(self, plan: Any, rng: np.random.Generator, **kw: Any) -> Submission:
        return (self.byte if isinstance(plan, BytePlan) else self.token).submit(plan, rng, **kw)

    def step(self) -> list[Submission]:
        if self._running.idle:
            other = self.token if self._running is self.byte else self.byte
            if not other.idle:
                self._running = other
        return self._running.step()

    def drop(self, sequence: Submission) -> None:
        (self.byte if sequence in self.byte.live else self.token).drop(sequence)
