"""One ensemble, many requests at once: the server's scheduler (continuous batching).

Requests become jobs, queued in arrival order. A job asks for some generations (its prompts times
`n` choices), maybe for work before them (`prepare`: scoring an echoed prompt, whose cells the
generations then share) and, once they are done, for what `finish` makes of them (scoring, for
echo and logprobs). One worker thread, the only one that calls into a llama.cpp context, runs a `Batch`:
between decoding rounds it admits the waiting jobs' generations into free slots, first come first
served (a new request joins the running batch as soon as a slot frees), then runs a round in which
every live generation's rows share llama_decode calls. Text reaches the job as it becomes final;
a job is finished once all its generations are. A cancelled job (its client went away) stops its
generations at their next llama.cpp call or round, the others going on untouched. Beyond
`max_queue` jobs not yet started a new request is refused (the server answers 503).

Scoring runs in a slot of its own when the ensemble has more than one (so what it evaluated stays
there for the next request that shares the prefix), else in the one slot, between generations.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..batch import Batch, Running
from ..core.combiners import Combiner
from ..ensemble import Completion, Ensemble, GenerationConfig
from ..errors import Cancelled


class QueueFull(Exception):
    """More requests are waiting than the server takes."""


@dataclass(frozen=True)
class Generation:
    """One completion a job asks for: its index among the job's choices, prompt and settings."""

    index: int
    prompt: list[int]
    config: GenerationConfig
    combiner: Combiner


@dataclass(eq=False)
class Job:
    """A request's work: `generations`, then `finish(job)` (in the worker thread, with the
    completions in `completions`), whose value is the job's `result`."""

    generations: list[Generation]
    finish: Callable[["Job"], Any]
    on_text: Callable[[int, Any], None] | None = None  # (choice index, Chunk) as each round ends: streaming
    finished: Callable[[], None] | None = None  # called (in the worker) once result/error are set
    prepare: Callable[["Job"], None] | None = None  # before the generations, in the scoring slot
    prepared: bool = False
    cancelled: bool = False
    completions: dict[int, Completion] = field(default_factory=dict)
    running: list[Running] = field(default_factory=list)
    admitted: int = 0  # generations started so far
    started: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None
    queued_at: float = field(default_factory=time.monotonic)

    def cancel(self) -> None:
        self.cancelled = True
        for running in list(self.running):
            running.cancel()

    @property
    def generated(self) -> bool:
        return len(self.completions) == len(self.generations)


