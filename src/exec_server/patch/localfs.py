"""A minimal unsandboxed local `PatchFileSystem` (stand-in until ``client.fs`` lands).

It refuses any sandbox context: the standalone program always passes none (§11).
"""

from __future__ import annotations

import asyncio
import os
import stat
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LocalPatchFileSystem"]


@dataclass(frozen=True)
class _Metadata:
    is_directory: bool
    is_file: bool


def _refuse(sandbox: object | None) -> None:
    if sandbox is not None:
        raise ValueError("local patch file system does not accept a sandbox context")


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def _create_directory(path: Path, recursive: bool) -> None:
    if recursive:
        os.makedirs(path, exist_ok=True)
    else:
        os.mkdir(path)


def _metadata(path: Path) -> _Metadata:
    st = os.stat(path)
    return _Metadata(stat.S_ISDIR(st.st_mode), stat.S_ISREG(st.st_mode))


def _remove(path: Path) -> None:
    if stat.S_ISDIR(os.lstat(path).st_mode):
        os.rmdir(path)
    else:
        os.unlink(path)


class LocalPatchFileSystem:
    """Direct local I/O in a worker thread; raises `OSError` with its errno."""

    async def read_file(self, path: Path, sandbox: object | None = None) -> bytes:
        _refuse(sandbox)
        return await asyncio.to_thread(path.read_bytes)

    async def write_file(self, path: Path, data: bytes, sandbox: object | None = None) -> None:
        _refuse(sandbox)
        await asyncio.to_thread(_write, path, data)

    async def create_directory(
        self, path: Path, *, recursive: bool = True, sandbox: object | None = None
    ) -> None:
        _refuse(sandbox)
        await asyncio.to_thread(_create_directory, path, recursive)

    async def get_metadata(self, path: Path, sandbox: object | None = None) -> _Metadata:
        _refuse(sandbox)
        return await asyncio.to_thread(_metadata, path)

    async def remove(
        self,
        path: Path,
        *,
        recursive: bool = False,
        force: bool = False,
        sandbox: object | None = None,
    ) -> None:
        _refuse(sandbox)
        if recursive:
            raise ValueError("recursive remove is not supported here")
        try:
            await asyncio.to_thread(_remove, path)
        except FileNotFoundError:
            if not force:
                raise
