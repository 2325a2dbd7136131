"""One ensemble, one generation at a time: the server's queue.

Requests become jobs, which one worker thread runs in arrival order (the ensemble and its KV
caches serve one generation at a time). That thread is the only one that calls into a llama.cpp
context. A job reports what it produces through a callback the request turns into server-sent
events or a response body. A request whose client went away cancels its job: a waiting job is
skipped, a running one stops at its next llama.cpp call (a long prompt and echo scoring go in
several calls). Beyond `max_queue` waiting jobs a new request is refused (the server answers 503).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..ensemble import Ensemble, Stream


class QueueFull(Exception):
    """More requests are waiting than the server takes."""


@dataclass
class Job:
    """Work for the ensemble: `run(job)` does it, in the worker thread."""

    run: Callable[["Job"], Any]
    finished: Callable[[], None] | None = None  # called (in the worker) once result/error are set
    cancelled: bool = False
    stream: Stream | None = None  # the generation running now, to cancel it
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None
    queued_at: float = field(default_factory=time.monotonic)

    def cancel(self) -> None:
        self.cancelled = True
        if self.stream is not None:
            self.stream.cancel()


class Engine:
    """Runs jobs on one ensemble, one at a time, first come first served."""

    def __init__(self, ensemble: Ensemble, max_queue: int = 64) -> None:
        self.ensemble = ensemble
        self.max_queue = max_queue
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._waiting = 0  # submitted, not started
        self._lock = threading.Lock()
        self.running: Job | None = None
        self.served = 0
        self._thread = threading.Thread(target=self._work, name="localcos-engine", daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        return self._waiting

    def submit(self, run: Callable[[Job], Any], finished: Callable[[], None] | None = None) -> Job:
        """Queue a job (`QueueFull` beyond max_queue waiting); `finished()` is called once it is
        over (done, failed or skipped), after its result is set."""
        with self._lock:
            # a job the idle worker takes at once does not wait
            if self._waiting >= self.max_queue and (self.running is not None or self._waiting > 0):
                raise QueueFull(f"{self._waiting} requests are waiting; try again shortly")
            self._waiting += 1
        job = Job(run, finished)
        self._jobs.put(job)
        return job

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            with self._lock:
                self._waiting -= 1
            if job.cancelled:  # its client left while it waited
                self._finish(job)
                continue
            self.running = job
            try:
                job.result = job.run(job)
            except BaseException as e:  # reported to the request, which answers with it
                job.error = e
            finally:
                self.running = None
                self.served += 1
                self._finish(job)

    @staticmethod
    def _finish(job: Job) -> None:
        job.done.set()
        if job.finished is not None:
            job.finished()

    @property
    def stopped(self) -> bool:
        """The worker thread has ended: no llama.cpp call runs, the models may be freed."""
        return not self._thread.is_alive()

    def cancel_all(self) -> None:
        """Cancel what runs and what waits: each is answered at once (the running generation at
        its next llama.cpp call). Ctrl-C does this first, so no client waits for a reply the
        server would never finish."""
        with self._jobs.mutex:
            waiting = [job for job in self._jobs.queue if job is not None]
        for job in waiting:
            job.cancel()
        running = self.running
        if running is not None:
            running.cancel()

    def shutdown(self) -> None:
        """Cancel everything, and wait for the worker to end: it stops at its next llama.cpp call,
        and only then may the contexts be freed (freeing them under a running llama_decode would
        be a use-after-free)."""
        self.cancel_all()
        self._jobs.put(None)
        self._thread.join()
