"""Unnamed files made ahead of time in the directories just written to.

Why: ``write_file`` replaces a file through a new temp file (a failed write
never leaves half a file), so every write creates an inode, and on some
filesystems creating one is slow. On ext4 without a journal (common in the
small VMs agents run in, and this project's CI machine) the inode allocator
skips every inode of its group freed in the last 60 s, or 300 s while the
inode table is dirty, one buffer lookup each: after a test suite or a build
deletes a few thousand files, each creation there took 0.4-0.7 ms (measured;
5-15 µs in a quiet group). Upstream writes in place (``O_TRUNC``), creating
nothing.

So a write takes an unnamed file (``O_TMPFILE``) made in its directory
ahead of time, gives it a name (``linkat``) and swaps it in as before, and a
single-file copy to a new destination fills one linked at that name; the
worker thread that ran the call makes the next spare there once the call is
answered (``workers.after_answer``). The creation still costs what it costs,
but while the client reads the answer and sends its next request, not inside
a request. Not made by a thread of its own: woken per write, it contended
for the GIL with the next request and made 1 KiB writes slower (0.25-0.35 ->
0.40-0.64 ms). Only for directories where creating a file is slow
(:meth:`SpareFiles.note_create`): elsewhere the spare made after each answer
only delays a client that sends its next request at once.

Bounds: at most :data:`MAX_DIRECTORIES` spares (one per directory), each
closed after :data:`KEEP_SECONDS` unused by a reaper thread that wakes once
per :data:`KEEP_SECONDS` at most and exits when none is left, so an idle
server holds no spare descriptor. A spare is given out only while its
directory's path still names the directory it was made in (device and inode
compared), so a file never inherits the default ACL or set-group-ID group of
a directory that was replaced meanwhile.

Linux only (``O_TMPFILE`` and ``/proc/self/fd``); elsewhere, and on
filesystems that refuse ``O_TMPFILE``, :meth:`SpareFiles.take` returns None
and writes create their temp file as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import threading
import time
from collections.abc import Callable
from typing import Final, NamedTuple

from exec_server.fs.workers import after_answer

__all__ = [
    "FAST_CREATE",
    "KEEP_SECONDS",
    "MAX_DIRECTORIES",
    "SLOW_CREATE",
    "SpareFiles",
    "link_unnamed",
    "shared_spares",
]

#: Seconds an unused spare is kept before it is closed.
KEEP_SECONDS: Final = 3.0
#: Most directories holding a spare at once (the least recently made goes first).
MAX_DIRECTORIES: Final = 4
#: Seconds: a directory gets spares once creating a file there averages this long...
SLOW_CREATE: Final = 100e-6
#: ...and stops once it averages less than this.
FAST_CREATE: Final = 50e-6
#: Weight of the newest creation in a directory's moving average.
_WEIGHT: Final = 0.25
#: Most directories whose creation cost is tracked (the oldest is forgotten first).
_MAX_TRACKED: Final = 64

_O_TMPFILE: Final = getattr(os, "O_TMPFILE", 0)
_AT_FDCWD: Final = -100
_AT_SYMLINK_FOLLOW: Final = 0x400
#: errors that mean "this filesystem makes no unnamed files": stop asking on that device.
_NO_TMPFILE: Final = frozenset((errno.EOPNOTSUPP, errno.ENOTSUP, errno.EISDIR, errno.EINVAL))


def _load_linkat() -> Callable[..., int] | None:
    if not _O_TMPFILE or not os.path.isdir("/proc/self/fd"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).linkat
    except (AttributeError, OSError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_linkat: Final = _load_linkat()


def link_unnamed(fd: int, path: str) -> None:
    """Give the unnamed file open at ``fd`` the name ``path`` (which must not exist).

    Through ``/proc/self/fd`` (``AT_SYMLINK_FOLLOW``): ``AT_EMPTY_PATH`` would
    need ``CAP_DAC_READ_SEARCH``. (``os.link`` calls plain ``link`` here, which
    links the ``/proc`` entry itself.)

    Raises:
        OSError: as ``linkat`` fails (``FileExistsError`` if ``path`` is taken).
    """
    if _linkat is None:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS), path)
    source = f"/proc/self/fd/{fd}".encode()
    if _linkat(_AT_FDCWD, source, _AT_FDCWD, os.fsencode(path), _AT_SYMLINK_FOLLOW) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)


class _Spare(NamedTuple):
    fd: int
    dev: int
    ino: int
    made: float


class SpareFiles:
    """Spare unnamed files, one per recently written directory (see the module doc).

    Args:
        keep: seconds an unused spare is kept.
        max_directories: most spares held at once.
    """

    def __init__(
        self, *, keep: float = KEEP_SECONDS, max_directories: int = MAX_DIRECTORIES
    ) -> None:
        self._keep = keep
        self._max = max_directories
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # the reaper's timed waits
        self._spares: dict[str, _Spare] = {}  # insertion order: oldest first
        self._reaper: threading.Thread | None = None
        self._no_tmpfile: set[int] = set()  # devices that refused O_TMPFILE
        #: directory -> moving average of the seconds creating a file there took
        self._cost: dict[str, float] = {}
        self._slow: set[str] = set()  # directories that get spares (see note_create)

    @property
    def supported(self) -> bool:
        """Whether this platform can make spares at all."""
        return _linkat is not None

    def note_create(self, directory: str, seconds: float) -> None:
        """Count a file creation in ``directory`` that took ``seconds``.

        Spares are made only for directories where creating a file is slow
        (a moving average of at least :data:`SLOW_CREATE`, until it falls under
        :data:`FAST_CREATE`): elsewhere the work after each answer would only
        delay a client that sends its next request at once (measured with a
        client that answers in ~25 µs: a quiet directory's 1 KiB write 400 ->
        450-480 µs with spares always made). Callers time their own ``O_CREAT``
        opens; spares made time themselves.
        """
        with self._lock:
            cost = self._cost
            old = cost.pop(directory, None)  # re-inserted last: the oldest go first
            average = seconds if old is None else old + (seconds - old) * _WEIGHT
            cost[directory] = average
            if len(cost) > _MAX_TRACKED:
                forgotten = next(iter(cost))
                del cost[forgotten]
                self._slow.discard(forgotten)
            if average >= SLOW_CREATE:
                self._slow.add(directory)
            elif average < FAST_CREATE:
                self._slow.discard(directory)

    def take(self, directory: str) -> int | None:
        """A spare made in ``directory`` (the caller owns and closes the descriptor),
        or None: always None where creating a file is fast (:meth:`note_create`).

        Called from a worker pool's job, it also has the next spare there made
        once the job is answered (:func:`~exec_server.fs.workers.after_answer`);
        called elsewhere, it only hands out what is there.
        """
        if _linkat is None or directory not in self._slow:
            return None
        after_answer(functools.partial(self.make, directory))
        with self._lock:
            spare = self._spares.pop(directory, None)
        if spare is None:
            return None
        try:
            st = os.stat(directory)
        except OSError:
            st = None
        if st is None or (st.st_dev, st.st_ino) != (spare.dev, spare.ino):
            os.close(spare.fd)  # the path names another directory now
            return None
        return spare.fd

    def make(self, directory: str) -> None:
        """Make a spare in ``directory`` unless one is held there; quietly nothing if the
        directory cannot have one (gone, not writable, no ``O_TMPFILE``)."""
        if _linkat is None:
            return
        with self._lock:
            if directory in self._spares:
                return
        made = self._make(directory)
        if made is None:
            return
        evicted: list[_Spare] = []
        with self._lock:
            old = self._spares.pop(directory, None)  # made meanwhile by another thread
            if old is not None:
                evicted.append(old)
            self._spares[directory] = made
            while len(self._spares) > self._max:
                evicted.append(self._spares.pop(next(iter(self._spares))))
            # Not woken here: it wakes on its own within ``keep`` (and a wake per
            # write would cost two thread switches per write).
            if self._reaper is None:
                self._reaper = threading.Thread(
                    target=self._reap, name="exec-server-spares", daemon=True
                )
                self._reaper.start()
        for spare in evicted:
            os.close(spare.fd)

    def held(self, directory: str) -> int | None:
        """The inode number of the spare held for ``directory``, if any (for tests
        and diagnostics)."""
        with self._lock:
            spare = self._spares.get(directory)
        return None if spare is None else os.fstat(spare.fd).st_ino

    def close_all(self) -> None:
        """Close every spare now."""
        with self._lock:
            spares = list(self._spares.values())
            self._spares.clear()
        for spare in spares:
            os.close(spare.fd)

    def reset_after_fork(self) -> None:
        """In a forked child: close the parent's spares (the child's copies of them)
        and forget its reaper thread, which the child does not have."""
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._reaper = None
        spares, self._spares = self._spares, {}
        for spare in spares.values():
            with contextlib.suppress(OSError):
                os.close(spare.fd)

    def _make(self, directory: str) -> _Spare | None:
        # The identity first: if the path is replaced between the two calls, the
        # spare is in the new directory but carries the old one's identity, so
        # take() never gives it out (it compares with what the path names then).
        try:
            st = os.stat(directory)
        except OSError:
            return None
        if st.st_dev in self._no_tmpfile:
            return None
        try:
            started = time.perf_counter()
            fd = os.open(directory, os.O_WRONLY | _O_TMPFILE | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            if exc.errno in _NO_TMPFILE:
                self._no_tmpfile.add(st.st_dev)
            return None  # gone, not writable, full: the write will say
        now = time.perf_counter()
        self.note_create(directory, now - started)
        return _Spare(fd, st.st_dev, st.st_ino, time.monotonic())

    def _reap(self) -> None:
        """Close spares unused for ``keep`` seconds (at most ``keep`` late); exit once
        none has been held for ``keep`` seconds. Wakes once per ``keep`` at most."""
        with self._lock:
            empty_since: float | None = None
            while True:
                now = time.monotonic()
                stale = [d for d, spare in self._spares.items() if spare.made + self._keep <= now]
                for directory in stale:
                    os.close(self._spares.pop(directory).fd)
                if self._spares:
                    empty_since = None
                    oldest = min(spare.made for spare in self._spares.values())
                    self._changed.wait(oldest + self._keep - now)
                    continue
                if empty_since is None:
                    empty_since = now
                elif now - empty_since >= self._keep:
                    self._reaper = None
                    return
                self._changed.wait(self._keep)


_SHARED: SpareFiles | None = None
_SHARED_LOCK = threading.Lock()


def shared_spares() -> SpareFiles:
    """The process-wide spares (used by ``ops.write_file``); created on first use."""
    global _SHARED
    spares = _SHARED
    if spares is not None:
        return spares  # every write asks: no lock once it exists
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = SpareFiles()
        return _SHARED


def _after_fork_in_child() -> None:
    global _SHARED_LOCK
    _SHARED_LOCK = threading.Lock()
    if _SHARED is not None:
        _SHARED.reset_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
