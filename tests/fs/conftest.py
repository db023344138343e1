"""Fixtures for the filesystem tests.

``fs`` is parametrized: ``local`` (in-process ``LocalFileSystem``) and
``remote`` (``RemoteFileSystem`` over a caller that encodes each request as a
JSON-RPC frame, dispatches it through the real server ``Router`` with the
``fs/*`` handlers, and decodes the reply exactly as the client does). The same
tests therefore run against both backends.

``ws`` is the whole stack: an in-process ``ExecServer`` listening on
127.0.0.1 and an ``ExecServerClient`` connected over a real WebSocket.

``wire`` sends raw JSON text through the same router and returns the decoded
reply, for tests of shapes, codes and both protocol generations (the caller
is the root conftest's ``router_caller``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import websockets
from websockets.asyncio.server import Server

from exec_server.client.connection import ExecServerClient
from exec_server.client.fs import ExecutorFileSystem, LocalFileSystem, RemoteFileSystem
from exec_server.config import ServerConfig
from exec_server.server.app import ExecServer
from exec_server.server.services import ServerServices
from exec_server.transport.listen import ListenAddress

T = TypeVar("T")


@pytest.fixture
def wire(router_caller: Any) -> Any:
    return router_caller()


class LiveServer:
    """An in-process server on 127.0.0.1 (real WebSocket transport and router)."""

    def __init__(self, server: ExecServer, ws_server: Server, url: str) -> None:
        self.server = server
        self.ws_server = ws_server
        self.url = url
        self._clients: list[ExecServerClient] = []

    async def client(self) -> ExecServerClient:
        client = await ExecServerClient.connect(self.url)
        self._clients.append(client)
        return client

    async def aclose(self) -> None:
        for client in self._clients:
            await client.aclose()
        self.ws_server.close(close_connections=True)
        await self.ws_server.wait_closed()
        await self.server.aclose()


@contextlib.asynccontextmanager
async def open_live_server(*, full_services: bool = False) -> AsyncIterator[LiveServer]:
    """Without ``full_services`` no sandboxed filesystem is configured (fail closed)."""
    config = ServerConfig()
    services = ServerServices.create(config) if full_services else ServerServices(config)
    server = ExecServer(config, services=services)
    ws_server = await server.listen_websocket(ListenAddress("127.0.0.1", 0))
    host, port = next(iter(ws_server.sockets)).getsockname()[:2]
    live = LiveServer(server, ws_server, f"ws://{host}:{port}")
    try:
        yield live
    finally:
        await live.aclose()


@pytest.fixture
async def live_server() -> AsyncIterator[LiveServer]:
    async with open_live_server() as live:
        yield live


@pytest.fixture(params=["local", "remote", "ws"])
async def fs(
    request: pytest.FixtureRequest, router_caller: Any
) -> AsyncIterator[ExecutorFileSystem]:
    if request.param == "local":
        yield LocalFileSystem()
    elif request.param == "remote":
        yield RemoteFileSystem(router_caller())
    else:
        async with open_live_server() as live:
            yield RemoteFileSystem(await live.client())


@pytest.fixture
def tdir(tmp_path: Path) -> Path:
    """A temp dir with its symlinks resolved (so realpath comparisons are stable)."""
    return Path(os.path.realpath(tmp_path))


@pytest.fixture(params=["local", "ws"])
async def sandboxed_fs(request: pytest.FixtureRequest) -> AsyncIterator[ExecutorFileSystem]:
    """A backend that confines read-only / workspace-write contexts (sandboxed-fs service)."""
    if request.param == "local":
        async with LocalFileSystem.with_sandbox() as local:
            yield local
    else:
        async with open_live_server(full_services=True) as live:
            yield RemoteFileSystem(await live.client())


@pytest.fixture(params=["disk", "memory"])
def write_dir(request: pytest.FixtureRequest, tdir: Path) -> Path:
    """Where write tests run: the test's temp dir (ext4 here and on CI) and a
    directory on tmpfs (``/dev/shm``)."""
    if request.param == "disk":
        return tdir
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm")
    d = Path(os.path.realpath(shm)) / f"write-test-{os.getpid()}-{tdir.name}"
    d.mkdir()
    request.addfinalizer(lambda: shutil.rmtree(d, ignore_errors=True))
    return d


# ---------------------------------------------------------------------------
# Upstream's server and ours side by side (the differential tests)
# ---------------------------------------------------------------------------

_URL = re.compile(rb"ws://\S+")


class _Side:
    """One server: its process, a raw WebSocket JSON-RPC connection, its work dir."""

    def __init__(self, proc: asyncio.subprocess.Process, ws: Any, root: Path) -> None:
        self.proc, self.ws, self.root = proc, ws, root
        self.next_id = 0

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        await self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        async with asyncio.timeout(30):
            while True:
                reply = json.loads(await self.ws.recv())
                if reply.get("id") == self.next_id:
                    return dict(reply)


@contextlib.asynccontextmanager
async def _serve(argv: list[str], root: Path) -> AsyncIterator[_Side]:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        cwd=root,
    )
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        match = _URL.search(line)
        assert match, line
        async with websockets.connect(match.group(0).decode(), max_size=None) as ws:
            side = _Side(proc, ws, root)
            assert "result" in await side.call("initialize", {"clientName": "test"})
            await ws.send(json.dumps({"method": "initialized", "params": {}}))
            yield side
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


@pytest.fixture
def upstream_and_ours(
    codex_binary: str,
) -> Callable[[Path], contextlib.AbstractAsyncContextManager[tuple[_Side, _Side]]]:
    """``async with upstream_and_ours(root) as (up, ours)``: upstream's server and ours,
    each started in its own new work dir (``root/up``, ``root/ours``) with a raw
    WebSocket JSON-RPC connection (``side.call(method, params)`` returns the whole
    reply; ``side.root`` is its work dir). Skips where upstream's binary is missing."""

    @contextlib.asynccontextmanager
    async def start(root: Path) -> AsyncIterator[tuple[_Side, _Side]]:
        (root / "up").mkdir()
        (root / "ours").mkdir()
        ours_argv = [sys.executable, "-m", "exec_server", "serve", "--listen", "ws://127.0.0.1:0"]
        async with (
            _serve([codex_binary, "exec-server", "--listen", "ws://127.0.0.1:0"], root / "up")
            as up,
            _serve(ours_argv, root / "ours") as ours,
        ):
            yield up, ours

    return start


