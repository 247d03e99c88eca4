"""A request queue in front of the model, and the one thread that runs it.

The event loop never runs the model: every job (a completion, an inspection) goes into a
queue, and one worker thread takes them in order, so requests never interleave inside the
model (no cross-talk) and streaming and disconnects stay responsive. A job reports to its
request through ``emit``, which hands each event to the event loop thread-safely; a request
that goes away sets ``cancelled`` and its job stops at its next step.

Batching: a job may carry a ``batch_key`` and a ``batch_fn``. When the worker takes such a
job, it also takes the queued jobs with the same key (up to ``max_batch``) and runs them
together through ``batch_fn(jobs)``, one result per job, each still emitting its own events.

Admission: at most ``max_queue`` jobs waiting or running; one more is refused (429).

Scope: the thread runs every job inside ``scope()``; the app passes the model's packed
weights (``nn.linear.packed_weights``), taken once for the server's life, since its model never
trains.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Hashable
from typing import Any

from ..errors import UserError
from .errors import APIError

_DONE = object()  # the last event of every job


class Job:
    """One unit of model work: ``fn(job)`` runs on the worker thread and may ``emit``."""

    def __init__(self, fn: Callable[[Job], Any], loop: asyncio.AbstractEventLoop,
                 batch_key: Hashable | None = None,
                 batch_fn: Callable[[list[Job]], list[Any]] | None = None, payload: Any = None):
        self.fn, self.loop = fn, loop
        self.batch_key, self.batch_fn, self.payload = batch_key, batch_fn, payload
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()

    def emit(self, event: Any) -> None:
        """Hand an event to the waiting request (called on the worker thread)."""
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)


def _as_api_error(e: Exception) -> APIError:
    if isinstance(e, APIError):
        return e
    if isinstance(e, UserError):  # what the command line says as a user error: a 400 here
        return APIError(400, str(e), None, "invalid_request")
    return APIError(500, f"internal error: {type(e).__name__}: {e}", code="internal_error")


class Worker:
    """The queue and its thread; ``start`` once, ``stop`` at shutdown."""

    def __init__(self, max_queue: int = 64, max_batch: int = 1,
                 scope: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext):
        self.max_queue, self.max_batch = max_queue, max_batch
        self.scope = scope  # entered by the thread around all its jobs (the packed weights)
        self._jobs: deque = deque()
        self._ready = threading.Condition()
        self._outstanding = 0  # waiting + running
        self._thread: threading.Thread | None = None
        self.batches: list[int] = []  # jobs per batch run (the last 1000), for measuring

    @property
    def outstanding(self) -> int:
        return self._outstanding

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="minitransformer-serve",
                                            daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        if self._thread is not None:
            with self._ready:
                self._jobs.append(None)
                self._ready.notify()
            self._thread.join(timeout)
            self._thread = None

    def _next(self) -> list[Job] | None:
        """The next job, with the queued jobs that share its batch key (None: stop)."""
        with self._ready:
            while not self._jobs:
                self._ready.wait()
            job = self._jobs.popleft()
            if job is None:
                return None
            group = [job]
            if job.batch_key is not None and self.max_batch > 1:
                for other in list(self._jobs):
                    if len(group) >= self.max_batch:
                        break
                    if other is not None and other.batch_key == job.batch_key:
                        self._jobs.remove(other)
                        group.append(other)
            return group

    def _run(self, group: list[Job]) -> None:
        live = [j for j in group if not j.cancelled.is_set()]
        try:
            if len(live) == 1:
                live[0].emit(("result", live[0].fn(live[0])))
            elif live:
                for job, result in zip(live, live[0].batch_fn(live), strict=True):
                    job.emit(("result", result))
        except Exception as e:  # noqa: BLE001 - reported to every request as its error
            for job in live:
                job.emit(("error", _as_api_error(e)))
        finally:
            self.batches = [*self.batches[-999:], len(group)]
            with self._ready:
                self._outstanding -= len(group)
            for job in group:
                job.emit(_DONE)

    def _loop(self) -> None:
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(self.scope())
            except Exception as e:  # noqa: BLE001 - serve without it rather than not at all
                print(f"note: serving without the packed weights ({type(e).__name__}: {e})",
                      file=sys.stderr)
            while (group := self._next()) is not None:
                self._run(group)

    def submit(self, fn: Callable[[Job], Any], batch_key: Hashable | None = None,
               batch_fn: Callable[[list[Job]], list[Any]] | None = None,
               payload: Any = None) -> Job:
        """Queue ``fn`` (``payload``: what ``batch_fn`` reads of each job); a full queue is a
        429 (nothing is queued then)."""
        job = Job(fn, asyncio.get_running_loop(), batch_key, batch_fn, payload)
        with self._ready:
            if self._outstanding >= self.max_queue:
                raise APIError(429, f"the server is busy: {self.max_queue} requests are "
                                    f"already waiting; retry later", code="queue_full")
            self._outstanding += 1
            self._jobs.append(job)
            self._ready.notify()
        return job

    async def events(self, job: Job) -> AsyncIterator[Any]:
        """The events a job emits, then its result as ("result", value) or its error raised.
        Leaving the loop early (a client gone) cancels the job."""
        try:
            while True:
                event = await job.events.get()
                if event is _DONE:
                    return
                if isinstance(event, tuple) and event and event[0] == "error":
                    raise event[1]
                yield event
        finally:
            job.cancelled.set()

    async def call(self, fn: Callable[[Job], Any]) -> Any:
        """Run ``fn`` on the worker and return its result (its events are dropped)."""
        result = None
        async for event in self.events(self.submit(fn)):
            if isinstance(event, tuple) and event and event[0] == "result":
                result = event[1]
        return result
