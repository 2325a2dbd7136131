"""One ensemble, many requests at once: the server's engine thread over the runtime's scheduler.

Requests become jobs, queued in arrival order. A job asks for some generations (its prompts times
`n` choices, each a `Plan` and a choice index), maybe for work before them (`prepare`: scoring an
echoed prompt, whose cells the generations then share) and, once they are done, for what
`collect` makes of them (scoring, for echo and logprobs). One thread, the only one that calls
into a llama.cpp context (it loads the models too: llama.cpp's CPU threads belong to the thread
that first computes, and a decode from another thread ran a fifth slower), takes the jobs in order, hands their generations to the one
`Scheduler` (which admits them into free slots in arrival order, a new request joining the
running batch as soon as a slot frees) and steps it: every live generation's rows share
llama_decode calls. Text reaches the job as it becomes final; a job is collected once all its
generations are done. A cancelled job (its client went away) stops its generations at their next
llama.cpp call or round, the others going on untouched. Beyond `max_queue` jobs not yet started a
new request is refused (the server answers 503).

A job moves through named states: QUEUED (waiting for the engine), PREPARING (its echo scoring),
GENERATING (its generations in the scheduler), COLLECTING (their scoring and answer), DONE.

Scoring runs in a slot of its own when the ensemble has more than one (so what it evaluated stays
there for the next request that shares the prefix), else in the one slot, between generations.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any
from collections.abc import Callable

from ..errors import Cancelled
from ..runtime.completion import Completion
from ..runtime.generation import completion_rng
from ..runtime.models import LevelViews, scheduler_for
from ..runtime.scheduler import Submission, State

if TYPE_CHECKING:
    from ..runtime.models import LevelPlan
    from ..runtime.scheduler import Rounds


class QueueFull(Exception):
    """More requests are waiting than the server takes."""


@dataclass(frozen=True)
class Generation:
    """One completion a job asks for: its index among the job's choices, its plan, and which
    random stream of the plan's seed it draws from (`completion_rng`)."""

    index: int
    plan: LevelPlan  # at the level the engine's scheduler decodes at
    stream: int = 0


class JobState(Enum):
    QUEUED = "queued"
    PREPARING = "preparing"
    GENERATING = "generating"
    COLLECTING = "collecting"
    DONE = "done"


@dataclass(eq=False)
class Job:
    """A request's work: `generations`, then `collect(job)` (in the engine thread, with the
    completions in `completions`), whose value is the job's `result`."""

    generations: list[Generation]
    collect: Callable[[Job], Any]
    on_text: Callable[[int, Any], None] | None = None  # (choice index, Chunk) as each round ends: streaming
    on_done: Callable[[], None] | None = None  # called (in the engine thread) once result/error are set
    prepare: Callable[[Job], None] | None = None  # before the generations, in the scoring slot
    state: JobState = JobState.QUEUED
    cancelled: bool = False
    completions: dict[int, Completion] = field(default_factory=dict)
    sequences: list[Submission] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None
    queued_at: float = field(default_factory=time.monotonic)

    def cancel(self) -> None:
        self.cancelled = True
        for sequence in list(self.sequences):
            sequence.cancel()

    @property
    def started(self) -> bool:
        """Whether it left the queue: preparing, or a generation got a slot."""
        if self.state is JobState.GENERATING:
            return not self.sequences or any(s.state is not State.QUEUED for s in self.sequences)
        return self.state is not JobState.QUEUED

    @property
    def generated(self) -> bool:
        return len(self.completions) == len(self.generations)