#: a differential case: name, what to lay out in its directory, its requests.
UpstreamCase = tuple[str, Callable[[Path], None], list[tuple[str, dict[str, Any]]]]


class UpstreamDiff:
    """Runs cases against upstream's server and ours, each case in a fresh directory
    laid out alike on both sides, and lists where the answers or the trees left differ."""

    def __init__(self, up: _Side, ours: _Side) -> None:
        self.up, self.ours = up, ours

    async def differences(
        self,
        cases: list[UpstreamCase],
        *,
        fill: Callable[[dict[str, Any], Path], dict[str, Any]],
        mask: Callable[[Any], None],
    ) -> list[str]:
        """``fill(params, root)`` puts the case directory into a request; ``mask(answer)``
        blanks what may differ (times). The directory is written as ``<T>``."""
        found = []
        for index, (name, layout, steps) in enumerate(cases):
            seen = []
            for side in (self.up, self.ours):
                root = side.root / f"c{index:02d}"
                root.mkdir()
                layout(root)
                replies = [
                    _answer(await side.call(method, fill(params, root)), root, mask)
                    for method, params in steps
                ]
                seen.append((replies, _left_on_disk(root)))
            (up_replies, up_disk), (our_replies, our_disk) = seen
            for i, (a, b) in enumerate(zip(up_replies, our_replies, strict=True)):
                if a != b:
                    found.append(f"{name} step {i}: upstream {a} / ours {b}")
            if up_disk != our_disk:
                found.append(f"{name} disk: upstream {up_disk} / ours {our_disk}")
        return found


def _answer(reply: dict[str, Any], root: Path, mask: Callable[[Any], None]) -> Any:
    text = json.dumps(reply.get("result", reply.get("error")), sort_keys=True)
    answer = json.loads(text.replace(str(root), "<T>"))
    mask(answer)
    return ("result" in reply, answer)


def _left_on_disk(root: Path) -> list[tuple[str, str, str]]:
    """What a case left: names, kinds and file contents (links by their target)."""
    seen = []
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            seen.append((rel, "link", os.readlink(path).replace(str(root), "<T>")))
        elif path.is_dir():
            seen.append((rel, "dir", ""))
        elif path.is_file():
            seen.append((rel, "file", path.read_text(errors="replace")))
        else:
            seen.append((rel, "other", ""))
    return seen


@pytest.fixture
async def upstream_diff(upstream_and_ours: Any, tmp_path: Path) -> AsyncIterator[UpstreamDiff]:
    """Upstream's server and ours side by side (:class:`UpstreamDiff`); skips without
    upstream's binary."""
    async with upstream_and_ours(tmp_path) as (up, ours):
        yield UpstreamDiff(up, ours)
