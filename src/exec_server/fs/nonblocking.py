"""Tell, without blocking, whether looking a path up could wait on a filesystem.

Why: a ``stat`` or ``open`` of a path on a hung network or FUSE mount waits
until that filesystem's server or daemon answers. ``fs/*`` calls never touch
the filesystem on the event loop (they all run in worker threads); a plain
``process/start`` spawns on the loop, and its ``vfork`` waits until the child
has changed to its cwd and exec'd its program. ``process/pipes.py`` asks
:func:`lookup` for both and spawns in a worker thread unless both are
:data:`LOCAL`.

How (Linux 5.12+): ``openat2(O_PATH, RESOLVE_CACHED)`` resolves the path from
the dentry cache only, failing with ``EAGAIN`` where a filesystem would have
to be asked (an uncached name, or one whose cache entry its filesystem wants
to revalidate); ``statx(AT_STATX_DONT_SYNC, STATX_MNT_ID)`` of the result then
names its mount without asking the filesystem either, and only filesystems
whose cached attributes are the truth (local disks, tmpfs, overlay, procfs,
...: :data:`LOCAL_TYPES`, read from ``/proc/self/mountinfo`` and re-read
when the mount table changes) count as :data:`LOCAL`. A cached "no such
entry" is :data:`MISSING`: the same answer a blocking lookup would give now,
since the filesystem accepted that cache entry without being asked.
Elsewhere (macOS, older kernels, no ``/proc``) every answer is
:data:`UNKNOWN`: everything goes to a worker.
"""

from __future__ import annotations

import ctypes
import enum
import errno
import os
import select
import sys
import threading
import time
from typing import Final

__all__ = ["LOCAL_TYPES", "Lookup", "available", "lookup"]


class Lookup(enum.Enum):
    """What the caches say about a path."""

    #: it exists, on a filesystem whose cached state is authoritative
    LOCAL = "local"
    #: nothing is there (a cached negative entry)
    MISSING = "missing"
    #: asking would (or might) wait for a filesystem: use a worker
    UNKNOWN = "unknown"


#: Filesystems whose cached dentries and attributes are the truth: nothing to
#: ask a server or daemon, so a lookup that resolved from the cache does not wait.
LOCAL_TYPES: Final = frozenset(
    {
        "bcachefs", "btrfs", "devpts", "devtmpfs", "exfat", "ext2", "ext3", "ext4",
        "f2fs", "hfsplus", "jfs", "msdos", "nilfs2", "ntfs3", "overlay", "proc",
        "ramfs", "reiserfs", "sysfs", "tmpfs", "vfat", "xfs", "zfs",
    }
)  # fmt: skip

_SYS_OPENAT2: Final = 437  # the same number on every Linux architecture
_RESOLVE_CACHED: Final = 0x20
_AT_FDCWD: Final = -100
_AT_EMPTY_PATH: Final = 0x1000
_AT_STATX_DONT_SYNC: Final = 0x4000
_STATX_MNT_ID: Final = 0x1000
_O_PATH: Final = getattr(os, "O_PATH", 0)
_STATX_SIZE: Final = 256
#: Seconds between two checks for a changed mount table.
_POLL_INTERVAL: Final = 0.05
_STX_MASK_OFFSET: Final = 0
_STX_MNT_ID_OFFSET: Final = 144
#: ``STATX_BASIC_STATS``: mode, size, times, ... (all a local filesystem fills in).
_STATX_BASIC: Final = 0x7FF


class _OpenHow(ctypes.Structure):
    _fields_ = [
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    ]


_HOW_SIZE: Final = ctypes.sizeof(_OpenHow)
# Arguments of the variadic ``syscall``, typed once.
_NR_OPENAT2: Final = ctypes.c_long(_SYS_OPENAT2)
_CWD: Final = ctypes.c_int(_AT_FDCWD)
_HOW_SIZE_ARG: Final = ctypes.c_size_t(_HOW_SIZE)
_FOLLOW: Final = _O_PATH | os.O_CLOEXEC
_NOFOLLOW: Final = _O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW
_STATX_FLAGS: Final = _AT_EMPTY_PATH | _AT_STATX_DONT_SYNC
_STATX_WANT: Final = _STATX_BASIC | _STATX_MNT_ID


class _Buffers:
    """One thread's ``open_how`` and ``statx`` buffers, as ready-made arguments."""

    __slots__ = ("how", "how_ref", "mask", "mnt_id", "statx", "statx_ref")

    def __init__(self) -> None:
        self.how = _OpenHow()
        self.how_ref = ctypes.byref(self.how)
        self.statx = ctypes.create_string_buffer(_STATX_SIZE)
        self.statx_ref = ctypes.byref(self.statx)
        self.mask = ctypes.c_uint32.from_buffer(self.statx, _STX_MASK_OFFSET)
        self.mnt_id = ctypes.c_uint64.from_buffer(self.statx, _STX_MNT_ID_OFFSET)