class Engine:
    """Runs jobs on one ensemble: their generations decoded together, first come first served."""

    def __init__(self, ensemble: Ensemble, max_queue: int = 64) -> None:
        self.ensemble = ensemble
        self.max_queue = max_queue
        parallel = ensemble.parallel
        generation_slots = list(range(max(1, parallel - 1)))
        self.scoring_slot = parallel - 1
        self._scoring_shared = self.scoring_slot in generation_slots  # one slot: scoring waits for it
        self.batch = Batch(ensemble, slots=generation_slots)
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._waiting = 0  # submitted, not started
        self._lock = threading.Lock()
        self._admitting: deque[Job] = deque()  # taken from the queue, generations still to start
        self._active: list[Job] = []  # started, not finished
        self._stopping = False
        self.served = 0
        self._thread = threading.Thread(target=self._work, name="localcos-engine", daemon=True)
        self._thread.start()

    @property
    def parallel(self) -> int:
        """Generations decoded at once, at most."""
        return len(self.batch.free) + len(self.batch.live)

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def running(self) -> bool:
        return bool(self._active)

    @property
    def sequences(self) -> int:
        """Generations decoding now."""
        return len(self.batch.live)

    def submit(
        self,
        generations: list[Generation],
        finish: Callable[[Job], Any],
        on_text: Callable[[int, Any], None] | None = None,
        finished: Callable[[], None] | None = None,
        prepare: Callable[[Job], None] | None = None,
    ) -> Job:
        """Queue a job (`QueueFull` beyond max_queue waiting); `finished()` is called once it is
        over (done, failed or skipped), after its result is set."""
        with self._lock:
            # a job the idle worker takes at once does not wait
            if self._waiting >= self.max_queue and (self._active or self._waiting > 0):
                raise QueueFull(f"{self._waiting} requests are waiting; try again shortly")
            self._waiting += 1
        job = Job(generations, finish, on_text, finished, prepare)
        self._jobs.put(job)
        return job

    # --- the worker --------------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            idle = not self.batch.live and not self._admitting and not self._active
            if self._stopping and idle:
                return
            self._take(block=idle)
            self._admit()
            self._finish_ready()
            if self.batch.live:
                try:
                    finished = self.batch.round()
                except BaseException as e:  # a llama.cpp or RPC failure: every live job gets it
                    self._fail_live(e)
                    continue
                for running in finished:
                    job, index = running.key
                    job.running.remove(running)
                    assert running.completion is not None
                    job.completions[index] = running.completion

    def _take(self, block: bool) -> None:
        """Move what arrived from the queue to the admission line (waiting for one when idle)."""
        try:
            job = self._jobs.get(block=block)
        except queue.Empty:
            return
        while True:
            if job is None:
                self._stopping = True
            else:
                self._admitting.append(job)
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return

    def _start(self, job: Job) -> None:
        if not job.started:
            job.started = True
            with self._lock:
                self._waiting -= 1
            self._active.append(job)

    def _admit(self) -> None:
        """Start the waiting jobs' generations in free slots, in arrival order."""
        while self._admitting:
            job = self._admitting[0]
            if job.cancelled or self._stopping:
                self._admitting.popleft()
                self._start(job)
                job.cancelled = True
                continue
            if self._scoring_shared and any(j.generated for j in self._active):
                return  # one slot: a job waits to be scored in it first
            if job.prepare is not None and not job.prepared:
                if self._scoring_shared and self.batch.live:
                    return  # one slot: it prepares once the slot is free
                self._start(job)
                job.prepared = True
                try:
                    job.prepare(job)
                except Cancelled:  # its client left: nothing more to do
                    job.cancelled = True
                    continue
                except BaseException as e:  # answered with it; its generations never start
                    job.error = e
                    job.cancelled = True
                    continue
            while job.admitted < len(job.generations) and self.batch.free:
                g = job.generations[job.admitted]
                rng = np.random.default_rng(g.config.seed)

                def on_chunk(chunk: Any, job: Job = job, index: int = g.index) -> None:
                    if job.on_text is not None:
                        job.on_text(index, chunk)

                job.running.append(self.batch.add(g.prompt, g.config, g.combiner, rng, on_chunk=on_chunk, key=(job, g.index)))
                job.admitted += 1
                self._start(job)
            if job.admitted < len(job.generations):
                return  # the next slot that frees is this job's: arrival order
            self._admitting.popleft()
            self._start(job)

    def _finish_ready(self) -> None:
        for job in list(self._active):
            if job.running or (job.admitted < len(job.generations) and not job.cancelled):
                continue
            if self._scoring_shared and any(r.slot == self.scoring_slot for r in self.batch.live):
                continue  # the one slot is busy generating: score when it is free
            if job.error is None:
                try:
                    job.result = job.finish(job)
                except BaseException as e:  # reported to the request, which answers with it
                    job.error = e
            self._active.remove(job)
            self.served += 1
            job.done.set()
            if job.finished is not None:
                job.finished()

    def _fail_live(self, error: BaseException) -> None:
        for running in list(self.batch.live):
            job, _ = running.key
            self.batch.drop(running)
            job.running.remove(running)
            if job.error is None:
                job.error = error
            job.cancelled = True  # its other generations stop; it is answered with the error
        for job in list(self._active):
            if job.error is not None and not job.running:
                self._active.remove(job)
                self.served += 1
                job.done.set()
                if job.finished is not None:
                    job.finished()

    # --- stopping ----------------------------------------------------------------------------------
    @property
    def stopped(self) -> bool:
        """The worker thread has ended: no llama.cpp call runs, the models may be freed."""
        return not self._thread.is_alive()

    def cancel_all(self) -> None:
        """Cancel what runs and what waits: each is answered at once (a running generation at its
        next llama.cpp call). Ctrl-C does this first, so no client waits for a reply the server
        would never finish."""
        with self._jobs.mutex:
            waiting = [job for job in self._jobs.queue if job is not None]
        for job in waiting + list(self._admitting) + list(self._active):
            job.cancel()

    def shutdown(self) -> None:
        """Cancel everything, and wait for the worker to end: it stops at its next llama.cpp call,
        and only then may the contexts be freed (freeing them under a running llama_decode would
        be a use-after-free)."""
        self.cancel_all()
        self._jobs.put(None)
        self._thread.join()
