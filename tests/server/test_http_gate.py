"""The upgrade gate as ``websockets.asyncio.server``'s ``process_request`` hook, and the
token parsing of :mod:`exec_server.transport.ws_auth`, without a server process."""

from __future__ import annotations

import hashlib

import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import InvalidStatus

from exec_server.transport.http_gate import UpgradeGate
from exec_server.transport.ws_auth import (
    AuthRefused,
    CapabilityToken,
    bearer_token,
)

TOKEN = "gate-token-0123456789"


async def test_the_gate_works_as_the_library_servers_process_request_hook() -> None:
    gate = UpgradeGate(CapabilityToken(hashlib.sha256(TOKEN.encode()).digest(), None))
    seen: list[object] = []

    async def handler(conn: ServerConnection) -> None:
        seen.append(getattr(conn, "grant", None))
        await conn.send("hello")

    async with serve(handler, "127.0.0.1", 0, process_request=gate.process_request) as server:
        port = server.sockets[0].getsockname()[1]
        url = f"ws://127.0.0.1:{port}"
        async with connect(url, additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
            assert await ws.recv() == "hello"
        for headers, origin, status in [
            ({}, None, 401),
            ({"Authorization": "Bearer nope"}, None, 401),
            ({"Authorization": f"Bearer {TOKEN}"}, "http://localhost", 403),
        ]:
            with pytest.raises(InvalidStatus) as info:
                async with connect(url, additional_headers=headers, origin=origin):  # type: ignore[arg-type]
                    pass
            assert info.value.response.status_code == status
    assert len(seen) == 1 and seen[0] is not None


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer   abc  ", "abc"),
        ("BEARER abc def", "abc def"),
    ],
)
def test_bearer_token_accepts(header: str, token: str) -> None:
    assert bearer_token(header) == token


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        (None, "missing websocket bearer token"),
        ("Basic abc", "invalid authorization header"),
        ("Bearer", "invalid authorization header"),
        ("Bearer ", "invalid authorization header"),
        ("Bearer\tabc", "invalid authorization header"),
        ("Bearer ab\x01c", "invalid authorization header"),
        ("Bearer caf\xe9", "invalid authorization header"),
    ],
)
def test_bearer_token_refuses(header: str | None, reason: str) -> None:
    with pytest.raises(AuthRefused) as info:
        bearer_token(header)
    assert info.value.reason == reason