class _Kernel:
    """``openat2`` and ``statx`` through libc, and the mount table's types by id.

    The foreign functions take ctypes objects made once, without ``argtypes``:
    converting each argument per call cost ~1.8 µs of a ~6.5 µs look-up.
    """

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._syscall = libc.syscall
        self._syscall.restype = ctypes.c_long
        self._statx = libc.statx
        self._statx.restype = ctypes.c_int
        # Per-thread buffers: the fast paths run on the loop, tests and the
        # client's local backend may call from other threads too.
        self._local = threading.local()
        self._lock = threading.Lock()
        self._types: dict[int, str] = {}
        self._mountinfo = os.open("/proc/self/mountinfo", os.O_RDONLY | os.O_CLOEXEC)
        self._changes = select.poll()
        self._changes.register(self._mountinfo, select.POLLPRI | select.POLLERR)
        self._changes.poll(0)  # consume the first "changed": the table is read next
        self._next_poll = 0.0
        self._read_mounts()

    def _buffers(self) -> _Buffers:
        bufs: _Buffers | None = getattr(self._local, "bufs", None)
        if bufs is None:
            bufs = self._local.bufs = _Buffers()
        return bufs

    def open_cached(self, path: bytes, follow: bool) -> int:
        """An ``O_PATH`` descriptor of ``path`` resolved from the dentry cache;
        raises ``OSError`` (``EAGAIN``: not all of it is cached)."""
        bufs = self._buffers()
        how = bufs.how
        how.flags = _FOLLOW if follow else _NOFOLLOW
        how.resolve = _RESOLVE_CACHED
        fd: int = self._syscall(_NR_OPENAT2, _CWD, path, bufs.how_ref, _HOW_SIZE_ARG)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return fd

    def is_local(self, fd: int) -> bool:
        """Whether ``fd`` is on a local filesystem (``statx`` of its mount id, asked of
        the VFS only)."""
        bufs = self._buffers()
        if self._statx(fd, b"", _STATX_FLAGS, _STATX_WANT, bufs.statx_ref):
            return False
        if bufs.mask.value & _STATX_WANT != _STATX_WANT:
            return False
        return self.mount_type(bufs.mnt_id.value) in LOCAL_TYPES

    def mount_type(self, mount: int) -> str | None:
        now = time.monotonic()
        if now >= self._next_poll:
            # Mounted or unmounted since? Ids are reused, so the table is read again.
            # Asked at most every _POLL_INTERVAL (the poll is a third of a look-up).
            with self._lock:
                self._next_poll = now + _POLL_INTERVAL
                if self._changes.poll(0):
                    self._read_mounts()
        return self._types.get(mount)

    def _read_mounts(self) -> None:
        os.lseek(self._mountinfo, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(self._mountinfo, 1 << 16):
            chunks.append(chunk)
        types: dict[int, str] = {}
        for line in b"".join(chunks).splitlines():
            fields = line.split(b" ")
            try:
                after = fields.index(b"-")
                types[int(fields[0])] = fields[after + 1].decode("ascii", "replace")
            except (ValueError, IndexError):
                continue
        self._types = types


def _load() -> _Kernel | None:
    if not sys.platform.startswith("linux") or not _O_PATH:
        return None
    try:
        kernel = _Kernel()
    except (OSError, AttributeError):
        return None
    try:  # the kernel must know openat2 and RESOLVE_CACHED (5.12+)
        os.close(kernel.open_cached(b"/", follow=True))
    except OSError:
        return None
    return kernel


_kernel: Final = _load()


def available() -> bool:
    """Whether :func:`lookup` can ever say anything but :data:`Lookup.UNKNOWN` here."""
    return _kernel is not None


def lookup(path: str | bytes, *, follow: bool = True) -> Lookup:
    """What a ``stat`` (``follow``) or ``lstat`` of ``path`` would meet, if that can
    be known without waiting for any filesystem (see module doc)."""
    try:
        fd = _open_cached(path, follow)
    except FileNotFoundError:
        return Lookup.MISSING
    if fd is None:
        return Lookup.UNKNOWN
    try:
        assert _kernel is not None
        return Lookup.LOCAL if _kernel.is_local(fd) else Lookup.UNKNOWN
    finally:
        os.close(fd)


def _open_cached(path: str | bytes, follow: bool) -> int | None:
    """An ``O_PATH`` descriptor of ``path`` resolved from the dentry cache only, None
    when that cannot be done here; raises ``FileNotFoundError`` for a cached miss."""
    kernel = _kernel
    if kernel is None:
        return None
    try:
        return kernel.open_cached(os.fsencode(path), follow)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path) from None
        return None
    except ValueError:  # an embedded NUL: the real call reports it
        return None
