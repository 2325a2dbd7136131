"""A plan run at any level, to its end (`complete`) or streamed as it is generated (`Stream`): in
the scheduler of its models' level (`runtime.models.scheduler_for`), as the server's
generations are."""

from __future__ import annotations

from typing import TYPE_CHECKING
from collections.abc import Iterator

from .generation import Chunk, completion_rng
from .models import scheduler_for

if TYPE_CHECKING:
    from .completion import Completion
    from .models import LevelPlan, Models


def complete(models: Models, plan: LevelPlan, n: int = 1) -> list[Completion]:
    """`n` completions of `plan` on `models`, completion k drawing from random stream k of its
    seed (as `generate --n` and a server's choices do): up to `parallel` at once at the token
    level (their prompt evaluated once), one after another at the byte and mixed levels."""
    return scheduler_for(models, list(range(models.parallel))).complete(plan, n)


class Stream:
    """One completion of a plan as it is generated: iterate for its final text pieces, or
    `chunks()` for `Chunk`s (text plus per-token origins; at the byte and mixed levels, text
    only); `completion` is set when it ends. `cancel()` stops it at its next llama.cpp call or
    round (at the byte and mixed levels, its next byte), with finish reason "cancelled". It runs
    in the scheduler of its models' level like any other generation (completion 0 of its seed)."""

    def __init__(self, models: Models, plan: LevelPlan) -> None:
        self.completion: Completion | None = None
        self._pending: list[Chunk] = []
        self._scheduler = scheduler_for(models, [0])
        self._sequence = self._scheduler.submit(plan, completion_rng(plan.config.seed, 0), on_chunk=self._pending.append)

    @property
    def cancelled(self) -> bool:
        return self._sequence.cancel_requested

    def cancel(self) -> None:
        self._sequence.cancel()

    def chunks(self) -> Iterator[Chunk]:
        while not self._scheduler.idle:
            self._scheduler.step()
            while self._pending:
                yield self._pending.pop(0)
        self.completion = self._sequence.completion

    def __iter__(self) -> Iterator[str]:
        for chunk in self.chunks():
            if chunk.text:
                yield chunk.text
