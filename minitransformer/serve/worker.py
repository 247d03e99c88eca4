"""A request queue in front of the model, and the one thread that runs it.

The event loop never runs the model: every job (a completion, an inspection) goes into a
queue, and one worker thread takes them in order, so requests never interleave inside the
model (no cross-talk) and streaming and disconnects stay responsive. A job reports to its
request through ``emit``, which hands each event to the event loop thread-safely; a request
that goes away sets ``cancelled`` and its job stops at its next step.

Admission: at most ``max_queue`` jobs waiting or running; one more is refused (429).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from .errors import APIError

_DONE = object()  # the last event of every job


class Job:
    """One unit of model work: ``fn(job)`` runs on the worker thread and may ``emit``."""

    def __init__(self, fn: Callable[[Job], Any], loop: asyncio.AbstractEventLoop):
        self.fn, self.loop = fn, loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()

    def emit(self, event: Any) -> None:
        """Hand an event to the waiting request (called on the worker thread)."""
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)


class Worker:
    """The queue and its thread; ``start`` once, ``stop`` at shutdown."""

    def __init__(self, max_queue: int = 64):
        self.max_queue = max_queue
        self._jobs: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._outstanding = 0  # waiting + running
        self._thread: threading.Thread | None = None

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
            self._jobs.put(None)
            self._thread.join(timeout)
            self._thread = None

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                if not job.cancelled.is_set():
                    job.emit(("result", job.fn(job)))
            except APIError as e:
                job.emit(("error", e))
            except Exception as e:  # noqa: BLE001 - reported to the request as a 500
                job.emit(("error", APIError(500, f"internal error: {type(e).__name__}: {e}",
                                            code="internal_error")))
            finally:
                with self._lock:
                    self._outstanding -= 1
                job.emit(_DONE)

    def submit(self, fn: Callable[[Job], Any]) -> Job:
        """Queue ``fn``; a full queue is a 429 (nothing is queued then)."""
        with self._lock:
            if self._outstanding >= self.max_queue:
                raise APIError(429, f"the server is busy: {self.max_queue} requests are "
                                    f"already waiting; retry later", code="queue_full")
            self._outstanding += 1
        job = Job(fn, asyncio.get_running_loop())
        self._jobs.put(job)
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
