"""The server's direct (unsandboxed) filesystem calls by path (§9.3), run in the pool's
threads. A write through a symlink replaces its target; a copy merges into linked dirs."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import msgspec

from exec_server.fs import fdops
from exec_server.fs.errors import FsRefusedError, os_error, translate_os_errors
from exec_server.fs.fdops import READ_LIMIT, Buffer, lossy_name
from exec_server.fs.pool import waiting_on_others

__all__ = [
    "READ_LIMIT",
    "DirEntry",
    "Metadata",
    "Payload",
    "Pieces",
    "canonicalize",
    "copy",
    "create_directory",
    "get_metadata",
    "lossy_name",
    "open_for_read",
    "payload_bytes",
    "read_and_close",
    "read_directory",
    "read_file",
    "remove",
    "resolve_existing_prefix",
    "write_file",
]

_DIR_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC


class Metadata(msgspec.Struct, frozen=True, gc=False):
    """What ``fs/getMetadata`` reports; ``is_symlink``/``size`` are ``None`` when unknown."""

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


def _open_dir(path: str) -> int:
    return os.open(path, _DIR_FLAGS)


@contextlib.contextmanager
def _opened(path: str, flags: int = _DIR_FLAGS) -> Iterator[int]:
    fd = os.open(path, flags)
    try:
        yield fd
    finally:
        os.close(fd)


def read_file(path: str, *, limit: int = READ_LIMIT, regular_only: bool = False) -> bytes:
    """Read a whole file, following symlinks; see :func:`open_for_read`."""
    fd, size = open_for_read(path, limit=limit, regular_only=regular_only)
    return read_and_close(fd, size, limit)


def open_for_read(
    path: str, *, limit: int = READ_LIMIT, regular_only: bool = False
) -> tuple[int, int | None]:
    """``(fd, st_size if regular else None)`` for :func:`read_and_close`; ``regular_only``:
    the current client's rule (CLIENT_COMPAT.md §6.4), else FIFOs and devices are read."""
    with translate_os_errors():
        if regular_only:
            # Stat first: opening a device may do something.
            mode = os.stat(path).st_mode
            if stat.S_ISSOCK(mode):
                raise os_error(errno.ENXIO)  # what opening it says (as upstream's does)
            if not stat.S_ISREG(mode):
                raise FsRefusedError(f"path `{path}` is not a file")
        # O_NONBLOCK: opening a FIFO without a writer must not hang the worker.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            size = fdops.check_for_read(fd, limit, path if regular_only else None)
        except BaseException:
            os.close(fd)
            raise
    return fd, size


def read_and_close(fd: int, size: int | None, limit: int = READ_LIMIT) -> bytes:
    with translate_os_errors():
        try:
            return fdops.read_to_end(fd, size, limit)
        finally:
            os.close(fd)


@dataclass(frozen=True, slots=True)
class Pieces:
    """A payload made anew by each ``produce()``, so that a big write is never held whole."""

    size: int
    produce: Callable[[], Iterable[Buffer]]


#: What :func:`write_file` writes: the bytes, or :class:`Pieces`.
Payload = Buffer | Pieces


def payload_bytes(payload: Payload) -> Buffer:
    if not isinstance(payload, Pieces):
        return payload
    whole = bytearray()
    for piece in payload.produce():
        whole += piece
    return whole


def write_file(path: str, data: Payload) -> None:
    """Create or replace ``path`` (devices and FIFOs in place); parents are not created."""
    with translate_os_errors():
        target = path
        st: os.stat_result | None = None
        with contextlib.suppress(FileNotFoundError):  # a missing parent: see below
            st = os.lstat(path)
        if st is not None and stat.S_ISLNK(st.st_mode):
            # Follow the link: replace its final target, keep the link.
            target = os.path.realpath(path)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                st = None  # dangling: create the target
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise os_error(errno.EISDIR)
        directory, name = os.path.split(target)
        dir_fd = _open_dir(directory)
        try:
            if st is not None and not stat.S_ISREG(st.st_mode):
                whole = payload_bytes(data)
                fdops.write_in_place(dir_fd, name, whole, os.O_NONBLOCK, waiting_on_others)
                return
            if st is not None:
                fdops.check_writable(dir_fd, name)
            fdops.replace_file(
                dir_fd,
                name,
                lambda fd: fdops.write_all(fd, _pieces(data)),
                lambda: payload_bytes(data),
                st,
                os.urandom(6).hex(),
            )
        finally:
            os.close(dir_fd)


