"""Fixtures for the client tests: an in-memory transport with a scripted fake server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from exec_server.client import ExecServerClient
from exec_server.client.errors import ConnectionLostError

_EOF = object()


class MemoryTransport:
    """Client side of an in-memory message pipe; the test plays the server."""

    def __init__(self) -> None:
        self.to_server: asyncio.Queue[Any] = asyncio.Queue()
        self.to_client: asyncio.Queue[Any] = asyncio.Queue()
        self.closed = False

    async def send(self, data: bytes) -> None:
        if self.closed:
            raise ConnectionLostError("closed")
        await self.to_server.put(json.loads(data))

    async def recv(self) -> bytes | str | None:
        item = await self.to_client.get()
        if item is _EOF:
            return None
        if isinstance(item, BaseException):
            raise item
        return json.dumps(item)

    async def aclose(self) -> None:
        self.closed = True
        self.to_client.put_nowait(_EOF)

    def describe(self) -> str:
        return "memory"

    # ---- server side helpers
    async def next_request(self) -> dict[str, Any]:
        return await asyncio.wait_for(self.to_server.get(), 10)

    def reply(self, request_id: Any, result: Any) -> None:
        self.to_client.put_nowait({"id": request_id, "result": result})

    def error(self, request_id: Any, code: int, message: str) -> None:
        self.to_client.put_nowait({"id": request_id, "error": {"code": code, "message": message}})

    def notify(self, method: str, params: Any) -> None:
        self.to_client.put_nowait({"method": method, "params": params})

    def drop(self, reason: str = "peer vanished") -> None:
        self.to_client.put_nowait(ConnectionLostError(reason))


@pytest.fixture
async def fake() -> AsyncIterator[tuple[ExecServerClient, MemoryTransport]]:
    """A client wired to a MemoryTransport, past the handshake."""
    transport = MemoryTransport()
    client = ExecServerClient(transport, client_name="test")
    handshake = asyncio.create_task(client._handshake(None, 5))
    init = await transport.next_request()
    assert init["method"] == "initialize"
    transport.reply(init["id"], {"sessionId": "s-1"})
    await handshake
    assert (await transport.next_request()) == {"method": "initialized", "params": {}}
    try:
        yield client, transport
    finally:
        await client.aclose()


@pytest.fixture(params=["local", "remote"])
async def backend(no_leaks: None, request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """The same tests run against LocalExecBackend and RemoteExecBackend (real server).

    Every test using it also checks that no child process or pipe/pty/socket fd
    outlives it (``no_leaks`` is set up first, so it is checked last).
    """
    from exec_server.client import LocalExecBackend, RemoteExecBackend

    if request.param == "local":
        be: Any = LocalExecBackend()
    else:
        server = request.getfixturevalue("server")
        be = RemoteExecBackend(await ExecServerClient.connect(server.url))
    try:
        yield be
    finally:
        await be.aclose()


@pytest.fixture
def sh_env() -> dict[str, str]:
    """A minimal child environment with a PATH (PTYs need one to find programs)."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C"}
