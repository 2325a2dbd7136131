"""The token level's scheduler: its generations run here, one or many at once, their rows
sharing llama_decode calls (the byte and mixed levels' run one at a time in `bytescheduler`).

Work is submitted as `Submission`s and waits in arrival order. Each `step` admits waiting sequences
into free slots (the same sequence id in each model's KV cache), runs one round, and retires the
sequences that finished. In a round each model gets one call (or a few, within its n_batch and
logits-row limits) holding the requests of every sequence waiting for that model: the standard
ensemble's one token per sequence, a CoS proposer's draft token, a verifier's whole draft, a
prompt's next chunk, side by side. A sequence that got its logits runs on at once, so its next
request may join a later model's call in the same round. The decoding core stays per sequence
and exact: batching changes which rows share a call, never what is sampled.

At the token level `Ensemble.generate`, `stream` and `generate_many`, the bench and the server
all drive this one loop; a sequence cancelled stops at its next request or round and frees its slot, the others
going on untouched.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Sequence

import numpy as np

from ..core.decoding import Decoder, Evaluate, Phase, Together
from .completion import Completion
from .generation import Chunk, Generation, Work, cancelled, completion_rng
from .profile import call_groups

if TYPE_CHECKING:
    from .loaded import LoadedModels
    from .plan import Plan


class State(Enum):
    """Where a sequence is: waiting for a slot, then in the phase its pending request names
    (prefill, drafting, verifying, decoding, lookahead), then finished."""

    QUEUED = "queued"
    PREFILL = "prefill"
    DRAFTING = "drafting"
    VERIFYING = "verifying"
    DECODING = "decoding"
    LOOKAHEAD = "lookahead"
    FINISHED = "finished"


@dataclass(eq=False)
class Submission:
    """One generation in the scheduler: its plan and random stream, where its output goes, and
    where it is (`state`); `completion` once finished."""

    plan: Plan
    rng: np.random.Generator
    on_chunk: Callable[[Chunk], None] | None = None
    key: Any = None  # the caller's name for it
    state: State = State.QUEUED
    slot: int | None = None
    completion: Completion | None = None
    cancel_requested: bool = False
    # its prompt's cells were just evaluated for it (a server's echo scoring): it shares them
    # rather than starting from an emptied cache (its text may then differ from a fresh one's)
    shares_cells: bool = False
    request: Evaluate | Together | None = None  # what it waits for
    answers: dict[int, np.ndarray] = field(default_factory=dict, repr=False)  # a Together's logits so far, by request
    generation: Generation | None = None
    work: Work | None = field(default=None, repr=False)

    def cancel(self) -> None:
        """Stop at the next request or round; the completion's finish reason is "cancelled"."""
        self.cancel_requested = True

    def is_cancelled(self) -> bool:
        return self.cancel_requested

    @property
    def decoder(self) -> Decoder | None:
        """The generation's decoder, once decoding started."""
        return self.generation.decoder if self.generation is not None else None


class Rounds:
    """What every scheduler has: the live sequences, the queue, and running rounds (`step`) until
    nothing is left."""

    live: list[Submission]
    queue: deque[Submission]

    @property
    def idle(self) -> bool:
        return not self.live and not self.queue

    def submit(self, plan: Any, rng: np.random.Generator, *, on_chunk: Callable[[Chunk], None] | None = None, key: Any = None,
               shares_cells: bool = False) -> Submission:  # fmt: skip
        """Queue a generation of `plan` (a plan of the scheduler's level) drawing from `rng`."""
        raise NotImplementedError

    def step(self) -> list[Submission]:
        raise NotImplementedError

    def drop(self, sequence: Submission) -> None:
        """Abandon a live sequence (after a failed call)."""
        raise NotImplementedError

    def run(self) -> list[Submission]:
        """Step until nothing is left; the sequences in the order they finished."""
        done: list[Submission] = []
        while not self.idle:
            done.extend(self.step())
        return done

    def complete(self, plan: Any, n: int, on_chunk: Callable[[int, Chunk], None] | None = None) -> list[Completion]:
        """`n` completions of `plan`, completion k drawing from `completion_rng(seed, k)` (and
        handing its chunks to `on_chunk(k, chunk)`), run to their ends."""

        def chunks_of(k: int) -> Callable[[Chunk], None] | None:
            return None if on_chunk is None else lambda chunk: on_chunk(k, chunk)

        sequences = [self.submit(plan, completion_rng(plan.config.seed, k), on_chunk=chunks_of(k), key=k) for k in range(n)]
        self.run()
        return [s.completion for s in sequences]  # type: ignore[misc]


