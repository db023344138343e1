"""Worker threads for blocking filesystem calls. The stuck-job rule: while jobs wait for a
thread, jobs running for :data:`STUCK_AFTER` seconds stop counting against
``max_workers``: a hung network or FUSE mount may never return (upstream has 512)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Final, TypeVar

__all__ = [
    "DEFAULT_MAX_WORKERS",
    "MAX_WAITING",
    "STUCK_AFTER",
    "WorkerPool",
    "shared_pool",
    "waiting_on_others",
]

T = TypeVar("T")

DEFAULT_MAX_WORKERS: Final = 16
DEFAULT_IDLE_TIMEOUT: Final = 30.0
#: Most jobs at once that gave their place back (waiting on others, or stuck).
MAX_WAITING: Final = 256
#: Seconds after which a running job gives its place to a job waiting for a thread.
STUCK_AFTER: Final = 0.25

_Deliver = Callable[[object, BaseException | None], None]
#: (loop, deliver(result, error) run on that loop, the call)
_Job = tuple[asyncio.AbstractEventLoop, _Deliver, Callable[[], object]]


class _JobLocal(threading.local):
    # The pool whose job this thread runs, and its record of the thread.
    pool: WorkerPool | None = None
    worker: _Worker | None = None


_job_local: Final = _JobLocal()


@contextlib.contextmanager
def waiting_on_others() -> Iterator[None]:
    """Around a wait only another party ends (a FIFO's reader): the job's place is free."""
    pool = _job_local.pool
    worker = _job_local.worker
    released = pool is not None and worker is not None and pool._release_place(worker)
    try:
        yield
    finally:
        if released:
            assert pool is not None and worker is not None
            # One thread over the maximum until one exits; no new thread starts meanwhile.
            with pool._lock:
                pool._count_in(worker)


def _deliver(fut: asyncio.Future[list[object]], result: object, exc: BaseException | None) -> None:
    if fut.done():  # the caller was cancelled meanwhile
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result([result])  # boxed: see WorkerPool.run


def _unbox(deliver: _Deliver, box: list[object], error: BaseException | None) -> None:
    deliver(box.pop(), error)


class _Worker:
    __slots__ = ("busy_since", "inbox", "released")

    def __init__(self) -> None:
        self.inbox: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self.busy_since = 0.0  # time.monotonic() when its job started; 0.0 while idle
        self.released = False  # its job gave its place back (changed under the pool lock)


class WorkerPool:
    """Run blocking callables in threads started on demand and await them from any loop."""

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
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []  # LIFO: the most recently used thread first
        self._busy: set[_Worker] = set()
        self._backlog: collections.deque[_Job] = collections.deque()
        self._check_pending = False  # an :meth:`_unstick` is scheduled
        self._threads = 0
        self._waiting = 0  # jobs that gave their place back

    @property
    def threads(self) -> int:
        return self._threads

    async def run(self, fn: Callable[..., T], /, *args: object, **kwargs: object) -> T:
        """Run ``fn(*args, **kwargs)`` in a worker thread (cancelling drops the result)."""
        fut: asyncio.Future[list[object]] = asyncio.get_running_loop().create_future()
        self.submit(functools.partial(_deliver, fut), fn, *args, **kwargs)
        try:
            # Boxed: the done future outlives this, a big result must not (an 85 MiB reply).
            return (await fut).pop()  # type: ignore[return-value]
        finally:
            # Break frame -> future -> error -> traceback -> frame (a 64 MiB write's data).
            del fut

    def submit(
        self, deliver: _Deliver, fn: Callable[..., object], /, *args: object, **kwargs: object
    ) -> None:
        """For callbacks: ``deliver(result, error)`` runs on this thread's loop at the end."""
        call = functools.partial(fn, *args, **kwargs) if args or kwargs else fn
        loop = asyncio.get_running_loop()
        job: _Job = (loop, deliver, call)
        worker: _Worker | None = None
        start = False
        check = False
        with self._lock:
            if self._idle:
                worker = self._idle.pop()
            elif self._threads < self._max:
                self._threads += 1
                worker = _Worker()
                start = True
            else:
                self._backlog.append(job)
                check = not self._check_pending
                self._check_pending = True
        if worker is not None:
            if start:
                self._start(worker)
            worker.inbox.put(job)
        elif check:
            self._unstick(loop)

    def _start(self, worker: _Worker) -> None:
        # Daemons: an interrupted write_file leaves at most a temp file behind.
        threading.Thread(
            target=self._work, args=(worker,), name="exec-server-fs", daemon=True
        ).start()

    def _release_place(self, worker: _Worker) -> bool:
        """Count ``worker`` out and start queued jobs; False if it cannot."""
        with self._lock:
            if not self._count_out(worker):
                return False
            jobs = self._jobs_for_free_places()
        self._start_jobs(jobs)
        return True

    def _count_out(self, worker: _Worker) -> bool:
        # Pool lock held.
        if worker.released or self._waiting >= MAX_WAITING:
            return False
        worker.released = True
        self._waiting += 1
        self._threads -= 1
        return True

    def _jobs_for_free_places(self) -> list[_Job]:
        # Pool lock held: queued jobs that get a new thread each, counted in.
        jobs: list[_Job] = []
        while self._backlog and self._threads < self._max:
            jobs.append(self._backlog.popleft())
            self._threads += 1
        return jobs

    def _start_jobs(self, jobs: list[_Job]) -> None:
        for job in jobs:
            worker = _Worker()
            worker.inbox.put(job)
            self._start(worker)

    def _count_in(self, worker: _Worker) -> None:
        # Pool lock held.
        if worker.released:
            worker.released = False
            self._waiting -= 1
            self._threads += 1

    def _unstick(self, loop: asyncio.AbstractEventLoop) -> None:
        """Count out stuck jobs; look again when the next gets stuck while any job waits."""
        now = time.monotonic()
        with self._lock:
            next_due: float | None = None
            for worker in self._busy:
                since = worker.busy_since
                if worker.released or not since:
                    continue
                if now - since >= STUCK_AFTER:
                    self._count_out(worker)
                elif next_due is None or since + STUCK_AFTER < next_due:
                    next_due = since + STUCK_AFTER
            jobs = self._jobs_for_free_places()
            if not self._backlog:
                next_due = None
            self._check_pending = next_due is not None
        self._start_jobs(jobs)
        if next_due is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed
                loop.call_later(max(0.0, next_due - now), self._unstick, loop)

    def _work(self, worker: _Worker) -> None:
        job: _Job | None = None
        while True:
            if job is None:
                try:
                    job = worker.inbox.get(timeout=self._idle_timeout)
                except queue.Empty:
                    with self._lock:
                        if worker in self._idle:
                            self._idle.remove(worker)
                            self._threads -= 1
                            return
                    continue  # a job was handed to us meanwhile: take it
            loop, deliver, call = job
            result: object = None
            error: BaseException | None = None
            _job_local.pool = self
            _job_local.worker = worker
            worker.busy_since = time.monotonic()
            with self._lock:
                self._busy.add(worker)
            try:
                result = call()
            except BaseException as exc:  # handed to the awaiting task
                error = exc
                # Free the failed call's locals (a 64 MiB write's data) before answering.
                traceback.clear_frames(exc.__traceback__)
            finally:
                _job_local.pool = None
                _job_local.worker = None
            del call  # and its arguments
            # Idle before answering: the client's next request then finds this thread free.
            with self._lock:
                self._busy.discard(worker)
                worker.busy_since = 0.0
                self._count_in(worker)
                job = self._backlog.popleft() if self._backlog else None
                if job is None:
                    self._idle.append(worker)
            # Boxed: this thread may still be in call_soon_threadsafe when the caller runs on.
            box = [result]
            result = None
            with contextlib.suppress(RuntimeError):  # the loop is gone
                loop.call_soon_threadsafe(_unbox, deliver, box, error)
            del box, loop, deliver, result, error


_SHARED: WorkerPool | None = None
_SHARED_LOCK = threading.Lock()


def shared_pool() -> WorkerPool:
    """The process-wide pool (like asyncio's default executor); created on first use."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = WorkerPool()
        return _SHARED
