"""File handles: descriptors a connection reads and writes by position (§4-§5). One in use
is never closed under its worker (a reused number would be read late): its last user does."""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from exec_server.fs import nofollow
from exec_server.fs.errors import FsNotFoundError, FsRefusedError, os_error, translate_os_errors

__all__ = [
    "MAX_BLOCK",
    "MAX_HANDLES",
    "MAX_ID_BYTES",
    "FileHandles",
    "Install",
    "Mode",
    "open_descriptor",
    "open_into",
]

MAX_HANDLES: Final = 128
MAX_ID_BYTES: Final = 32
MAX_BLOCK: Final = 1024 * 1024
#: pread/pwrite take a signed 64-bit offset.
_MAX_OFFSET: Final = 2**63 - 1

Mode = Literal["read", "replace"]

_READ_FLAGS: Final = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK
_REPLACE_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NONBLOCK


def open_descriptor(path: str, mode: Mode, *, no_follow: bool = False) -> int:
    """Open a regular file to read (a FIFO is not waited on), or create / truncate one."""
    flags = _READ_FLAGS if mode == "read" else _REPLACE_FLAGS
    with translate_os_errors():
        fd = nofollow.open_at(path, flags) if no_follow else os.open(path, flags, 0o644)
        if mode == "read":
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise FsRefusedError(f"path `{path}` is not a file")
            except BaseException:
                os.close(fd)
                raise
        os.set_blocking(fd, True)  # O_NONBLOCK was only for the open
    return fd


#: Takes a new descriptor over (:meth:`FileHandles.install`), in the worker that opened it.
Install = Callable[[int], None]


def open_into(install: Install, path: str, mode: Mode, *, no_follow: bool = False) -> None:
    """One worker job, so that a caller that stops waiting cannot drop the descriptor."""
    install(open_descriptor(path, mode, no_follow=no_follow))


def _check_id(handle_id: str) -> None:
    if len(handle_id.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES:
        raise FsRefusedError(f"file handle ID must not exceed {MAX_ID_BYTES} bytes")


@dataclass(slots=True)
class _Handle:
    fd: int
    users: int = 0
    closing: bool = False


class FileHandles:
    """One connection's open handles (thread-safe: workers use the descriptors)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handles: dict[str, _Handle] = {}
        self._closed = False

    def reserve(self, handle_id: str) -> _Handle:
        """Hold an id (checked in upstream's order) for :meth:`install` or :meth:`release`."""
        _check_id(handle_id)
        with self._lock:
            if handle_id in self._handles:
                raise FsRefusedError(f"file handle `{handle_id}` already exists")
            if len(self._handles) >= MAX_HANDLES:
                raise FsRefusedError(
                    f"at most {MAX_HANDLES} file handles may be open per connection"
                )
            handle = _Handle(-1, closing=self._closed)
            if not self._closed:
                self._handles[handle_id] = handle
            return handle

    def install(self, handle: _Handle, fd: int) -> None:
        """Give a reserved handle its descriptor, closed at once if the handle was given up."""
        with self._lock:
            handle.fd = fd
            drop = handle.closing
        if drop:
            os.close(fd)

    def release(self, handle_id: str, handle: _Handle) -> None:
        """Give up a reserved id whose open failed or was cancelled."""
        with self._lock:
            self._forget(handle_id, handle)
            fd, handle.fd = handle.fd, -1
        if fd != -1:
            os.close(fd)

    def read_block(self, handle_id: str, offset: int, length: int) -> tuple[bytes, bool]:
        """At most ``length`` bytes and whether fewer came; a failed read closes the handle."""
        _check_id(handle_id)
        if not 1 <= length <= MAX_BLOCK:
            raise FsRefusedError(f"file read block length must be between 1 and {MAX_BLOCK}")
        handle = self._acquire(handle_id)
        try:
            with translate_os_errors():
                if offset > _MAX_OFFSET:
                    raise os_error(errno.EINVAL)
                chunk = os.pread(handle.fd, length, offset)
        except BaseException:
            with self._lock:
                self._forget(handle_id, handle)
            raise
        finally:
            self._release(handle)
        return chunk, len(chunk) < length

    def write_block(self, handle_id: str, offset: int, data: bytes) -> None:
        """Write ``data`` at ``offset``; errors leave the handle open."""
        _check_id(handle_id)
        if not 1 <= len(data) <= MAX_BLOCK:
            raise FsRefusedError(f"file write block length must be between 1 and {MAX_BLOCK}")
        if offset + len(data) > _MAX_OFFSET:
            raise FsRefusedError(
                "file write range exceeds the signed 64-bit file offset limit"
            )
        handle = self._acquire(handle_id)
        try:
            view = memoryview(data)
            with translate_os_errors():
                while view:
                    written = os.pwrite(handle.fd, view, offset)
                    view = view[written:]
                    offset += written
        finally:
            self._release(handle)

    def close(self, handle_id: str) -> None:
        """Close one handle; an unknown or closed id is not an error."""
        _check_id(handle_id)
        with self._lock:
            handle = self._handles.get(handle_id)
            if handle is None or handle.fd == -1:
                return  # unknown, or an open still in progress (its own request ends it)
            self._forget(handle_id, handle)
            idle = handle.users == 0
        if idle:
            os.close(handle.fd)

    def close_all(self) -> None:
        """Close every handle (the connection ended); later opens are refused."""
        with self._lock:
            self._closed = True
            handles = list(self._handles.values())
            self._handles.clear()
            for handle in handles:
                handle.closing = True
            idle = [handle.fd for handle in handles if handle.users == 0 and handle.fd != -1]
        for fd in idle:
            os.close(fd)

    def _forget(self, handle_id: str, handle: _Handle) -> None:
        # Lock held: the handle closes with its last user.
        handle.closing = True
        if self._handles.get(handle_id) is handle:
            del self._handles[handle_id]

    def _acquire(self, handle_id: str) -> _Handle:
        with self._lock:
            handle = self._handles.get(handle_id)
            if handle is None or handle.fd == -1:
                raise FsNotFoundError(f"unknown file handle `{handle_id}`")
            handle.users += 1
            return handle

    def _release(self, handle: _Handle) -> None:
        with self._lock:
            handle.users -= 1
            last = handle.users == 0 and handle.closing and handle.fd != -1
        if last:
            os.close(handle.fd)