class Engine:
    """Runs jobs on one ensemble: their generations decoded together, first come first served.
    `load()` gives the models as `runtime.models.LevelViews` holds them (where one model is loaded
    for the mixed level, its own tokens beside it, whose requests the mixed level does not
    serve), loaded in the engine's own thread; the constructor returns once they are, or raises
    what loading raised."""

    def __init__(self, load: Callable[[], LevelViews], max_queue: int = 64) -> None:
        self.max_queue = max_queue
        self._arrivals: queue.Queue[Job | None] = queue.Queue()
        self._unstarted: set[Job] = set()  # submitted, not started: what max_queue counts
        self._lock = threading.Lock()
        self._queued: deque[Job] = deque()  # taken from the arrivals, not handed to the scheduler yet
        self._active: list[Job] = []  # handed over, not answered
        self._stopping = False
        self.answered = 0
        loaded = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            try:
                self._start(load())
            except BaseException as e:  # the load failed: the constructor raises it
                failure.append(e)
                return
            finally:
                loaded.set()
            self._loop()

        self._thread = threading.Thread(target=run, name="localcos-engine", daemon=True)
        self._thread.start()
        loaded.wait()
        if failure:
            raise failure[0]

    def _start(self, views: LevelViews) -> None:
        self.views = views
        self.loaded = views.loaded
        loaded, token = views.loaded, views.token
        # the sequences token-level requests decode on: where one model is loaded for the mixed
        # level, its own tokens beside it (`token`: its requests the mixed level does not serve)
        parallel = (token or loaded).parallel
        generation_slots = list(range(max(1, parallel - 1)))
        self.scoring_slot = parallel - 1
        self._scoring_shared = self.scoring_slot in generation_slots  # one slot: scoring waits for it
        self.scheduler: Rounds = scheduler_for(loaded, generation_slots, token)
        self.parallel = len(generation_slots)  # generations decoded at once, at most

    @property
    def waiting(self) -> int:
        return len(self._unstarted)

    @property
    def running(self) -> bool:
        return bool(self._active)

    @property
    def sequences(self) -> int:
        """Generations decoding now."""
        return len(self.scheduler.live)

    def submit(
        self,
        generations: list[Generation],
        collect: Callable[[Job], Any],
        on_text: Callable[[int, Any], None] | None = None,
        on_done: Callable[[], None] | None = None,
        prepare: Callable[[Job], None] | None = None,
    ) -> Job:
        """Queue a job (`QueueFull` beyond max_queue waiting); `on_done()` is called once it is
        over (done, failed or skipped), after its result is set."""
        with self._lock:
            # a job the idle engine takes at once does not wait
            waiting = len(self._unstarted)
            if waiting >= self.max_queue and (self._active or waiting > 0):
                raise QueueFull(f"{waiting} requests are waiting; try again shortly")
            job = Job(generations, collect, on_text, on_done, prepare)
            self._unstarted.add(job)
        self._arrivals.put(job)
        return job

    # --- the engine thread -------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            idle = self.scheduler.idle and not self._queued and not self._active
            if self._stopping and idle:
                return
            self._take(block=idle)
            self._hand_over()
            self._count_started()
            self._collect_ready()
            if not self.scheduler.idle:
                try:
                    finished = self.scheduler.step()
                except BaseException as e:  # a llama.cpp or RPC failure: every live job gets it
                    self._fail_live(e)
                    continue
                for sequence in finished:
                    job, index = sequence.key
                    job.sequences.remove(sequence)
                    assert sequence.completion is not None
                    job.completions[index] = sequence.completion

    def _take(self, block: bool) -> None:
        """Move what arrived to the engine's own queue (waiting for one when idle)."""
        try:
            job = self._arrivals.get(block=block)
        except queue.Empty:
            return
        while True:
            if job is None:
                self._stopping = True
            else:
                self._queued.append(job)
            try:
                job = self._arrivals.get_nowait()
            except queue.Empty:
                return

    def _hand_over(self) -> None:
        """Prepare the queued jobs (echo scoring) and hand their generations to the scheduler,
        in arrival order; the scheduler starts them as slots free."""
        while self._queued:
            job = self._queued[0]
            if job.cancelled or self._stopping:
                self._queued.popleft()
                job.cancelled = True
                self._activate(job, JobState.GENERATING)
                continue
            if self._scoring_shared and (any(j.state is JobState.GENERATING and j.generated for j in self._active) or not self.scheduler.idle):
                return  # one slot: a job is scored in it, or generates, before the next starts
            self._queued.popleft()
            if job.prepare is not None:
                self._activate(job, JobState.PREPARING)
                try:
                    job.prepare(job)
                except Cancelled:  # its client left: nothing more to do
                    job.cancelled = True
                except BaseException as e:  # answered with it; its generations never start
                    job.error = e
                    job.cancelled = True
            self._activate(job, JobState.GENERATING)
            if job.cancelled:
                continue
            for g in job.generations:

                def on_chunk(chunk: Any, job: Job = job, index: int = g.index) -> None:
                    if job.on_text is not None:
                        job.on_text(index, chunk)

                rng = completion_rng(g.plan.config.seed, g.stream)
                # an echo's generations share the cells its prompt was just scored in
                # the engine's one scheduler takes plans at the level of the models it runs (`scheduler_for`)
                sequence = self.scheduler.submit(g.plan, rng, on_chunk=on_chunk, key=(job, g.index),
                                                 shares_cells=job.prepare is not None)  # fmt: skip
                job.sequences.append(sequence)

    def _activate(self, job: Job, state: JobState) -> None:
        job.state = state
        if job not in self._active:
            self._active.append(job)

    def _count_started(self) -> None:
        """Jobs that left the queue no longer count against max_queue."""
        with self._lock:
            self._unstarted = {job for job in self._unstarted if not job.started}

    def _collect_ready(self) -> None:
        for job in list(self._active):
            if job.state is not JobState.GENERATING or job.sequences:
                continue
            if self._scoring_shared and any(s.slot == self.scoring_slot for s in self.scheduler.live):
                continue  # the one slot is busy generating: score when it is free
            job.state = JobState.COLLECTING
            if job.error is None:
                try:
                    job.result = job.collect(job)
                except BaseException as e:  # reported to the request, which answers with it
                    job.error = e
            self._answer(job)

    def _answer(self, job: Job) -> None:
        job.state = JobState.DONE
        with self._lock:
            self._unstarted.discard(job)
        self._active.remove(job)
        self.answered += 1
        job.done.set()
        if job.on_done is not None:
            job.on_done()

    def _fail_live(self, error: BaseException) -> None:
        for sequence in list(self.scheduler.live):
            job, _ = sequence.key
            self.scheduler.drop(sequence)
            job.sequences.remove(sequence)
            if job.error is None:
                job.error = error
            job.cancel()  # its other generations stop; it is answered with the error
        for job in list(self._active):
            if job.error is not None and not any(s in self.scheduler.live for s in job.sequences):
                for sequence in job.sequences:  # queued ones never start
                    sequence.cancel()
                job.sequences.clear()
                self._answer(job)

    # --- stopping ----------------------------------------------------------------------------------
    @property
    def stopped(self) -> bool:
        """The engine thread has ended: no llama.cpp call runs, the models may be freed."""
        return not self._thread.is_alive()

    def cancel_all(self) -> None:
        """Cancel what runs and what waits: each is answered at once (a running generation at its
        next llama.cpp call). Ctrl-C does this first, so no client waits for a reply the server
        would never finish."""
        with self._arrivals.mutex:
            waiting = [job for job in self._arrivals.queue if job is not None]
        for job in waiting + list(self._queued) + list(self._active):
            job.cancel()

    def shutdown(self) -> None:
        """Cancel everything, and wait for the engine thread to end: it stops at its next
        llama.cpp call, and only then may the contexts be freed (freeing them under a running
        llama_decode would be a use-after-free)."""
        self.cancel_all()
        self._arrivals.put(None)
        self._thread.join()
