"""Many generations of one ensemble at once: their rows share llama_decode calls.

Every generation runs in its own slot (the same sequence id in each model's KV cache) as the
decoding core's coroutine (`Ensemble._work`): it yields a request whenever it needs a model's
logits. A `Batch` round gives each model, in turn, one call (or a few, within its n_batch and
logits-row limits) holding the requests of every generation waiting for that model: the standard
ensemble's one token per sequence, a CoS proposer's draft token, a verifier's whole draft, a
prompt's next chunk, side by side. A generation that got its logits runs on at once, so its next
request may join a later model's call in the same round. The core stays per-sequence and exact:
batching changes which rows share a call, never what is sampled.

New generations join between rounds (continuous batching), up to the number of slots; one that is
cancelled stops at its next request or round and frees its slot, the others going on untouched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from .core.decoding import Evaluate

if TYPE_CHECKING:
    from .core.combiners import Combiner
    from .ensemble import Chunk, Completion, Ensemble, GenerationConfig, Work

# the most prompt tokens one generation puts into one round's call: a long prompt goes in chunks,
# so the generations already decoding keep getting a call every round
PROMPT_CHUNK = 128


@dataclass(eq=False)
class Running:
    """One generation in a batch: its slot, its coroutine, and where its output goes."""

    slot: int
    prompt: tuple[int, ...]
    work: Work
    on_chunk: Callable[[Chunk], None] | None
    key: Any = None  # the caller's name for it
    cancelled: bool = False
    request: Evaluate | None = None  # what it waits for
    started: bool = False
    completion: Completion | None = None

    def cancel(self) -> None:
        """Stop at the next request or round; the completion's finish reason is "cancelled"."""
        self.cancelled = True


@dataclass(eq=False)
class Batch:
    """Generations of `ensemble` decoded together, one per slot (`Ensemble.load(parallel=N)`);
    `slots` limits which slots it may use (default all)."""

    ensemble: Ensemble
    slots: Sequence[int] | None = None
    live: list[Running] = field(default_factory=list)

    def __post_init__(self) -> None:
        usable = range(self.ensemble.parallel) if self.slots is None else self.slots
        self.free: list[int] = list(usable)

    def add(
        self,
        prompt: Sequence[int],
        config: GenerationConfig,
        combiner: Combiner | None,
        rng: np.random.Generator,
        *,
        on_chunk: Callable[[Chunk], None] | None = None,
        key: Any = None,
    ) -> Running:
        """Start a generation in a free slot (`free` must not be empty); it runs from the next
        round on."""
        slot = self.free.pop(0)
        running = Running(slot, tuple(prompt), None, on_chunk, key)  # type: ignore[arg-type]
        running.work = self.ensemble._work(
            list(prompt), config, combiner, rng, slot, lambda: running.cancelled, prompt_chunk=PROMPT_CHUNK
        )
        self.live.append(running)
        return running

    def round(self) -> list[Running]:
        """One round: every model evaluates, in as few calls as its limits allow, what the live
        generations wait for. Returns the generations that finished in it (their slots are free
        again)."""
        finished: list[Running] = []
        for running in list(self.live):
            if not running.started and not self._waits_for_a_donor(running):
                running.started = True
                self._resume(running, None, finished)
        for i, model in enumerate(self.ensemble.models):
            waiting = [r for r in self.live if r.request is not None and r.request.model == i]
            for running, logits in zip(waiting, self._evaluate(i, model, waiting)):
                self._resume(running, logits, finished)
        return finished

    def drop(self, running: Running) -> None:
        """Abandon a generation (after a failed call): its slot is free, whatever its cache
        holds is exact (the next prefill keeps what fits)."""
        self.live.remove(running)
        self.free.append(running.slot)

    def _waits_for_a_donor(self, running: Running) -> bool:
        """A generation whose prompt another one is evaluating right now starts once that one is
        done, and then shares its cells (`n` completions of one prompt evaluate it once)."""
        return any(
            other is not running and other.started and other.prompt == running.prompt and other.request is not None and other.request.prefill
            for other in self.live
        )

    def _resume(self, running: Running, value: np.ndarray | None, finished: list[Running]) -> None:
        """Run a generation on until it needs logits again (or ends)."""
        running.request = None
        while True:
            try:
                item = running.work.send(value)
            except StopIteration as stop:
                running.completion = stop.value
                self.live.remove(running)
                self.free.append(running.slot)
                finished.append(running)
                return
            if isinstance(item, Evaluate):
                running.request = item
                return
            value = None
            if running.on_chunk is not None:
                running.on_chunk(item)

    def _evaluate(self, i: int, model: Any, waiting: list[Running]) -> list[np.ndarray]:
        """Every waiting request to model i, in calls of at most n_batch tokens and
        max_logit_rows rows; the logits copied out (the next call reuses llama.cpp's buffer)."""
        results: list[np.ndarray | None] = [None] * len(waiting)
        call: list[int] = []
        tokens = rows = 0

        def flush() -> None:
            nonlocal tokens, rows
            if not call:
                return
            parts = [(model.slots[waiting[k].slot], waiting[k].request.tokens, len(waiting[k].request.tokens) - waiting[k].request.n_logits,
                      len(waiting[k].request.tokens)) for k in call]  # fmt: skip
            views = model.decode(parts)
            self.ensemble.call_costs.observe(i, tokens, model.last_call_seconds)
            for k, view in zip(call, views):
                results[k] = np.array(view)
            call.clear()
            tokens = rows = 0

        for k, running in enumerate(waiting):
            request = running.request
            assert request is not None
            n, n_rows = len(request.tokens), request.n_logits
            if n > model.n_batch or n_rows > model.max_logit_rows:  # too big to share a call
                results[k] = model.slots[running.slot].evaluate(request.tokens, request.n_logits)
                continue
            if tokens + n > model.n_batch or rows + n_rows > model.max_logit_rows:
                flush()
            call.append(k)
            tokens += n
            rows += n_rows
        flush()
        return results  # type: ignore[return-value]