def _pieces(data: Payload) -> Iterable[Buffer]:
    return data.produce() if isinstance(data, Pieces) else (data,)


def create_directory(path: str, *, recursive: bool = True) -> None:
    """Create ``path``; recursive creates ancestors and accepts an existing directory."""
    with translate_os_errors():
        try:
            os.mkdir(path)
            return
        except FileNotFoundError:
            if not recursive:
                raise
        except OSError:
            # As Rust's create_dir_all (upstream's): a directory (or a link to one) is
            # fine, anything else there "File exists".
            if recursive and os.path.isdir(path):
                return
            raise
        fd, _ = fdops.make_dirs(path, _open_dir)  # a missing ancestor
        os.close(fd)


def get_metadata(path: str) -> Metadata:
    """Stat following symlinks; ``is_symlink`` comes from ``lstat`` of the path itself."""
    with translate_os_errors():
        lst = os.lstat(path)
        st = os.stat(path) if stat.S_ISLNK(lst.st_mode) else lst
    birth = getattr(st, "st_birthtime", None)
    return Metadata(
        is_directory=stat.S_ISDIR(st.st_mode),
        is_file=stat.S_ISREG(st.st_mode),
        is_symlink=stat.S_ISLNK(lst.st_mode),
        size=st.st_size,
        created_at_ms=int(birth * 1000) if birth else 0,
        modified_at_ms=st.st_mtime_ns // 1_000_000,
    )


def read_directory(path: str) -> list[DirEntry]:
    """List entries (no ``.``/``..``); symlinks are followed and dangling ones skipped."""
    with translate_os_errors(), _opened(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) as fd:
        entries = fdops.list_directory(fd)
    return [DirEntry(*entry) for entry in entries]


def remove(path: str, *, recursive: bool = True, force: bool = True) -> None:
    """Remove a file, link or directory; a symlink is unlinked, never followed."""
    with translate_os_errors():
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            if force:
                return
            raise
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(path)
        elif not recursive:
            os.rmdir(path)
        else:
            directory, name = os.path.split(path)
            with _opened(directory) as dir_fd:
                fdops.remove_tree_at(dir_fd, name)


def resolve_existing_prefix(path: str, *, strict: bool = False) -> str:
    """Canonicalise the deepest existing ancestor and re-append the rest (PROTOCOL.md §10.3)."""
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


def _copies_into_itself(source: str, destination: str) -> bool:
    """Whether ``destination`` resolves to the directory ``source`` or inside it."""
    real_source = os.path.realpath(source)
    real_destination = resolve_existing_prefix(destination)
    prefix = real_source if real_source.endswith("/") else real_source + "/"
    return real_destination == real_source or real_destination.startswith(prefix)


def copy(source: str, destination: str, *, recursive: bool) -> None:
    """Copy a file, a symlink (as a link) or, with ``recursive``, a directory tree."""
    with translate_os_errors():
        mode = os.lstat(source).st_mode
        if stat.S_ISDIR(mode):
            if not recursive:
                raise FsRefusedError(fdops.COPY_DIR_WITHOUT_RECURSIVE)
            if _copies_into_itself(source, destination):
                raise FsRefusedError(fdops.COPY_INTO_SELF)
            _copy_tree(source, destination)
        elif stat.S_ISLNK(mode):
            os.symlink(os.readlink(source), destination)
        elif stat.S_ISREG(mode):
            src_dir, src_name = os.path.split(source)
            dst_dir, dst_name = os.path.split(destination)
            with _opened(src_dir) as src_fd, _opened(dst_dir) as dst_fd:
                fdops.copy_file_at(src_fd, src_name, dst_fd, dst_name, wait=waiting_on_others)
        else:
            raise FsRefusedError(fdops.COPY_UNSUPPORTED_TYPE)


def _copy_tree(source: str, destination: str) -> None:
    with _opened(source, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC) as src_fd:
        dst_fd, _ = fdops.make_dirs(destination, _open_dir)
        try:
            fdops.copy_tree_at(src_fd, dst_fd, wait=waiting_on_others)
        finally:
            os.close(dst_fd)


def canonicalize(path: str) -> str:
    """``realpath`` of an existing path (symlinks and ``..`` resolved physically)."""
    with translate_os_errors():
        return os.path.realpath(path, strict=True)
