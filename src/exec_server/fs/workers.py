"""Worker threads for blocking filesystem calls.

Why not ``asyncio.to_thread``: on the machines we measured, its
``ThreadPoolExecutor`` hand-off costs ~130 µs per call, more than the
``stat`` it wraps and most of an ``fs/getMetadata`` round trip. This pool hands
work over through a ``queue.SimpleQueue`` (C-level blocking get) and answers
with one ``call_soon_threadsafe``: ~50 µs.

Threads start on demand up to ``max_workers`` (so one long copy or remove
never holds up other calls, PROTOCOL.md §9.3's "worker thread"), and an idle
thread exits after ``idle_timeout`` seconds, so an idle server keeps none.
Threads are daemons: an interrupted ``write_file`` leaves at most a temp file
behind, never a half-written target (the write is a rename).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import queue
import threading
from collections.abc import Callable
from typing import Final, TypeVar

__all__ = ["DEFAULT_MAX_WORKERS", "WorkerPool", "shared_pool"]

T = TypeVar("T")

DEFAULT_MAX_WORKERS: Final = 16
DEFAULT_IDLE_TIMEOUT: Final = 30.0

_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[object]", Callable[[], object]]


def _deliver(fut: asyncio.Future[object], result: object, exc: BaseException | None) -> None:
    if fut.done():  # the caller was cancelled meanwhile
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)


class WorkerPool:
    """Run blocking callables in threads and await them from any event loop.

    Args:
        max_workers: most threads alive at once; further jobs queue.
        idle_timeout: seconds an idle thread waits for work before exiting.
    """

    def __init__(
        self,
        *,
        max_workers: int = DEFAULT_MAX_WORKERS,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
    ) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self._max = max_workers
        self._idle_timeout = idle_timeout
        self._queue: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for work and not yet promised a job
        self._threads = 0

    @property
    def threads(self) -> int:
        """Threads currently alive (for tests and diagnostics)."""
        return self._threads

    async def run(self, fn: Callable[..., T], /, *args: object, **kwargs: object) -> T:
        """Run ``fn(*args, **kwargs)`` in a worker thread and return its result.

        Cancelling the caller does not interrupt the call already running;
        its result is dropped.
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[object] = loop.create_future()
        call = functools.partial(fn, *args, **kwargs) if args or kwargs else fn
        start = False
        with self._lock:
            if self._idle > 0:
                self._idle -= 1
            elif self._threads < self._max:
                self._threads += 1
                start = True
        self._queue.put((loop, fut, call))
        if start:
            threading.Thread(target=self._work, name="exec-server-fs", daemon=True).start()
        return await fut  # type: ignore[return-value]

    def _work(self) -> None:
        while True:
            try:
                loop, fut, call = self._queue.get(timeout=self._idle_timeout)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:
                        self._idle -= 1
                        self._threads -= 1
                        return
                continue  # a job was promised to an idle thread: take it
            result: object = None
            error: BaseException | None = None
            try:
                result = call()
            except BaseException as exc:  # handed to the awaiting task
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop is gone
                loop.call_soon_threadsafe(_deliver, fut, result, error)
            del loop, fut, call, result, error
            with self._lock:
                self._idle += 1


_SHARED: WorkerPool | None = None
_SHARED_LOCK = threading.Lock()


def shared_pool() -> WorkerPool:
    """The process-wide pool (like asyncio's default executor); created on first use."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = WorkerPool()
        return _SHARED
