"""Keep the server's resident memory near what it uses: at start-up, and after big transfers.

Why freeze: the imports leave ~27k long-lived objects in the garbage
collector's oldest generation, and every full collection walks them all. In
a ``bench_fs.py`` run the server made three full collections that stalled
the event loop for up to 9.9 ms each (27.7 ms in all); with those objects
moved to the permanent generation (``gc.freeze``) the same three took at
most 0.99 ms (1.9 ms in all). What the server allocates later is collected
as before.

Why trim: import-time temporaries are freed by then; ``malloc_trim`` hands
their pages back to the OS, so the server idles at a smaller RSS (glibc
only, best effort).

Why trim again after big transfers (:class:`HeapReleaser`): glibc raises its
mmap threshold up to 32 MiB after the first big block is freed, so later
blocks of a few MiB to 32 MiB (a file, its base64 text, a reply) come from the
malloc heaps, and stay resident once freed. After two clients had each read
and written two 24 MiB files at once, the server held 85-131 MiB more than
before, used by nothing; one ``malloc_trim`` a second after the last big
transfer brings that to 24-49 MiB (the rest is the top of the worker threads'
heaps, which glibc trims only on its own terms). The trim takes ~6 ms, so it
runs in a worker thread, and only once transfers stop: a busy server pays
nothing.

Why also watch the resident size (:meth:`HeapReleaser.watch`): memory that
no big message brought in stayed too. A ``readFile`` of ``/dev/zero`` reads to
the 512 MiB cap in 1 MiB pieces and fails with a small reply: the server kept
545 MiB more than before, for good (found by an audit), and so did 100 busy
processes' output once they were gone (270 MiB). Every
:data:`WATCH_INTERVAL` seconds the releaser reads ``/proc/self/statm``; if the
resident size grew by :data:`WATCH_GROWTH` since it last settled, it trims.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import os
from collections.abc import Callable
from typing import Final

from exec_server.fs.workers import shared_pool

__all__ = [
    "BIG_TRANSFER",
    "RELEASE_DELAY",
    "WATCH_GROWTH",
    "WATCH_INTERVAL",
    "HeapReleaser",
    "heap_releaser",
    "settle_startup_heap",
]

#: Bytes: a message or reply at least this big arms :class:`HeapReleaser`.
BIG_TRANSFER: Final = 4 << 20
#: Seconds without a big transfer before the freed memory is handed back.
RELEASE_DELAY: Final = 1.0
#: Seconds between looks at the resident size (:meth:`HeapReleaser.watch`).
WATCH_INTERVAL: Final = 5.0
#: Bytes the resident size may grow past where it settled before a trim is tried.
WATCH_GROWTH: Final = 64 << 20
_PAGE_SIZE: Final = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int | None:
    """This process's resident size (``/proc/self/statm``), or None where unknown."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return None



def _load_malloc_trim() -> Callable[[], object] | None:
    # The C library already loaded (as elsewhere in the project): ``find_library``
    # would run ``ldconfig -p`` in a subprocess at every start.
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to call
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


_malloc_trim: Final = _load_malloc_trim()


def settle_startup_heap() -> None:
    """Collect start-up garbage, freeze what survives, return freed memory to the OS."""
    gc.collect()
    gc.freeze()
    if _malloc_trim is not None:
        _malloc_trim()


def _ignore(result: object, error: BaseException | None) -> None:
    del result, error  # best effort: a failed trim changes nothing


class HeapReleaser:
    """Call ``trim`` in a worker thread once ``delay`` seconds passed without a big transfer.

    ``trim`` None (no glibc) makes :meth:`note_transfer` a no-op.
    """

    def __init__(
        self,
        trim: Callable[[], object] | None,
        delay: float = RELEASE_DELAY,
        *,
        resident: Callable[[], int | None] = resident_bytes,
    ) -> None:
        self._trim = trim
        self._delay = delay
        self._resident = resident
        self._timer: asyncio.TimerHandle | None = None
        self._watcher: asyncio.TimerHandle | None = None
        #: the resident size where it settled (None: take the next look's).
        self._settled: int | None = None
        #: trims started so far (diagnostics and tests).
        self.releases = 0

    def watch(self, interval: float = WATCH_INTERVAL, growth: int = WATCH_GROWTH) -> None:
        """From the event loop: look at the resident size every ``interval`` seconds
        and trim once it grew by ``growth`` bytes past where it settled (see the
        module doc). Cheap: one small file read per look. Until :meth:`unwatch`."""
        if self._trim is None or self._watcher is not None:
            return
        self._settled = self._resident()
        loop = asyncio.get_running_loop()
        self._watcher = loop.call_later(interval, self._look, interval, growth)

    def unwatch(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None

    def _look(self, interval: float, growth: int) -> None:
        size = self._resident()
        settled = self._settled
        if size is not None:
            if settled is None or size < settled:
                self._settled = size  # after a trim, or memory given back anyway
            elif size > settled + growth and self._timer is None:
                # (A big transfer's countdown, if running, trims soon anyway.)
                self._settled = None  # where it settles after the trim: the next look
                self._release()
        self._watcher = asyncio.get_running_loop().call_later(
            interval, self._look, interval, growth
        )

    def note_transfer(self, size: int) -> None:
        """From the event loop: ``size`` bytes came in or went out; a big transfer
        (re)starts the countdown."""
        if size < BIG_TRANSFER or self._trim is None:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(self._delay, self._release)

    def _release(self) -> None:
        self._timer = None
        self.releases += 1
        assert self._trim is not None
        shared_pool().submit(_ignore, self._trim)


_RELEASER: Final = HeapReleaser(_malloc_trim)


def heap_releaser() -> HeapReleaser:
    """The process-wide releaser: the heap it trims is the process's."""
    return _RELEASER
