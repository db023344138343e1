"""Fixtures for the apply_patch tests.

``backend`` is parametrized over the file systems apply_patch runs on:
``memory`` (the in-memory fake below), ``local`` (``client.fs.LocalFileSystem``)
and ``remote`` (``client.fs.RemoteFileSystem`` over a real WebSocket to an
in-process ``ExecServer`` on 127.0.0.1). Each yields a `Backend` whose
``root`` is an absolute directory the case files live under.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from exec_server.exceptions import InternalError, InvalidRequestError, NotFoundError


@dataclass(frozen=True)
class FakeMetadata:
    is_directory: bool
    is_file: bool


def _os_error(code: int) -> str:
    return f"{os.strerror(code)} (os error {code})"


@dataclass
class MemoryFileSystem:
    """In-memory `PatchFileSystem` with the local backend's error kinds and texts.

    ``calls`` records ``(operation, path, sandbox)`` so tests can check that the
    sandbox context reaches every call; ``fail`` maps ``(operation, path)`` to an
    exception to raise instead (fault injection).
    """

    files: dict[str, bytes] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=lambda: {"/"})
    calls: list[tuple[str, str, object]] = field(default_factory=list)
    fail: dict[tuple[str, str], Exception] = field(default_factory=dict)

    def _enter(self, op: str, path: os.PathLike[str] | str, sandbox: object) -> str:
        p = os.fspath(path)
        assert p.startswith("/"), p
        self.calls.append((op, p, sandbox))
        if (op, p) in self.fail:
            raise self.fail[(op, p)]
        return p

    def _check_parent(self, p: str) -> None:
        parent = posixpath.dirname(p)
        ancestor = parent
        while ancestor != "/":
            if ancestor in self.files:
                raise InternalError(_os_error(20))  # ENOTDIR, as open(2) reports it
            ancestor = posixpath.dirname(ancestor)
        if parent not in self.dirs:
            raise NotFoundError(_os_error(2))

    async def read_file(self, path: os.PathLike[str] | str, sandbox: object = None) -> bytes:
        p = self._enter("read_file", path, sandbox)
        if p in self.dirs:
            raise InvalidRequestError(f"path `{p}` is not a file")
        if p not in self.files:
            raise NotFoundError(_os_error(2))
        return self.files[p]

    async def write_file(
        self, path: os.PathLike[str] | str, data: bytes, sandbox: object = None
    ) -> None:
        p = self._enter("write_file", path, sandbox)
        self._check_parent(p)
        if p in self.dirs:
            raise InternalError(_os_error(21))
        self.files[p] = bytes(data)

    async def create_directory(
        self, path: os.PathLike[str] | str, *, recursive: bool = True, sandbox: object = None
    ) -> None:
        p = self._enter("create_directory", path, sandbox)
        parts = [part for part in p.split("/") if part]
        todo = ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]
        if not recursive:
            todo = todo[-1:]
        for d in todo:
            if d in self.files:
                raise InternalError(_os_error(17 if d == p else 20))
            if d in self.dirs:
                continue
            self._check_parent(d)
            self.dirs.add(d)

    async def get_metadata(
        self, path: os.PathLike[str] | str, sandbox: object = None
    ) -> FakeMetadata:
        p = self._enter("get_metadata", path, sandbox)
        if p in self.dirs:
            return FakeMetadata(is_directory=True, is_file=False)
        if p in self.files:
            return FakeMetadata(is_directory=False, is_file=True)
        raise NotFoundError(_os_error(2))

    async def remove(
        self,
        path: os.PathLike[str] | str,
        *,
        recursive: bool = True,
        force: bool = True,
        sandbox: object = None,
    ) -> None:
        p = self._enter("remove", path, sandbox)
        assert not recursive, "apply_patch never removes recursively"
        if p in self.files:
            del self.files[p]
        elif p in self.dirs:
            if any(x.startswith(p + "/") for x in (*self.files, *self.dirs)):
                raise InternalError(_os_error(39))
            self.dirs.discard(p)
        elif not force:
            raise NotFoundError(_os_error(2))


class Backend:
    """A file system plus helpers to seed and snapshot a directory tree on it."""

    def __init__(self, name: str, fs: Any, root: Path, memory: MemoryFileSystem | None) -> None:
        self.name = name
        self.fs = fs
        self.root = root
        self.memory = memory

    def seed(self, files: dict[str, bytes | str | None]) -> None:
        """Create files (``None`` value = directory) relative to ``root``."""
        for rel, content in files.items():
            path = self.root / rel
            if self.memory is not None:
                for parent in reversed(path.parents):
                    self.memory.dirs.add(str(parent))
                if content is None:
                    self.memory.dirs.add(str(path))
                else:
                    data = content.encode() if isinstance(content, str) else content
                    self.memory.files[str(path)] = data
                continue
            if content is None:
                path.mkdir(parents=True, exist_ok=True)
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content.encode() if isinstance(content, str) else content)

    def snapshot(self) -> dict[str, bytes | None]:
        """Every file (bytes) and directory (None) under ``root``, keyed relative to it."""
        out: dict[str, bytes | None] = {}
        prefix = str(self.root) + "/"
        if self.memory is not None:
            for p, data in self.memory.files.items():
                if p.startswith(prefix):
                    out[p[len(prefix) :]] = data
            for d in self.memory.dirs:
                if d.startswith(prefix):
                    out[d[len(prefix) :]] = None
            return out
        for dirpath, dirnames, filenames in os.walk(self.root):
            rel = os.path.relpath(dirpath, self.root)
            for name in dirnames:
                out[os.path.normpath(os.path.join(rel, name))] = None
            for name in filenames:
                out[os.path.normpath(os.path.join(rel, name))] = Path(dirpath, name).read_bytes()
        return out


@contextlib.asynccontextmanager
async def open_remote_fs(*, full_services: bool = False) -> AsyncIterator[Any]:
    """``RemoteFileSystem`` over a WebSocket to an in-process server on 127.0.0.1."""
    from exec_server.client.connection import ExecServerClient
    from exec_server.client.fs import RemoteFileSystem
    from exec_server.config import ServerConfig
    from exec_server.server.app import ExecServer
    from exec_server.server.services import ServerServices
    from exec_server.transport.listen import ListenAddress

    config = ServerConfig()
    services = ServerServices.create(config) if full_services else ServerServices(config)
    server = ExecServer(config, services=services)
    ws_server = await server.listen_websocket(ListenAddress("127.0.0.1", 0))
    try:
        host, port = next(iter(ws_server.sockets)).getsockname()[:2]
        client = await ExecServerClient.connect(f"ws://{host}:{port}")
        try:
            yield RemoteFileSystem(client)
        finally:
            await client.aclose()
    finally:
        ws_server.close(close_connections=True)
        await ws_server.wait_closed()
        await server.aclose()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The case directory, symlinks resolved (error texts carry absolute paths)."""
    path = Path(os.path.realpath(tmp_path)) / "w"
    path.mkdir()
    return path


@pytest.fixture(params=["memory", "local", "remote"])
async def backend(request: pytest.FixtureRequest, root: Path) -> AsyncIterator[Backend]:
    if request.param == "memory":
        memory = MemoryFileSystem()
        b = Backend("memory", memory, root, memory)
        b.seed({".": None})
        yield b
    elif request.param == "local":
        from exec_server.client.fs import LocalFileSystem

        yield Backend("local", LocalFileSystem(), root, None)
    else:
        async with open_remote_fs() as remote:
            yield Backend("remote", remote, root, None)


@pytest.fixture
def open_remote() -> Any:
    """`open_remote_fs` as a fixture, so test modules need not import this conftest."""
    return open_remote_fs


@pytest.fixture
def memory_backend(root: Path) -> Iterator[Backend]:
    memory = MemoryFileSystem()
    b = Backend("memory", memory, root, memory)
    b.seed({".": None})
    yield b
