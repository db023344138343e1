"""``followSymlinks: false``: each path component is opened ``O_NOFOLLOW`` relative to the
one before, race-free, with upstream's errors (PROTOCOL_CURRENT §8). Stdlib only."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from typing import Final

from exec_server.fs.errors import FsFailedError, FsRefusedError, os_error, translate_os_errors
from exec_server.fs.fdops import write_all

__all__ = [
    "create_directory",
    "lstat",
    "open_at",
    "open_regular",
    "remove",
    "write_file",
]

_CONTAINS_SYMLINK: Final = "path contains a symbolic link"

_DIR: Final = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@contextlib.contextmanager
def _parent(path: str, *, create: bool = False) -> Iterator[tuple[int, str]]:
    """``path``'s directory fd and final name (``"."`` for ``/``), never through a link."""
    if not path.startswith("/"):
        raise FsRefusedError(f"path must be absolute: {path}")
    parts = [part for part in path.split("/") if part]
    fd = os.open("/", _DIR)
    try:
        for part in parts[:-1]:
            child = _child(fd, part, create)
            os.close(fd)
            fd = child
        yield fd, parts[-1] if parts else "."
    finally:
        os.close(fd)


def _child(fd: int, name: str, create: bool) -> int:
    try:
        return os.open(name, _DIR, dir_fd=fd)
    except FileNotFoundError:
        if not create:
            raise
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o777, dir_fd=fd)
    return os.open(name, _DIR, dir_fd=fd)


def open_at(path: str, flags: int, mode: int = 0o644) -> int:
    """``open(path, flags | O_NOFOLLOW)`` with no symlink in any component."""
    with _parent(path) as (dir_fd, name):
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)


def lstat(path: str) -> os.stat_result:
    """``fs/getMetadata``'s look-up: ``-32600 path contains a symbolic link`` for a link."""
    with translate_os_errors(), _parent(path) as (dir_fd, name):
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        raise FsRefusedError(_CONTAINS_SYMLINK)
    return st


def _open_file(path: str, flags: int, not_regular: Exception) -> tuple[int, int]:
    """``(fd, size)`` of a regular file (a FIFO is not waited on), else ``not_regular``."""
    fd = open_at(path, flags | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise not_regular
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def open_regular(path: str) -> tuple[int, int]:
    """``fs/readFile``'s open: ``(fd, size)``; the caller reads and closes."""
    with translate_os_errors():
        return _open_file(path, os.O_RDONLY, FsRefusedError("path is not a regular file"))


def write_file(path: str, data: bytes | bytearray | memoryview) -> None:
    with translate_os_errors():
        fd, _ = _open_file(path, os.O_WRONLY | os.O_CREAT, os_error(errno.EINVAL))
        try:
            os.set_blocking(fd, True)
            os.ftruncate(fd, 0)
            write_all(fd, data)
        finally:
            os.close(fd)


def create_directory(path: str, *, recursive: bool = True) -> None:
    with translate_os_errors(), _parent(path, create=recursive) as (dir_fd, name):
        if name == ".":
            if not recursive:
                raise os_error(errno.EEXIST)
            return
        try:
            os.mkdir(name, 0o777, dir_fd=dir_fd)
        except FileExistsError:
            if not recursive:
                raise  # whatever is there, a link too (mkdirat never follows)
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):  # a link, a file: as O_DIRECTORY|O_NOFOLLOW
                raise os_error(errno.ENOTDIR) from None


def remove(path: str, *, recursive: bool = True, force: bool = True) -> None:
    """Remove a file or an empty directory; only ``recursive: false`` is supported."""
    if recursive:
        raise FsFailedError("recursive no-follow removal is unsupported")
    with translate_os_errors():
        try:
            with _parent(path) as (dir_fd, name):
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    raise FsRefusedError(_CONTAINS_SYMLINK)
                if stat.S_ISDIR(st.st_mode):
                    os.rmdir(name, dir_fd=dir_fd)
                else:
                    os.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            if not force:
                raise
