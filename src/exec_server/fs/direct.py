"""The server's direct (unsandboxed) filesystem calls, by path (PROTOCOL.md §9.3).

Each call opens what its path names (or the directory it is in) and runs the
one implementation of the semantics, :mod:`exec_server.fs.fdops`, which the
confined helper runs too. Everything here is blocking: callers run it in a
worker thread (:mod:`exec_server.fs.pool`). Paths are absolute, lexically
normalised ``str`` paths (non-UTF-8 bytes as surrogate escapes). Every failure
leaves as a typed :class:`~exec_server.exceptions.ExecServerError` mapped in
:mod:`exec_server.fs.errors`.

What only the direct route does: a write through a symlink replaces the link's
final target, never the link; devices and FIFOs are written in place; a
recursive copy follows a link to a directory in the destination and merges
into it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import msgspec

from exec_server.exceptions import InvalidRequestError
from exec_server.fs import fdops
from exec_server.fs.errors import os_error, translate_os_errors
from exec_server.fs.fdops import (
    COPY_DIR_WITHOUT_RECURSIVE,
    COPY_INTO_SELF,
    COPY_SAME_FILE,
    COPY_UNSUPPORTED_TYPE,
    READ_LIMIT,
    lossy_name,
    too_large_message,
)
from exec_server.fs.pool import waiting_on_others

__all__ = [
    "COPY_DIR_WITHOUT_RECURSIVE",
    "COPY_INTO_SELF",
    "COPY_SAME_FILE",
    "COPY_UNSUPPORTED_TYPE",
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
    "not_a_file_message",
    "open_for_read",
    "payload_bytes",
    "read_and_close",
    "read_directory",
    "read_file",
    "remove",
    "resolve_existing_prefix",
    "too_large_message",
    "write_file",
]

_O_PATH = getattr(os, "O_PATH", os.O_RDONLY)
_DIR_FLAGS = _O_PATH | os.O_DIRECTORY | os.O_CLOEXEC


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


def not_a_file_message(path: str) -> str:
    return f"path `{path}` is not a file"


def _open_dir(path: str) -> int:
    """An ``O_PATH`` descriptor of the directory ``path`` (links followed)."""
    return os.open(path, _DIR_FLAGS)


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
            # Stat first: opening a device may do something.
            mode = os.stat(path).st_mode
            if stat.S_ISSOCK(mode):
                raise os_error(errno.ENXIO)  # what opening it says (as upstream's does)
            if not stat.S_ISREG(mode):
                raise InvalidRequestError(not_a_file_message(path))
        # O_NONBLOCK: opening a FIFO without a writer must not hang the worker.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            size = fdops.check_for_read(fd, limit, path if regular_only else None)
        except BaseException:
            os.close(fd)
            raise
    return fd, size


def read_and_close(fd: int, size: int | None, limit: int = READ_LIMIT) -> bytes:
    """Read ``fd`` (from :func:`open_for_read`) to EOF, capped at ``limit``, and close it."""
    with translate_os_errors():
        try:
            return fdops.read_to_end(fd, size, limit)
        finally:
            os.close(fd)


# -------------------------------------------------------------------- write


Buffer = bytes | bytearray | memoryview


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

    A payload given in pieces goes to the new file piece by piece; if its pieces
    raise, the new file is dropped and the target left as it was. Targets written
    in place (devices, FIFOs, see :func:`fdops.replace_file`) get it whole.
    """
    _write_file(path, data)


def _write_file(path: str, data: Payload) -> None:
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


# ------------------------------------------------------------ directories


def create_directory(path: str, *, recursive: bool = True) -> None:
    """Create ``path``; recursive creates ancestors and accepts an existing directory."""
    with translate_os_errors():
        try:
            os.mkdir(path)
        except FileNotFoundError:
            if not recursive:
                raise
        except OSError:
            # As Rust's create_dir_all (upstream's) checks: a directory (or a link
            # to one) is fine, anything else there "File exists".
            if recursive and os.path.isdir(path):
                return
            raise
        else:
            return
        # A missing ancestor: made one directory at a time from the deepest that exists.
        fd, _ = fdops.make_dirs(path, _open_dir)
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
    with translate_os_errors():
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            entries = fdops.list_directory(fd)
        finally:
            os.close(fd)
    return [DirEntry(*entry) for entry in entries]


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
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(path)
        elif not recursive:
            os.rmdir(path)
        else:
            directory, name = os.path.split(path)
            dir_fd = _open_dir(directory)
            try:
                fdops.remove_tree_at(dir_fd, name)
            finally:
                os.close(dir_fd)


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
                raise InvalidRequestError(COPY_DIR_WITHOUT_RECURSIVE)
            if _copies_into_itself(source, destination):
                raise InvalidRequestError(COPY_INTO_SELF)
            _copy_tree(source, destination)
        elif stat.S_ISLNK(mode):
            os.symlink(os.readlink(source), destination)
        elif stat.S_ISREG(mode):
            src_dir, src_name = os.path.split(source)
            dst_dir, dst_name = os.path.split(destination)
            src_fd = _open_dir(src_dir)
            try:
                dst_fd = _open_dir(dst_dir)
                try:
                    fdops.copy_file_at(src_fd, src_name, dst_fd, dst_name, wait=waiting_on_others)
                finally:
                    os.close(dst_fd)
            finally:
                os.close(src_fd)
        else:
            raise InvalidRequestError(COPY_UNSUPPORTED_TYPE)


def _copy_tree(source: str, destination: str) -> None:
    """The directory ``source`` into ``destination``, made as needed or merged into."""
    src_fd = os.open(source, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        dst_fd, _ = fdops.make_dirs(destination, _open_dir)
        try:
            fdops.copy_tree_at(src_fd, dst_fd, wait=waiting_on_others)
        finally:
            os.close(dst_fd)
    finally:
        os.close(src_fd)


# ------------------------------------------------------------ canonicalize


def canonicalize(path: str) -> str:
    """``realpath`` of an existing path (symlinks and ``..`` resolved physically)."""
    with translate_os_errors():
        return os.path.realpath(path, strict=True)
