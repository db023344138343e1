"""Run a batch of independent blocking calls on a few helper threads, the caller included.

Why: some filesystem work waits on the device, not the CPU. Removing a file
whose blocks ext4 discards synchronously (``-o discard`` without a journal,
as on this project's CI machine) waits ~80 µs per file, nearly all of it
idle; overlapping those waits took a 200-file tree from 16.5 ms to 7.5 ms
with eight threads. CPU-bound work gains nothing (the GIL), so callers fan
out only once they have measured that they wait (see ``ops._remove_tree``).

The caller always works through its own batch too. A task may fan out again
(nested batches); nobody ever waits for a task that is not running, so
nested use cannot deadlock even when every helper is busy.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import Final

__all__ = ["DEFAULT_HELPERS", "FanOut", "shared_fanout"]

#: Helper threads besides the caller: enough to keep a slow device busy.
DEFAULT_HELPERS: Final = 7
#: Seconds an idle helper waits for a batch before it exits.
_IDLE_TIMEOUT: Final = 30.0


class _Batch:
    """Tasks handed out one at a time; the first error stops the ones not started."""

    __slots__ = ("done", "error", "lock", "next", "tasks", "unfinished")

    def __init__(self, tasks: Sequence[Callable[[], object]]) -> None:
        self.tasks = tasks
        self.next = 0
        self.unfinished = len(tasks)
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.error: BaseException | None = None

    def work(self) -> None:
        """Run tasks until none is left (called by the owner and by helpers)."""
        while True:
            with self.lock:
                if self.next >= len(self.tasks):
                    return
                task = self.tasks[self.next]
                self.next += 1
            try:
                task()
            except BaseException as exc:  # re-raised in the caller
                with self.lock:
                    if self.error is None:
                        self.error = exc
                    # Abandon the tasks nobody started yet.
                    self.unfinished -= len(self.tasks) - self.next
                    self.next = len(self.tasks)
            with self.lock:
                self.unfinished -= 1
                if not self.unfinished:
                    self.done.set()


class FanOut:
    """A lazily started set of helper threads shared by every caller.

    Args:
        helpers: most helper threads alive at once (the caller is extra).
        idle_timeout: seconds an idle helper waits before it exits.
    """

    def __init__(
        self, *, helpers: int = DEFAULT_HELPERS, idle_timeout: float = _IDLE_TIMEOUT
    ) -> None:
        self._max = helpers
        self._idle_timeout = idle_timeout
        self._inbox: queue.SimpleQueue[_Batch] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0

    @property
    def threads(self) -> int:
        """Helper threads currently alive (for tests and diagnostics)."""
        return self._threads

    def run(self, tasks: Sequence[Callable[[], object]], *, width: int | None = None) -> None:
        """Run every task (helpers join in); re-raise the first error once all stopped.

        ``width``: most threads on this batch, the caller included (default:
        every helper). For work that keeps the CPU busy in the kernel rather
        than waiting, more threads than CPUs only add switching.
        """
        helpers = self._max if width is None else min(self._max, width - 1)
        if len(tasks) <= 1 or helpers < 1:
            for task in tasks:
                task()
            return
        batch = _Batch(tasks)
        wanted = min(helpers, len(tasks) - 1)
        with self._lock:
            new = max(0, wanted - self._threads)
            self._threads += new
        for _ in range(new):
            threading.Thread(target=self._help, name="exec-server-fanout", daemon=True).start()
        for _ in range(wanted):
            self._inbox.put(batch)
        batch.work()
        batch.done.wait()
        if batch.error is not None:
            raise batch.error

    def _help(self) -> None:
        while True:
            try:
                batch = self._inbox.get(timeout=self._idle_timeout)
            except queue.Empty:
                with self._lock:
                    if self._inbox.empty():
                        self._threads -= 1
                        return
                continue
            batch.work()
            del batch


_SHARED: FanOut | None = None
_SHARED_LOCK = threading.Lock()


def shared_fanout() -> FanOut:
    """The process-wide helpers; created on first use."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = FanOut()
        return _SHARED
