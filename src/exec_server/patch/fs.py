"""The file-system calls apply_patch needs, as a structural interface (APPLY_PATCH.md §14).

apply_patch never interprets the sandbox context: it hands the same value to
every call, so whatever file system is plugged in (local, remote, sandboxed)
decides what it enforces. ``exec_server.client.fs.ExecutorFileSystem``
implementations satisfy `PatchFileSystem` structurally.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Protocol, TypeVar

from exec_server.exceptions import ExecServerError, NotFoundError, os_error_message

__all__ = [
    "Metadata",
    "PatchFileSystem",
    "SandboxT",
    "describe_error",
    "is_not_found",
]

SandboxT = TypeVar("SandboxT", contravariant=True)


class Metadata(Protocol):
    """What apply_patch reads from ``get_metadata``."""

    @property
    def is_directory(self) -> bool: ...

    @property
    def is_file(self) -> bool: ...


class PatchFileSystem(Protocol[SandboxT]):
    """Async file system with an optional, opaque sandbox context on every call.

    Errors keep their kind: *not found* must be `exec_server.exceptions.NotFoundError`
    (or an `OSError` with ``ENOENT``), because Add/Move retry after creating parents.
    """

    async def read_file(self, path: Path, sandbox: SandboxT | None = None) -> bytes: ...

    async def write_file(
        self, path: Path, data: bytes, sandbox: SandboxT | None = None
    ) -> None: ...

    async def create_directory(
        self, path: Path, *, recursive: bool = True, sandbox: SandboxT | None = None
    ) -> None: ...

    async def get_metadata(self, path: Path, sandbox: SandboxT | None = None) -> Metadata: ...

    async def remove(
        self,
        path: Path,
        *,
        recursive: bool = False,
        force: bool = False,
        sandbox: SandboxT | None = None,
    ) -> None: ...


def is_not_found(exc: BaseException) -> bool:
    """True for the *not found* kind, whichever layer raised it."""
    if isinstance(exc, NotFoundError):
        return True
    return isinstance(exc, OSError) and exc.errno == errno.ENOENT


def describe_error(exc: ExecServerError | OSError) -> str:
    """The error's text as upstream prints it (``<strerror> (os error N)`` for I/O)."""
    return exc.message if isinstance(exc, ExecServerError) else os_error_message(exc)
