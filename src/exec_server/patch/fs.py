"""The file-system calls apply_patch needs, as a structural interface (APPLY_PATCH.md §14).
apply_patch hands the same opaque sandbox context to every call, so the file system
plugged in (``exec_server.client.fs``: local, remote) decides what it enforces."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, TypeVar

__all__ = ["Metadata", "PatchFileSystem", "SandboxT"]

SandboxT = TypeVar("SandboxT", contravariant=True)


class Metadata(Protocol):
    """What apply_patch reads from ``get_metadata``."""

    @property
    def is_directory(self) -> bool: ...

    @property
    def is_file(self) -> bool: ...


class PatchFileSystem(Protocol[SandboxT]):
    """Async file system with an optional, opaque sandbox context on every call.

    *Not found* must be `exec_server.exceptions.NotFoundError` (or an `OSError` with
    ``ENOENT``): Add/Move retry after creating parents.
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