class Scheduler(Rounds):
    """Sequences of `loaded` decoded together, one per slot; `slots` limits which slots it may
    use (default all). `observe(sequence)`, when given, is called for every live sequence after
    each round (the tests check the decoder's invariants there)."""

    def __init__(self, loaded: LoadedModels, slots: Sequence[int] | None = None, observe: Callable[[Submission], None] | None = None) -> None:
        self.loaded = loaded
        self.free: list[int] = list(range(loaded.parallel) if slots is None else slots)
        self.live: list[Submission] = []
        self.queue: deque[Submission] = deque()
        self.observe = observe

    def submit(
        self,
        plan: Plan,
        rng: np.random.Generator,
        *,
        on_chunk: Callable[[Chunk], None] | None = None,
        key: Any = None,
        shares_cells: bool = False,
    ) -> Submission:
        """Queue a generation of `plan` drawing from `rng`; it starts when a slot frees, after
        the ones submitted before it. One that starts while no other runs starts from an emptied
        cache (its text then depends on nothing that ran before), unless `shares_cells`: its
        prompt's cells were evaluated for it just before (see `Submission.shares_cells`)."""
        sequence = Submission(plan, rng, on_chunk, key, shares_cells=shares_cells)
        self.queue.append(sequence)
        return sequence

    def step(self) -> list[Submission]:
        """Admit what waits into free slots, then run one round: every model evaluates, in as few
        calls as its limits allow, what the live sequences wait for. Returns the sequences that
        finished (their slots are free again)."""
        finished: list[Submission] = []
        self._admit(finished)
        for sequence in list(self.live):
            if sequence.request is None and sequence.state is State.QUEUED and not self._waits_for_a_donor(sequence):
                self._resume(sequence, None, finished)
        for model in self.loaded.loaded:  # one call (or a few) per model, for every member of it
            waiting = [(s, k, r) for s in self.live for k, r in enumerate(_requests(s.request)) if k not in s.answers
                       and self.loaded.models[r.model] is model]  # fmt: skip
            for (sequence, k, _), logits in zip(waiting, self._evaluate(model, waiting)):
                sequence.answers[k] = logits
            for sequence in dict.fromkeys(s for s, _, _ in waiting):
                if len(sequence.answers) == len(_requests(sequence.request)):  # every part answered: it runs on
                    answers = [sequence.answers[k] for k in range(len(sequence.answers))]
                    self._resume(sequence, answers if isinstance(sequence.request, Together) else answers[0], finished)
        if self.observe is not None:
            for sequence in self.live:
                self.observe(sequence)
        return finished

    def drop(self, sequence: Submission) -> None:
        """Abandon a live sequence (after a failed call): its slot is free, whatever its cache
        holds is exact (the next prefill keeps what fits)."""
        self.live.remove(sequence)
        assert sequence.slot is not None
        self.free.append(sequence.slot)
        sequence.state = State.FINISHED

    # --- inside ------------------------------------------------------------------------------------
    def _admit(self, finished: list[Submission]) -> None:
        while self.queue and (self.free or self.queue[0].cancel_requested):
            sequence = self.queue.popleft()
            if sequence.cancel_requested:  # cancelled before it started: nothing to generate
                sequence.completion = cancelled(self.loaded, sequence.plan)
                sequence.state = State.FINISHED
                finished.append(sequence)
                continue
            sequence.slot = self.free.pop(0)
            sequence.generation = Generation(
                self.loaded, sequence.plan, sequence.rng, sequence.slot, sequence.is_cancelled, self._others,
                fresh=not self.live and not sequence.shares_cells,  # alone in the caches: it starts from an emptied one
            )
            sequence.work = sequence.generation.run()
            self.live.append(sequence)

    def _others(self) -> int:
        """Rows the other live sequences put into each model's call, one each while they decode:
        the load a sequence prices its drafts beside (speculation backs off under load)."""
        return max(len(self.live) - 1, 0)

    def _waits_for_a_donor(self, sequence: Submission) -> bool:
        """A sequence whose prompt another one is evaluating right now starts once that one is
        done, and then shares its cells (`n` completions of one prompt evaluate it once)."""
        return any(
            other is not sequence and any(r.prefill for r in _requests(other.request)) and other.plan.prompt == sequence.plan.prompt
            for other in self.live
        )

    def _resume(self, sequence: Submission, value: np.ndarray | list[np.ndarray] | None, finished: list[Submission]) -> None:
        """Run a sequence on until it needs logits again (or ends)."""
        sequence.request = None
        sequence.answers = {}
        assert sequence.work is not None
        while True:
            try:
                item = sequence.work.send(value)
            except StopIteration as stop:
                sequence.completion = stop.value
                sequence.state = State.FINISHED
                self.live.remove(sequence)
                assert sequence.slot is not None
                self.free.append(sequence.slot)
                finished.append(sequence)
                return
            if isinstance(item, (Evaluate, Together)):
                sequence.request = item
                sequence.state = State(_requests(item)[0].phase.value)
                return
            value = None
            if sequence.on_chunk is not None:
                sequence.on_chunk(item)

    def _evaluate(self, model: Any, waiting: list[tuple[Submission, int, Evaluate]]) -> list[np.ndarray]:
        """Every waiting request to `model` (from any of its members), in calls of at most
        n_batch tokens and max_logit_rows rows, grouped as the model's call profile says they cost
        least (`runtime.profile.call_groups`: one call for all where rows batch well); the logits
        copied out (the next call reuses llama.cpp's buffer)."""
        results: list[np.ndarray | None] = [None] * len(waiting)
        shared: list[int] = []  # the requests that may share calls, and their parts of a call
        parts = []
        branches: dict[int, list[int]] = {}  # a generation's lookahead branches: one call each
        profile = None
        for k, (sequence, _, request) in enumerate(waiting):
            assert sequence.slot is not None
            slot = self.loaded.sequence(request.model, sequence.slot, request.branch)
            profile = self.loaded.profiles[request.model]
            if request.phase is Phase.LOOKAHEAD:
                branches.setdefault(id(sequence), []).append(k)
            elif len(request.tokens) > model.n_batch or request.n_logits > model.max_logit_rows:  # too big to share a call
                results[k] = slot.evaluate(request.tokens, request.n_logits)
            else:
                shared.append(k)
                parts.append((slot, request.tokens, len(request.tokens) - request.n_logits, len(request.tokens)))
        for group in call_groups(model, profile, parts) if parts else ():
            for j, view in zip(group, model.decode([parts[j] for j in group])):
                results[shared[j]] = np.array(view)
        for ks in branches.values():
            calls = []
            for k in ks:
                sequence, _, request = waiting[k]
                assert sequence.slot is not None
                calls.append((self.loaded.sequence(request.model, sequence.slot, request.branch), request.tokens, 0, 1))
            for k, view in zip(ks, model.decode(calls)):
                results[k] = np.array(view)
        return results  # type: ignore[return-value]


def _requests(request: Evaluate | Together | None) -> tuple[Evaluate, ...]:
    """A sequence's pending requests: one, several answered together, or none."""
    if request is None:
        return ()
    return request.requests if isinstance(request, Together) else (request,)


def run_completions(
    loaded: LoadedModels,
    plan: Plan,
    n: int,
    *,
    on_chunk: Callable[[int, Chunk], None] | None = None,
    observe: Callable[[Submission], None] | None = None,
) -> list[Completion]:
    """`n` completions of one plan, completion k drawing from `completion_rng(seed, k)`; up to
    `loaded.parallel` decode at once, and their prompt is evaluated once (`observe`: see
    `Scheduler`)."""
    return Scheduler(loaded, observe=observe).complete(plan, n, on_chunk)
