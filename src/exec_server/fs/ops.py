"""Direct (unsandboxed) filesystem operations with upstream semantics (PROTOCOL.md §9.3).

Everything here is synchronous and blocking on purpose: callers run it in a
worker thread (:mod:`exec_server.fs.service`, :mod:`exec_server.fs.workers`) so the
event loop never stalls, except the few bounded calls that service runs inline.
Paths are absolute, already lexically normalised ``str`` paths (non-UTF-8
bytes as surrogate escapes, which ``os`` functions turn back into bytes).
Every failure leaves as a typed :class:`~exec_server.exceptions.ExecServerError`
mapped in :mod:`exec_server.fs.errors`.

Choices beyond the spec:

* ``write_file`` replaces a regular file atomically (temp file in the same
  directory, then ``rename``), keeping the old file's mode and owner, so a
  failed write never leaves a half-written file where a complete one stood.
  Non-regular targets (devices, FIFOs) are written in place. A write through a
  symlink replaces the link's final target, never the link. Hard links to the
  old file keep the old contents (the inode is replaced). No ``fsync``: atomic
  against failures of this process, not against power loss.
* ``read_file`` never blocks on a FIFO and never reads more than the cap, even
  from files whose ``st_size`` is 0 (``/proc``, devices).
* ``copy`` of a file onto itself is refused instead of truncating it.
* A recursive ``copy`` creates the files of directories it created itself
  with ``O_EXCL`` and sets their permission bits only where the umask (or a
  default ACL) would change them: fewer system calls per file, same result
  as ``std::fs::copy``. Merged directories take the careful path.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

import msgspec

from exec_server.exceptions import InvalidRequestError
from exec_server.fs import memfs
from exec_server.fs.errors import os_error, translate_os_errors
from exec_server.fs.exchange import exchange_into_place, match_old_file
from exec_server.fs.fanout import shared_fanout
from exec_server.fs.spare import link_unnamed, shared_spares
from exec_server.fs.workers import waiting_on_others

__all__ = [
    "COPY_DIR_WITHOUT_RECURSIVE",
    "COPY_INTO_SELF",
    "COPY_UNSUPPORTED_TYPE",
    "READ_LIMIT",
    "DirEntry",
    "Metadata",
    "Payload",
    "Pieces",
    "ReceiveInto",
    "canonicalize",
    "copy",
    "create_directory",
    "get_metadata",
    "open_for_read",
    "payload_bytes",
    "read_and_close",
    "read_directory",
    "read_file",
    "remove",
    "resolve_existing_prefix",
    "write_file",
]

#: ``fs/readFile`` refuses files larger than this (PROTOCOL.md §9.3).
READ_LIMIT = 512 * 1024 * 1024

COPY_DIR_WITHOUT_RECURSIVE = "fs/copy requires recursive: true when sourcePath is a directory"
COPY_INTO_SELF = "fs/copy cannot copy a directory to itself or one of its descendants"
COPY_UNSUPPORTED_TYPE = "fs/copy only supports regular files, directories, and symlinks"
COPY_SAME_FILE = "fs/copy source and destination are the same file"

_CHUNK = 1024 * 1024
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


class Metadata(msgspec.Struct, frozen=True, gc=False):
    """What ``fs/getMetadata`` reports; ``is_symlink``/``size`` are ``None`` when unknown.

    A frozen ``msgspec.Struct``, like :class:`DirEntry`: made per request and
    per directory entry, and ~20x cheaper to build than a frozen dataclass.
    """

    is_directory: bool
    is_file: bool
    created_at_ms: int
    modified_at_ms: int
    is_symlink: bool | None = None
    size: int | None = None


class DirEntry(msgspec.Struct, frozen=True, gc=False):
    """One ``fs/readDirectory`` entry; flags describe the symlink-followed target."""

    file_name: str
    is_directory: bool
    is_file: bool


def too_large_message(limit: int) -> str:
    return f"file is too large to read: limit is {limit} bytes"


def not_a_file_message(path: str) -> str:
    return f"path `{path}` is not a file"


# --------------------------------------------------------------------- read


def read_file(path: str, *, limit: int = READ_LIMIT, regular_only: bool = False) -> bytes:
    """Read a whole file, following symlinks.

    Args:
        limit: refuse (``-32600``) files larger than this many bytes.
        regular_only: the current client's rule (upstream 0.163.0): anything
            but a regular file - a directory, FIFO or device - is
            ``-32600 path `/x` is not a file``, found with a ``stat`` before
            anything is opened (CLIENT_COMPAT.md §6.4 names the directory case);
            a socket is ``-32603 No such device or address``, as upstream answers.
            Otherwise (the legacy rule) a directory is the OS error
            (``-32603 Is a directory``) and FIFOs and devices are read.
    """
    fd, size = open_for_read(path, limit=limit, regular_only=regular_only)
    return read_and_close(fd, size, limit)


def open_for_read(
    path: str, *, limit: int = READ_LIMIT, regular_only: bool = False
) -> tuple[int, int | None]:
    """Open ``path`` for :func:`read_and_close`: ``(fd, st_size if regular else None)``.

    Checks the directory and size-limit cases (see :func:`read_file`); the
    caller owns the returned descriptor.
    """
    with translate_os_errors():
        if regular_only:
            mode = os.stat(path).st_mode
            if stat.S_ISSOCK(mode):
                # What opening it says (upstream opens sockets; the confined
                # helper, which opens first, says the same).
                raise os_error(errno.ENXIO)
            if not stat.S_ISREG(mode):
                raise InvalidRequestError(not_a_file_message(path))
        # O_NONBLOCK: opening a FIFO without a writer must not hang the worker.
        fd = os.open(path, os.O_RDONLY | _O_CLOEXEC | _O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if regular_only and not stat.S_ISREG(st.st_mode):  # replaced since the stat
                raise InvalidRequestError(not_a_file_message(path))
            if stat.S_ISDIR(st.st_mode):
                raise os_error(errno.EISDIR)
            if st.st_size > limit:
                raise InvalidRequestError(too_large_message(limit))
        except BaseException:
            os.close(fd)
            raise
    return fd, (st.st_size if stat.S_ISREG(st.st_mode) else None)


def read_and_close(fd: int, size: int | None, limit: int = READ_LIMIT) -> bytes:
    """Read ``fd`` (from :func:`open_for_read`) to EOF, capped at ``limit``, and close it."""
    with translate_os_errors():
        try:
            return _read_all(fd, size or 0, limit)
        finally:
            os.close(fd)


def _read_all(fd: int, size: int, limit: int) -> bytes:
    """Read to EOF with one file-sized allocation in the common case.

    Past its ``fstat`` size (or for a FIFO, a device) the rest grows one
    buffer: chunks kept apart were each a block of glibc's heap, which keeps
    them resident once freed (a ``/dev/zero`` read to the limit left ~500 MiB
    held for good); one big buffer is a mapping, handed back whole.
    """
    data = bytearray()
    if size > 0:
        # A short read of size+1 means EOF: the bytes object is the only copy.
        first = os.read(fd, size + 1)
        if len(first) <= size:
            return first
        data += first
        del first
    while True:
        try:
            chunk = os.read(fd, _CHUNK)
        except BlockingIOError:
            break
        if not chunk:
            break
        if len(data) + len(chunk) > limit:
            raise InvalidRequestError(too_large_message(limit))
        data += chunk
    return bytes(data)


# -------------------------------------------------------------------- write


Buffer = bytes | bytearray | memoryview
#: ``into(size)``: a buffer of exactly ``size`` bytes to receive a file's contents in,
#: or None to have them as new bytes (the confined helper's client takes one).
ReceiveInto = Callable[[int], memoryview | None]


@dataclass(frozen=True, slots=True)
class Pieces:
    """``size`` bytes given piece by piece by ``produce()`` - each call anew, each piece
    used before the next is asked for - so a big write need not hold all of them
    at once (the server decodes base64 this way). Pieces may raise: the write
    is then abandoned (see :func:`write_file`)."""

    size: int
    produce: Callable[[], Iterable[Buffer]]


#: What :func:`write_file` writes: the bytes, or :class:`Pieces`.
Payload = Buffer | Pieces


def payload_bytes(payload: Payload) -> Buffer:
    """``payload`` as one buffer (for writers that need it whole)."""
    if not isinstance(payload, Pieces):
        return payload
    whole = bytearray()
    for piece in payload.produce():
        whole += piece
    return whole


def write_file(path: str, data: Payload) -> None:
    """Create or replace ``path`` with ``data``; parents are not created (``-32004``).

    A payload given in pieces goes to a temp file piece by piece; if its pieces
    raise, the temp file is removed and the target left as it was. Targets
    written in place (devices, FIFOs, the fallbacks below) get it whole, made
    first.
    """
    _write_file(path, data)


def _write_file(path: str, data: Payload) -> None:
    with translate_os_errors():
        target = path
        st: os.stat_result | None = None
        # Missing: creating the temp file tells a missing parent.
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(path)
        if st is not None and stat.S_ISLNK(st.st_mode):
            # Follow the link: replace its final target, keep the link.
            target = os.path.realpath(path)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                st = None  # dangling: create the target
        if st is not None:
            if stat.S_ISDIR(st.st_mode):
                raise os_error(errno.EISDIR)
            if not stat.S_ISREG(st.st_mode):
                _write_in_place(target, data, _O_NONBLOCK)
                return
            _check_writable(target)
        _write_atomic(target, data, st)


def _check_writable(path: str) -> None:
    """Refuse to replace a file we may not write, as writing it in place would.

    The rename needs only the directory's permission, so without this a
    read-only file (mode 0444, another user's file in a shared directory) was
    replaced where upstream's ``O_TRUNC`` open fails (``EACCES``). Root may
    write anything, as upstream's open shows. Found by an audit.
    """
    if os.access(path, os.W_OK, effective_ids=_EFFECTIVE_ACCESS):
        return
    try:
        read_only = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    raise os_error(errno.EROFS if read_only else errno.EACCES)


_EFFECTIVE_ACCESS: Final = os.access in os.supports_effective_ids


def _write_in_place(path: str, data: Payload, extra_flags: int = 0) -> None:
    # Whole before the target is truncated: a payload that fails half way must
    # not leave it half written.
    whole = payload_bytes(data)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC | extra_flags, 0o666)
    try:
        if extra_flags & _O_NONBLOCK:
            # O_NONBLOCK only kept a FIFO without a reader from hanging the open
            # (ENXIO). Written, it cut a write short once the pipe was full
            # (EAGAIN after 64 KiB): wait for the reader as cp and upstream do,
            # without holding a place in the worker pool.
            os.set_blocking(fd, True)
            with waiting_on_others():
                _write_all(fd, whole)
        else:
            _write_all(fd, whole)
    finally:
        os.close(fd)


def _write_all(fd: int, data: Payload) -> None:
    pieces = (data,) if not isinstance(data, Pieces) else data.produce()
    for piece in pieces:
        view = memoryview(piece).cast("B")
        while view:
            written = os.write(fd, view)
            view = view[written:]


#: Temp names: a random tag per process and a counter (no ``getrandom`` per write).
_temp_tag = secrets.token_hex(4)
_temp_serial = itertools.count()
#: Temp names tried before a write gives up (each taken one means someone made it).
_TEMP_TRIES = 8


def _temp_name(target: str) -> str:
    directory, base = os.path.split(target)
    if len(base) > 100 or not base.isascii():
        # Keep the name under NAME_MAX however long the target's name is.
        base = os.fsencode(base)[:100].decode("utf-8", "surrogateescape")
    sep = "" if directory.endswith("/") else "/"
    return f"{directory}{sep}.{base}.{_temp_tag}{next(_temp_serial):x}.tmp"


def _new_temp_tag() -> None:
    global _temp_tag
    _temp_tag = secrets.token_hex(4)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_temp_tag)  # a child's names differ from ours


def _create_temp(target: str, *, spare: bool = False) -> tuple[str, int]:
    """A new, empty temp file beside ``target``: its name and a write descriptor.

    With ``spare``, the spare unnamed file made in that directory ahead of
    time (:mod:`exec_server.fs.spare`) when one is ready, named here, so this
    write does not wait for an inode to be allocated. Not for an empty
    payload: nothing written, it would keep the spare's older times. A
    creation here is timed for :meth:`~exec_server.fs.spare.SpareFiles.note_create`.
    """
    spares = shared_spares()
    directory = os.path.dirname(target)
    if spare:
        fd = spares.take(directory)
        if fd is not None:
            tmp = _name_spare(fd, target)
            if tmp is not None:
                return tmp, fd
    for _ in range(_TEMP_TRIES - 1):
        tmp = _temp_name(target)
        try:
            started = time.perf_counter()
            fd = os.open(tmp, _TEMP_FLAGS, 0o666)
        except FileExistsError:
            _new_temp_tag()  # someone made our next name: guess no more
        else:
            spares.note_create(directory, time.perf_counter() - started)
            return tmp, fd
    tmp = _temp_name(target)
    return tmp, os.open(tmp, _TEMP_FLAGS, 0o666)


_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC


def _name_spare(fd: int, target: str) -> str | None:
    """Link the spare at ``fd`` under a temp name beside ``target`` and return the name;
    None, the spare closed, if it cannot be (the caller creates a temp file instead,
    which reports the directory's own error, if any)."""
    for _ in range(_TEMP_TRIES):
        tmp = _temp_name(target)
        try:
            link_unnamed(fd, tmp)
        except FileExistsError:
            _new_temp_tag()  # someone made our next name: guess no more
        except OSError:
            break
        else:
            return tmp
    os.close(fd)
    return None


def _payload_size(data: Payload) -> int:
    return data.size if isinstance(data, Pieces) else memoryview(data).nbytes


def _write_atomic(target: str, data: Payload, old: os.stat_result | None) -> None:
    try:
        tmp, fd = _create_temp(target, spare=_payload_size(data) > 0)
    except FileExistsError:
        raise  # every temp name taken: fail, changing nothing (see _create_temp)
    except OSError:
        if old is None:
            raise
        # The directory takes no new entry (refused, no inode left, a /proc
        # directory, which answers ENOENT) but the file itself may be
        # writable: behave like upstream, truncate in place, and report the
        # file's own error, if any - never the directory's -32004, which the
        # current client reads as "create the parent and retry".
        _write_in_place(target, data)
        return
    try:
        try:
            _write_all(fd, data)
            faithful = old is None or match_old_file(fd, old, target)
            # tmpfs renames over a file as cheaply as it exchanges (no data to
            # allocate), and one call beats two. Learned once per device.
            memory = old is not None and memfs.in_memory(old.st_dev)
            if memory is None:
                memory = memfs.learn(fd)
        finally:
            os.close(fd)
        if not faithful:
            # The new file cannot get the old one's owner or attributes: keep
            # those (write in place, as upstream does), not atomicity.
            os.unlink(tmp)
            _write_in_place(target, data)
            return
        try:
            if old is None or memory or not _exchange_into_place(tmp, target):
                os.rename(tmp, target)
        except OSError as exc:
            if exc.errno != errno.EBUSY or old is None:
                raise
            # A mount point (a bind-mounted file, like a container's
            # /etc/hosts) cannot be replaced, only written.
            os.unlink(tmp)
            _write_in_place(target, data)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _exchange_into_place(tmp: str, target: str) -> bool:
    """:func:`exec_server.fs.exchange.exchange_into_place` (see there for why)."""
    try:
        return exchange_into_place(tmp, target)
    except IsADirectoryError:
        raise os_error(errno.EISDIR) from None


# ------------------------------------------------------------ directories


def create_directory(path: str, *, recursive: bool = True) -> None:
    """Create ``path``; recursive creates ancestors and accepts an existing directory."""
    with translate_os_errors():
        if recursive:
            _create_dir_all(path)
        else:
            os.mkdir(path)


def _create_dir_all(path: str) -> None:
    """Rust's ``fs::create_dir_all``, which upstream uses: ``mkdir`` first (one call
    when the parent exists), walking up only past missing ancestors.

    Why not ``os.makedirs``: it tests each ancestor with ``exists`` first and
    ignores an ancestor that exists as something else, so a path under a
    dangling symlink came out as "not found" where upstream says
    ``File exists``. Iterative: no recursion limit on deep paths.
    """
    missing: list[str] = []
    current = path
    while True:
        try:
            os.mkdir(current)
            break
        except FileNotFoundError:
            parent = os.path.dirname(current)
            if parent == current:
                raise
            missing.append(current)
            current = parent
        except OSError:
            if os.path.isdir(current):
                break  # there already (or made meanwhile): fine
            raise
    for name in reversed(missing):
        try:
            os.mkdir(name)
        except OSError:
            if not os.path.isdir(name):
                raise


def get_metadata(path: str) -> Metadata:
    """Stat following symlinks; ``is_symlink`` comes from ``lstat`` of the path itself."""
    with translate_os_errors():
        lst = os.lstat(path)
        st = os.stat(path) if stat.S_ISLNK(lst.st_mode) else lst
    return _metadata(lst, st)


def _metadata(lst: os.stat_result, st: os.stat_result) -> Metadata:
    birth = getattr(st, "st_birthtime", None)
    created = int(birth * 1000) if birth else 0
    return _metadata_of(lst.st_mode, st.st_mode, st.st_size, st.st_mtime_ns, created)


def _metadata_of(
    link_mode: int, mode: int, size: int, mtime_ns: int, created_at_ms: int
) -> Metadata:
    """``link_mode``: the path's own (``lstat``) mode; the rest of what it names."""
    return Metadata(
        is_directory=stat.S_ISDIR(mode),
        is_file=stat.S_ISREG(mode),
        is_symlink=stat.S_ISLNK(link_mode),
        size=size,
        created_at_ms=created_at_ms,
        modified_at_ms=mtime_ns // 1_000_000,
    )


def lossy_name(name: str) -> str:
    """An entry name as upstream renders it: invalid UTF-8 becomes U+FFFD."""
    if name.isascii():
        return name
    return os.fsencode(name).decode("utf-8", "replace")


def read_directory(path: str) -> list[DirEntry]:
    """List entries (no ``.``/``..``); symlinks are followed and dangling ones skipped."""
    entries: list[DirEntry] = []
    with translate_os_errors(), os.scandir(path) as it:
        for entry in it:
            try:
                if entry.is_symlink():
                    st = entry.stat()
                    is_dir = stat.S_ISDIR(st.st_mode)
                    is_file = stat.S_ISREG(st.st_mode)
                else:
                    is_dir = entry.is_dir(follow_symlinks=False)
                    is_file = entry.is_file(follow_symlinks=False)
            except OSError:
                continue
            entries.append(DirEntry(lossy_name(entry.name), is_dir, is_file))
    return entries


# ------------------------------------------------------------------ remove


def remove(path: str, *, recursive: bool = True, force: bool = True) -> None:
    """Remove a file, link or directory; a symlink is unlinked, never followed."""
    with translate_os_errors():
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            if force:
                return
            raise
        if stat.S_ISDIR(st.st_mode):
            if recursive:
                _remove_tree(path)
            else:
                os.rmdir(path)
        else:
            os.unlink(path)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _O_CLOEXEC


def _remove_tree(path: str) -> None:
    """Delete a directory tree through directory descriptors, never following symlinks.

    Why not ``shutil.rmtree``: its per-entry bookkeeping costs ~20 % more on a
    200-file tree. This walk lists names only (``listdir(fd)``, no per-entry
    objects) and unlinks each one relative to its directory's descriptor; the
    names the kernel refuses as directories (``EISDIR``) are the ones to
    descend into (15 % less time than listing with ``scandir`` and sorting
    by ``d_type``, on tmpfs). Entries that vanish
    meanwhile are fine; any other failure propagates. The walk starts
    sequential and fans out (:mod:`exec_server.fs.fanout`) once the first
    unlinks show the device makes each one wait.
    """
    try:
        fd = os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        return
    try:
        _empty_directory(fd, _Removal())
    finally:
        os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(path)


#: Files whose unlinks are timed before a removal decides whether to fan out.
_PROBE_FILES = 8
#: A median unlink slower than this is waiting for the device: a tmpfs unlink
#: takes ~3 µs, an empty ext4 file ~6 µs, an ext4 file whose blocks are
#: discarded synchronously ~80 µs.
_SLOW_UNLINK_NS = 30_000
#: Names per fanned-out unlink task (fewer tasks, less hand-off).
_UNLINK_CHUNK = 4
#: What :func:`_unlink_entry` did.
_UNLINKED, _VANISHED, _A_DIRECTORY = 1, 0, -1


class _Removal:
    """One recursive remove: sequential until unlinks prove slow, then fanned out."""

    __slots__ = ("parallel", "took")

    def __init__(self) -> None:
        #: ``None`` until decided by :meth:`probe` (only ever set before fanning out).
        self.parallel: bool | None = None
        #: nanoseconds of the file unlinks timed so far (across directories).
        self.took: list[int] = []

    def probe(self, dir_fd: int, names: list[str], dirs: list[str]) -> list[str]:
        """Unlink names, timing each file's, until :data:`_PROBE_FILES` were timed (in
        this directory or earlier ones) and decide; directories met go to ``dirs``.
        Returns the names not tried yet."""
        clock = time.perf_counter_ns
        took = self.took
        done = 0
        for name in names:
            if len(took) >= _PROBE_FILES:
                break
            done += 1
            t0 = clock()
            outcome = _unlink_entry(dir_fd, name)
            if outcome == _UNLINKED:
                took.append(clock() - t0)
            elif outcome == _A_DIRECTORY:
                dirs.append(name)
        if len(took) >= _PROBE_FILES:
            took.sort()
            self.parallel = took[len(took) // 2] > _SLOW_UNLINK_NS
        return names[done:]


def _empty_directory(dir_fd: int, removal: _Removal, depth: int = 0) -> None:
    names = os.listdir(dir_fd)
    dirs: list[str] = []
    if removal.parallel is None and names:
        names = removal.probe(dir_fd, names, dirs)
        while dirs and removal.parallel is None:
            _remove_subdirectory(dir_fd, dirs.pop(), removal, depth)
    if not removal.parallel:
        dirs += _unlink_names(dir_fd, names)
        for name in dirs:
            _remove_subdirectory(dir_fd, name, removal, depth)
        return
    tasks: list[Callable[[], object]] = [
        functools.partial(_unlink_chunk, dir_fd, names[i : i + _UNLINK_CHUNK], removal, depth)
        for i in range(0, len(names), _UNLINK_CHUNK)
    ]
    tasks += [
        functools.partial(_remove_subdirectory, dir_fd, name, removal, depth) for name in dirs
    ]
    shared_fanout().run(tasks)


def _unlink_entry(dir_fd: int, name: str) -> int:
    """Unlink ``name`` unless it is a directory: :data:`_UNLINKED`, :data:`_VANISHED`
    (gone meanwhile: fine) or :data:`_A_DIRECTORY` (left for the caller)."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return _VANISHED
    except IsADirectoryError:  # Linux: unlinkat(2) of a directory
        return _A_DIRECTORY
    except PermissionError:  # macOS answers EPERM for a directory; Linux for a protected file
        if _is_directory_at(dir_fd, name):
            return _A_DIRECTORY
        raise
    return _UNLINKED


def _unlink_names(dir_fd: int, names: list[str]) -> list[str]:
    """Unlink every name that is not a directory; return the directories' names.

    Hot: once per entry of a tree. :func:`_unlink_entry`'s common case inlined
    (a function call per file is ~10 % of a tmpfs removal).
    """
    dirs: list[str] = []
    unlink = os.unlink
    for name in names:
        try:
            unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            dirs.append(name)
        except OSError:
            if _unlink_entry(dir_fd, name) == _A_DIRECTORY:  # tries again; raises the rest
                dirs.append(name)
    return dirs


def _unlink_chunk(dir_fd: int, names: list[str], removal: _Removal, depth: int) -> None:
    """A fanned-out task: unlink these names, and remove the trees among them."""
    for name in _unlink_names(dir_fd, names):
        _remove_subdirectory(dir_fd, name, removal, depth)


def _is_directory_at(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(name, dir_fd=dir_fd).st_mode)
    except FileNotFoundError:
        return False


#: Directory levels a removal recurses through (two Python frames each); a
#: subtree deeper than that is emptied with an explicit stack instead, so a
#: tree of any depth goes, not only what Python's recursion limit allows.
_RECURSION_DEPTH = 64


def _remove_subdirectory(dir_fd: int, name: str, removal: _Removal, depth: int = 0) -> None:
    """Remove the tree ``name`` under ``dir_fd``; a link in its place is unlinked, not followed."""
    sub = _open_subdirectory(dir_fd, name)
    if sub is None:
        return
    try:
        if depth < _RECURSION_DEPTH:
            _empty_directory(sub, removal, depth + 1)
        else:
            _empty_deep_directory(sub)
    finally:
        os.close(sub)
    try:  # noqa: SIM105 - not contextlib.suppress: once per directory, ~1 µs less
        os.rmdir(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def _open_subdirectory(dir_fd: int, name: str) -> int | None:
    """A descriptor of the directory ``name`` under ``dir_fd``, never through a link;
    None when it is gone, or was replaced by a file or link (then unlinked)."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)  # replaced by a file or link meanwhile
        return None


def _unlink_files(dir_fd: int) -> list[str]:
    """Unlink every non-directory in ``dir_fd``; return the subdirectories' names."""
    return _unlink_names(dir_fd, os.listdir(dir_fd))


def _empty_deep_directory(top: int) -> None:
    """Empty ``top`` (a directory descriptor) sequentially, without recursion.

    The walk keeps one descriptor open per level below ``top``, as the
    recursive walk does, and the subdirectories still to do at each level.
    Same rules: links are unlinked, never followed; entries that vanish
    meanwhile are fine.
    """
    # (descriptor, its name in the level above, its subdirectories still to do)
    levels: list[tuple[int, str, list[str]]] = [(top, "", _unlink_files(top))]
    try:
        while levels:
            fd, name, dirs = levels[-1]
            if not dirs:
                levels.pop()
                if levels:  # a level below top is empty: close it, remove it
                    os.close(fd)
                    with contextlib.suppress(FileNotFoundError):
                        os.rmdir(name, dir_fd=levels[-1][0])
                continue
            sub = dirs.pop()
            child = _open_subdirectory(fd, sub)
            if child is None:
                continue
            try:
                levels.append((child, sub, _unlink_files(child)))
            except BaseException:
                os.close(child)
                raise
    finally:
        for fd, _, _ in levels[1:]:
            os.close(fd)


# -------------------------------------------------------------------- copy


def resolve_existing_prefix(path: str, *, strict: bool = False) -> str:
    """Canonicalise the deepest existing ancestor and re-append the rest (PROTOCOL.md §10.3).

    Raises:
        OSError: only with ``strict``, when the ancestor cannot be resolved after all
            (it vanished meanwhile, a loop, no permission): see ``os.path.realpath``.
    """
    missing: list[str] = []
    current = path
    while not os.path.exists(current):
        parent, name = os.path.split(current)
        if parent == current:
            break
        missing.append(name)
        current = parent
    resolved = os.path.realpath(current, strict=strict)
    for name in reversed(missing):
        resolved = os.path.join(resolved, name)
    return resolved


def _is_same_or_descendant(candidate: str, ancestor: str) -> bool:
    if candidate == ancestor:
        return True
    prefix = ancestor if ancestor.endswith("/") else ancestor + "/"
    return candidate.startswith(prefix)


def _copies_into_itself(source: str, destination: str) -> bool:
    """Whether ``destination`` resolves to the directory ``source`` or inside it.

    Both sides resolved physically, like ``realpath``; see :func:`_kernel_path`
    for the fast way, taken when both ends allow it.
    """
    real_source = _kernel_path(source)
    real_destination = _kernel_path(destination)
    if real_destination is None:  # the usual case: a new name in an existing directory
        parent, name = os.path.split(destination)
        real_parent = _kernel_path(parent)
        if real_parent is not None:
            real_destination = f"{real_parent.rstrip('/')}/{name}"
    if real_source is None or real_destination is None:
        # Both the portable way, so the two are compared in one spelling.
        real_source = os.path.realpath(source)
        real_destination = resolve_existing_prefix(destination)
    return _is_same_or_descendant(real_destination, real_source)


_O_PATH = getattr(os, "O_PATH", 0)


def _kernel_path(path: str) -> str | None:
    """The kernel's canonical name of an existing path, or ``None`` to ask ``realpath``.

    Opening the path (``O_PATH``, following links like ``realpath`` does) and
    reading back its ``/proc/self/fd`` link takes three system calls, where
    ``realpath`` takes an ``lstat`` and a few string operations per component:
    ~2 µs against 8-10 µs, a few % of a small tree copy. ``None`` when the path
    does not open (missing, a dangling link, a loop) or ``/proc`` cannot tell;
    callers then take the portable way.
    """
    if not _O_PATH:
        return None
    try:
        fd = os.open(path, _O_PATH | _O_CLOEXEC)
    except OSError:
        return None
    try:
        name = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    finally:
        os.close(fd)
    # A path outside this process's root, or one deleted meanwhile, reads back
    # as something other than a plain absolute path.
    if not name.startswith("/") or name.endswith(" (deleted)"):
        return None
    return name


def copy(source: str, destination: str, *, recursive: bool) -> None:
    """Copy a file, a symlink (as a link) or, with ``recursive``, a directory tree."""
    with translate_os_errors():
        st = os.lstat(source)
        mode = st.st_mode
        if stat.S_ISDIR(mode):
            if not recursive:
                raise InvalidRequestError(COPY_DIR_WITHOUT_RECURSIVE)
            if _copies_into_itself(source, destination):
                raise InvalidRequestError(COPY_INTO_SELF)
            _copy_tree(source, destination)
        elif stat.S_ISLNK(mode):
            os.symlink(os.readlink(source), destination)
        elif stat.S_ISREG(mode):
            _copy_file(source, destination, st)
        else:
            raise InvalidRequestError(COPY_UNSUPPORTED_TYPE)


def _copy_tree(source: str, destination: str) -> None:
    """Copy a tree one directory at a time, each through a pair of directory descriptors.

    Files are opened and created relative to those descriptors (``openat``),
    so the kernel resolves each directory's path once, not once per file.
    Subdirectories wait as paths, so at most four descriptors are open
    however wide or deep the tree is while the copy is sequential.
    Directories this call creates are filled through
    :func:`_copy_new_file_at`; merged ones file by file through the careful
    :func:`_copy_file_at`. The copy starts sequential and fans out
    (:mod:`exec_server.fs.fanout`) once the first file copies show that
    each one waits on the filesystem (:class:`_TreeCopy`).
    """
    created = _make_tree_root(destination)
    _copy_directories([(source, destination, _MASK_TO_CHECK if created else None)], _TreeCopy(), 0)


#: A directory still to copy: (source path, destination path, creation mask or None).
_PendingDir = tuple[str, str, int | None]

#: File copies timed before a tree copy decides whether to fan out.
_PROBE_COPIES = 8
#: A median file copy slower than this waits on the filesystem: a 4 KiB copy
#: takes ~10 µs on tmpfs and ~15-25 µs in a quiet ext4 directory, but 150-600
#: µs where each create first scans past recently freed inodes (ext4 without
#: a journal after deletions, as on this project's CI machine), and a round
#: trip per file on a network filesystem. In between (~80 µs) two threads were
#: measured slower than one.
_SLOW_COPY_NS = 150_000
#: Directory entries per fanned-out copy task.
_COPY_CHUNK = 4


class _TreeCopy:
    """One recursive copy: sequential until file copies prove slow, then fanned out.

    Why fan out: where each create waits (above), copying several files at
    once overlaps the waits: a 200-file tree took 25 ms instead of 35 and 27
    instead of 61 with two threads on this VM's ext4. Where creates are
    quick, the threads only contend for the GIL (6.6 ms instead of 4.7 in a
    quiet directory, 4.2 instead of 2.1 on tmpfs), so the copy stays
    sequential. At most one thread per CPU: what slows these creates is the
    kernel scanning, which keeps a CPU busy; eight threads took 41 ms where
    two took 27.
    """

    __slots__ = ("parallel", "took", "umask", "width")

    def __init__(self) -> None:
        #: ``None`` until decided by :meth:`note`.
        self.parallel: bool | None = None
        #: nanoseconds of the file copies timed so far (across directories).
        self.took: list[int] = []
        #: the process umask, read once the first created directory needs it.
        self.umask: int | None = None
        self.width = _usable_cpus()

    def note(self, took_ns: int) -> None:
        took = self.took
        took.append(took_ns)
        if len(took) >= _PROBE_COPIES:
            took.sort()
            self.parallel = self.width > 1 and took[len(took) // 2] > _SLOW_COPY_NS

    def mask_of(self, dst_fd: int) -> int:
        """The creation mask of a directory this copy created (:func:`_creation_mask`)."""
        if self.umask is None:
            self.umask = _process_umask()
        return _creation_mask(dst_fd, self.umask)


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass(frozen=True, slots=True)
class _Pair:
    """One directory being copied: both descriptors and paths, and the creation mask
    of the destination (``None``: an existing directory merged into)."""

    src_fd: int
    src_dir: str
    dst_fd: int
    dst_dir: str
    mask: int | None


def _copy_directories(pending: list[_PendingDir], copy: _TreeCopy, depth: int) -> None:
    """Copy the contents of each pending directory and of the subdirectories met,
    until none is left (or hand them all to a fan-out)."""
    while pending:
        src_dir, dst_dir, mask = pending.pop()
        src_fd = os.open(src_dir, os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC)
        try:
            dst_fd = os.open(dst_dir, os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC)
            try:
                if mask == _MASK_TO_CHECK:
                    mask = copy.mask_of(dst_fd)
                pair = _Pair(src_fd, src_dir, dst_fd, dst_dir, mask)
                _copy_directory(pair, pending, copy, depth)
            finally:
                os.close(dst_fd)
        finally:
            os.close(src_fd)


#: ``mask`` of a directory this copy created whose creation mask is not known yet.
_MASK_TO_CHECK = -2
#: ``mask`` of a created directory whose new files' modes cannot be predicted.
_MASK_UNKNOWN = -1
_SPECIAL_BITS = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX


def _make_tree_root(destination: str) -> bool:
    """Create the destination directory and its ancestors; ``True`` if this call created it.

    An existing directory (or a link to one) is merged into (``False``); an
    existing non-directory raises ``FileExistsError`` like ``os.makedirs``.
    """
    try:
        os.mkdir(destination)
        return True
    except FileNotFoundError:
        os.makedirs(os.path.dirname(destination), exist_ok=True)
    except FileExistsError:
        if not os.path.isdir(destination):
            raise
        return False
    try:
        os.mkdir(destination)
        return True
    except FileExistsError:
        if not os.path.isdir(destination):
            raise
        return False


def _process_umask() -> int:
    """The process umask, read without ``os.umask``'s set-and-restore race between threads.

    Returns :data:`_MASK_UNKNOWN` when ``/proc`` cannot tell (no procfs, kernel < 4.7).
    """
    try:
        fd = os.open("/proc/self/status", os.O_RDONLY | _O_CLOEXEC)
    except OSError:
        return _MASK_UNKNOWN
    try:
        data = os.read(fd, 1 << 16)
    except OSError:
        return _MASK_UNKNOWN
    finally:
        os.close(fd)
    for line in data.splitlines():
        if line.startswith(b"Umask:"):
            try:
                return int(line[6:].strip(), 8)
            except ValueError:
                break
    return _MASK_UNKNOWN


def _creation_mask(dir_fd: int, umask: int) -> int:
    """The permission bits ``open(O_CREAT)`` will strip from files new in ``dir_fd``.

    That is the umask, unless the directory carries a default ACL (which
    replaces the umask) or cannot tell: then :data:`_MASK_UNKNOWN`.
    """
    try:
        os.getxattr(dir_fd, "system.posix_acl_default")
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.EOPNOTSUPP):
            return umask
        return _MASK_UNKNOWN
    return _MASK_UNKNOWN


def _copy_directory(pair: _Pair, pending: list[_PendingDir], copy: _TreeCopy, depth: int) -> None:
    """Copy one directory's entries; subdirectories join ``pending``.

    Once the copy is known to be slow, this directory's remaining entries and
    everything pending are fanned out instead (and the fanned-out subtrees fan
    out in turn, down to :data:`_RECURSION_DEPTH` levels; deeper ones are
    copied sequentially).
    """
    with os.scandir(pair.src_fd) as it:
        entries = list(it)
    if copy.parallel is None:
        entries = _probe_entries(pair, entries, pending, copy)
    if not copy.parallel or depth >= _RECURSION_DEPTH:
        _copy_entries(pair, entries, pending)
        return
    tasks: list[Callable[[], object]] = [
        functools.partial(_copy_entries_fanned, pair, entries[i : i + _COPY_CHUNK], copy, depth)
        for i in range(0, len(entries), _COPY_CHUNK)
    ]
    tasks += [functools.partial(_copy_directories, [item], copy, depth + 1) for item in pending]
    pending.clear()
    shared_fanout().run(tasks, width=copy.width)


def _probe_entries(
    pair: _Pair, entries: list[os.DirEntry[str]], pending: list[_PendingDir], copy: _TreeCopy
) -> list[os.DirEntry[str]]:
    """Copy entries one by one, timing each file, until the copy decides
    (:meth:`_TreeCopy.note`); returns the entries not copied yet."""
    clock = time.perf_counter_ns
    for done, entry in enumerate(entries):
        if copy.parallel is not None:
            return entries[done:]
        t0 = clock()
        if _copy_entry(pair, entry, pending):
            copy.note(clock() - t0)
    return []


def _copy_entries(pair: _Pair, entries: list[os.DirEntry[str]], pending: list[_PendingDir]) -> None:
    # Hot: its loop runs once per entry. Regular files, the common case, inlined.
    src_fd, dst_fd, mask = pair.src_fd, pair.dst_fd, pair.mask
    for entry in entries:
        if entry.is_file(follow_symlinks=False):
            name = entry.name
            if mask is None or not _copy_new_file_at(src_fd, dst_fd, name, mask):
                _copy_file_at(src_fd, name, dst_fd, name)
        else:
            _copy_entry(pair, entry, pending)


def _copy_entries_fanned(
    pair: _Pair, entries: list[os.DirEntry[str]], copy: _TreeCopy, depth: int
) -> None:
    """A fanned-out task: copy these entries, and the subtrees among them."""
    subdirs: list[_PendingDir] = []
    _copy_entries(pair, entries, subdirs)
    for item in subdirs:
        _copy_directories([item], copy, depth + 1)


def _copy_entry(pair: _Pair, entry: os.DirEntry[str], pending: list[_PendingDir]) -> bool:
    """Copy one entry (a directory is created and joins ``pending``); True for a regular file."""
    name = entry.name
    mask = pair.mask
    if entry.is_file(follow_symlinks=False):
        if mask is None or not _copy_new_file_at(pair.src_fd, pair.dst_fd, name, mask):
            _copy_file_at(pair.src_fd, name, pair.dst_fd, name)
        return True
    if entry.is_dir(follow_symlinks=False):
        try:
            os.mkdir(name, dir_fd=pair.dst_fd)
            # A new directory inherits its parent's default ACL, so its mask.
            child = _MASK_TO_CHECK if mask is None else mask
        except FileExistsError:
            if not _leads_to_directory_at(pair.dst_fd, name):
                # A file, or a link leading nowhere or to itself, holds the place:
                # "File exists", as upstream's create_dir_all says (not the error of
                # following the link).
                raise
            child = None
        pending.append((f"{pair.src_dir}/{name}", f"{pair.dst_dir}/{name}", child))
    elif entry.is_symlink():
        os.symlink(os.readlink(name, dir_fd=pair.src_fd), name, dir_fd=pair.dst_fd)
    # FIFOs, sockets and devices inside a tree are skipped (§9.3).
    return False


def _leads_to_directory_at(dir_fd: int, name: str) -> bool:
    """Whether ``name`` in ``dir_fd`` is a directory or a link to one (Rust's ``is_dir``:
    any error, a dangling or looping link's included, is "no")."""
    try:
        return stat.S_ISDIR(os.stat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC


def _copy_new_file_at(src_dir_fd: int, dst_dir_fd: int, name: str, mask: int) -> bool:
    """Copy ``name`` into a directory this copy created, skipping :func:`_copy_file_at`'s checks.

    ``O_EXCL`` proves the destination is a new, empty file, so it can be
    neither the source nor need truncating; the permission bits are only
    set when ``mask`` (see :func:`_creation_mask`) would have changed them.
    Returns ``False``, having changed nothing, when the name exists already
    (someone else wrote into the directory meanwhile) or the source is no
    longer a regular file: the caller falls back to :func:`_copy_file_at`.
    """
    # Hot: once per file of a tree. Module-level aliases and bit tests instead of
    # ``os.``/``stat.`` lookups and calls: ~5 % of a 200-file copy.
    src_fd = _os_open(name, _SRC_FLAGS, dir_fd=src_dir_fd)
    try:
        src_stat = _os_fstat(src_fd)
        mode = src_stat.st_mode
        if mode & _S_IFMT != _S_IFREG:
            return False
        perm = mode & 0o7777
        try:
            dst_fd = _os_open(name, _NEW_FILE_FLAGS, perm, dir_fd=dst_dir_fd)
        except FileExistsError:
            return False
        try:
            if mask < 0 or perm & (mask | _SPECIAL_BITS):
                os.fchmod(dst_fd, perm)
            # _copy_contents's common case inlined (a few % of a tree copy): one
            # call for a file unchanged since its fstat. Anything else, errors
            # included, continues there from the current offsets.
            size = src_stat.st_size
            try:
                done = (
                    size > 0
                    and _copy_file_range is not None
                    and _copy_file_range(src_fd, dst_fd, size + 1) == size
                )
            except OSError:
                done = False
            if not done:
                _copy_contents(src_fd, dst_fd)
        finally:
            _os_close(dst_fd)
    finally:
        _os_close(src_fd)
    return True


_SRC_FLAGS = os.O_RDONLY | _O_CLOEXEC | _O_NONBLOCK
_S_IFMT = stat.S_IFMT(0o177777)
_S_IFREG = stat.S_IFREG
_os_open = os.open
_os_fstat = os.fstat
_os_close = os.close


def _copy_file(source: str, destination: str, src_stat: os.stat_result) -> None:
    """Copy one regular file by path (see :func:`_copy_file_at`)."""
    del src_stat  # the open descriptor's fstat is authoritative
    _copy_file_at(None, source, None, destination)


def _copy_file_at(
    src_dir_fd: int | None, source: str, dst_dir_fd: int | None, destination: str
) -> None:
    """Like Rust's ``std::fs::copy``: overwrite, copy the permission bits, kernel-side copy.

    The destination is opened without ``O_TRUNC`` and compared with the source
    first, so copying a file onto itself (or a hard link of itself) cannot
    truncate it. A new destination given by path is, when one is ready, the
    spare made in its directory (:func:`_new_file_from_spare`).
    """
    src_fd = os.open(source, os.O_RDONLY | _O_CLOEXEC | _O_NONBLOCK, dir_fd=src_dir_fd)
    try:
        src_stat = os.fstat(src_fd)
        perm = stat.S_IMODE(src_stat.st_mode)
        if dst_dir_fd is None and src_stat.st_size and stat.S_ISREG(src_stat.st_mode):
            new_fd = _new_file_from_spare(destination, perm)
            if new_fd is not None:
                try:
                    _copy_contents(src_fd, new_fd, src_stat.st_size)
                finally:
                    os.close(new_fd)
                return
        # O_NONBLOCK: a FIFO destination fails (ENXIO) instead of hanging the worker.
        started = time.perf_counter()
        dst_fd = os.open(
            destination,
            os.O_WRONLY | os.O_CREAT | _O_CLOEXEC | _O_NONBLOCK,
            perm,
            dir_fd=dst_dir_fd,
        )
        opened = time.perf_counter()
        try:
            dst_stat = os.fstat(dst_fd)
            if dst_dir_fd is None and not dst_stat.st_size and dst_stat.st_nlink == 1:
                # Most likely made by this open: its time is a creation's.
                shared_spares().note_create(os.path.dirname(destination), opened - started)
            if os.path.samestat(src_stat, dst_stat):
                raise InvalidRequestError(COPY_SAME_FILE)
            if dst_stat.st_size:
                os.ftruncate(dst_fd, 0)
            if stat.S_IMODE(dst_stat.st_mode) != perm:
                os.fchmod(dst_fd, perm)
            if stat.S_ISREG(dst_stat.st_mode):
                _copy_contents(src_fd, dst_fd, src_stat.st_size)
            else:
                # A FIFO with a reader (or a device): write like `cp` and upstream
                # do, waiting for the reader, not failing once its buffer is full,
                # and without holding a place in the worker pool meanwhile.
                os.set_blocking(dst_fd, True)
                with waiting_on_others():
                    _copy_contents(src_fd, dst_fd, src_stat.st_size)
        finally:
            os.close(dst_fd)
    finally:
        os.close(src_fd)


def _new_file_from_spare(path: str, perm: int) -> int | None:
    """A new, empty file at ``path`` with permission bits ``perm``, made from the spare
    of its directory (:mod:`exec_server.fs.spare`: the inode was allocated after the
    previous call there was answered), as a write descriptor; None, having changed
    nothing, when there is no spare or ``path`` exists (the caller opens it as usual,
    which overwrites it, refuses a copy onto itself, follows a symlink).

    The bits are set before the name is given, so the file never shows other
    ones. Not for an empty source (the caller checks): nothing written, the
    file would keep the spare's older times.
    """
    fd = shared_spares().take(os.path.dirname(path))
    if fd is None:
        return None
    try:
        os.fchmod(fd, perm)
        link_unnamed(fd, path)  # EEXIST if anything is there, a dangling symlink too
    except OSError:
        os.close(fd)
        return None
    return fd


_COPY_MAX = 1 << 30
_copy_file_range: Callable[[int, int, int], int] | None = getattr(os, "copy_file_range", None)


def _copy_contents(src_fd: int, dst_fd: int, size: int = 0) -> None:
    """Copy from both files' offsets to EOF; ``size`` (the source's ``st_size``) saves a call.

    Asking ``copy_file_range`` for ``size + 1`` bytes and getting fewer (but
    at least ``size``) means EOF, so a file that did not change since its
    ``fstat`` takes one call instead of two. A file of ``st_size`` 0 may
    still have contents (``/proc``), so it is copied to EOF like any other.
    """
    copy_range = _copy_file_range
    if copy_range is not None:
        try:
            want = size + 1 if size else _COPY_MAX
            done = 0
            while copied := copy_range(src_fd, dst_fd, want):
                done += copied
                if copied < want and size and done >= size:
                    return
                want = _COPY_MAX
            return
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
    try:
        offset = os.lseek(dst_fd, 0, os.SEEK_CUR)
    except OSError as exc:
        if exc.errno != errno.ESPIPE:
            raise
        # A FIFO or socket destination: copy_file_range refused it before
        # copying anything, so the source is still at its start.
    else:
        os.lseek(src_fd, offset, os.SEEK_SET)
    try:
        while os.sendfile(dst_fd, src_fd, None, _COPY_MAX):
            pass
        return
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOSYS):
            raise
    while chunk := os.read(src_fd, _CHUNK):
        _write_all(dst_fd, chunk)


# ------------------------------------------------------------ canonicalize


def canonicalize(path: str) -> str:
    """``realpath`` of an existing path (symlinks and ``..`` resolved physically)."""
    with translate_os_errors():
        return os.path.realpath(path, strict=True)
