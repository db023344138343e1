"""The client's own WebSocket framing (``client._ws``) against websockets' server as
the reference peer, and against a hand-written server for the handshake's edges."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import websockets
from websockets.asyncio.server import ServerConnection, serve

from exec_server.client._ws import WsClosed, connect

WAIT = 10.0
MIB = 1 << 20

Handler = Callable[[ServerConnection], Awaitable[None]]


@pytest.fixture
async def peer() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    """``await peer(handler)``: a websockets server running ``handler`` per connection; its URL."""
    servers: list[Any] = []

    async def start(handler: Handler) -> str:
        server = await serve(handler, "127.0.0.1", 0, max_size=None, compression=None)
        servers.append(server)
        port = next(iter(server.sockets)).getsockname()[1]
        return f"ws://127.0.0.1:{port}"

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


async def test_messages_both_ways_whole_and_fragmented(peer: Any) -> None:
    """Small and big messages out (over ``fragment`` bytes: a fragmented message),
    echoed back as one frame each; the big one arrives whole, in place."""

    async def echo(ws: ServerConnection) -> None:
        async for message in ws:
            await ws.send(message)

    conn = await connect(await peer(echo), max_size=None)
    big = base64.b64encode(os.urandom(3 * MIB + 5))  # text frames: valid UTF-8
    try:
        for message in (b"", b"hi", big, b"after"):
            await asyncio.wait_for(conn.send(message, fragment=MIB), WAIT)
            got = await asyncio.wait_for(conn.recv(), WAIT)
            assert bytes(got) == message
    finally:
        await conn.aclose()


async def test_a_fragmented_message_from_the_server_is_joined(peer: Any) -> None:
    parts = [b"x" * 70_000, b"", b"y" * 3, b"z" * 300_000]

    async def fragments(ws: ServerConnection) -> None:
        await ws.send(iter(parts))
        await ws.send(b"next")
        await ws.wait_closed()

    conn = await connect(await peer(fragments), max_size=None)
    try:
        assert bytes(await asyncio.wait_for(conn.recv(), WAIT)) == b"".join(parts)
        assert bytes(await asyncio.wait_for(conn.recv(), WAIT)) == b"next"
    finally:
        await conn.aclose()


async def test_pings_are_answered(peer: Any) -> None:
    answered: asyncio.Future[float] = asyncio.get_running_loop().create_future()

    async def pinger(ws: ServerConnection) -> None:
        waiter = await ws.ping(b"are you there")
        answered.set_result(await waiter)
        await ws.wait_closed()

    conn = await connect(await peer(pinger), max_size=None)
    try:
        assert await asyncio.wait_for(answered, WAIT) >= 0
    finally:
        await conn.aclose()


@pytest.mark.parametrize(
    ("code", "reason", "clean", "text"),
    [
        (1000, "", True, "connection closed (1000)"),
        (1001, "bye", True, "connection closed (1001: bye)"),
        (1011, "boom", False, "connection closed (1011: boom)"),
    ],
)
async def test_a_close_from_the_server_ends_the_stream(
    peer: Any, code: int, reason: str, clean: bool, text: str
) -> None:
    """Messages sent before the close are still received; then the end, clean for
    1000/1001 (``recv`` of the transport returns None) and an error otherwise."""
    closed: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()

    async def closer(ws: ServerConnection) -> None:
        await ws.send(b"last words")
        await ws.close(code, reason)
        closed.set_result(ws.close_code)

    conn = await connect(await peer(closer), max_size=None)
    try:
        assert bytes(await asyncio.wait_for(conn.recv(), WAIT)) == b"last words"
        with pytest.raises(WsClosed) as info:
            await asyncio.wait_for(conn.recv(), WAIT)
        assert info.value.clean is clean
        assert info.value.reason == text
        assert await asyncio.wait_for(closed, WAIT) == code  # our answer echoed the code
        with pytest.raises(WsClosed):
            await conn.send(b"too late", fragment=MIB)
    finally:
        await conn.aclose()


async def test_a_message_over_the_limit_fails_the_connection_with_1009(peer: Any) -> None:
    seen: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()

    async def flood(ws: ServerConnection) -> None:
        await ws.send(b"small")
        await ws.send(b"x" * 5000)
        await ws.wait_closed()
        seen.set_result(ws.close_code)

    conn = await connect(await peer(flood), max_size=4096)
    try:
        assert bytes(await asyncio.wait_for(conn.recv(), WAIT)) == b"small"
        with pytest.raises(WsClosed) as info:
            await asyncio.wait_for(conn.recv(), WAIT)
        assert not info.value.clean
        assert "1009" in info.value.reason
        assert await asyncio.wait_for(seen, WAIT) == 1009
    finally:
        await conn.aclose()


async def test_aclose_runs_the_closing_handshake(peer: Any) -> None:
    seen: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()

    async def wait(ws: ServerConnection) -> None:
        await ws.wait_closed()
        seen.set_result(ws.close_code)

    conn = await connect(await peer(wait), max_size=None)
    await asyncio.wait_for(conn.aclose(), WAIT)
    assert await asyncio.wait_for(seen, WAIT) == 1000
    with pytest.raises(WsClosed) as info:
        await conn.recv()
    assert info.value.clean


async def test_a_refused_upgrade_is_an_error(peer: Any) -> None:
    async def never(ws: ServerConnection) -> None:  # pragma: no cover - refused first
        await ws.wait_closed()

    server = await serve(
        never, "127.0.0.1", 0, process_request=lambda conn, req: conn.respond(403, "no\n")
    )
    try:
        port = next(iter(server.sockets)).getsockname()[1]
        with pytest.raises(websockets.InvalidStatus, match="403"):
            await asyncio.wait_for(connect(f"ws://127.0.0.1:{port}", max_size=None), WAIT)
    finally:
        server.close()
        await server.wait_closed()


async def _upgrade(reader: asyncio.StreamReader) -> bytes:
    """Read a client's upgrade request; the 101 response that accepts it."""
    head = await reader.readuntil(b"\r\n\r\n")
    key = next(
        line.split(b":", 1)[1].strip()
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"sec-websocket-key:")
    )
    digest = hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest()
    return (
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Accept: " + base64.b64encode(digest) + b"\r\n\r\n"
    )


@pytest.mark.parametrize("split", [1, 3, None], ids=["byte-by-byte", "in-threes", "one-write"])
async def test_frames_right_behind_the_upgrade_response_are_not_lost(split: int | None) -> None:
    """A hand-written server writes its 101 response and two frames at once (or a
    few bytes at a time): the library gets exactly the head, our parser the frames."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        response = await _upgrade(reader)
        frames = bytes((0x81, 5)) + b"first" + bytes((0x81, 126)) + (300).to_bytes(2, "big")
        frames += b"s" * 300
        out = response + frames
        for at in range(0, len(out), split or len(out)):
            writer.write(out[at : at + (split or len(out))])
            await writer.drain()
        await reader.read()  # until the client goes
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        conn = await asyncio.wait_for(connect(f"ws://127.0.0.1:{port}", max_size=None), WAIT)
        assert bytes(await asyncio.wait_for(conn.recv(), WAIT)) == b"first"
        assert bytes(await asyncio.wait_for(conn.recv(), WAIT)) == b"s" * 300
        await conn.aclose(timeout=0.2)
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(
    ("frame", "why"),
    [
        (bytes((0xC1, 1)) + b"x", "reserved bits"),
        (bytes((0x81, 0x81)) + b"\x00\x00\x00\x00x", "incorrect masking"),
        (bytes((0x83, 1)) + b"x", "invalid opcode"),
        (bytes((0x09, 0)), "bad control frame"),  # a ping without fin
        (bytes((0x80, 1)) + b"x", "unexpected continuation"),
    ],
)
async def test_protocol_violations_fail_the_connection(frame: bytes, why: str) -> None:
    got: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await _upgrade(reader) + frame)
        got.set_result(await reader.read())  # the client's close frame, then EOF
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        conn = await asyncio.wait_for(connect(f"ws://127.0.0.1:{port}", max_size=None), WAIT)
        with pytest.raises(WsClosed) as info:
            await asyncio.wait_for(conn.recv(), WAIT)
        assert why in info.value.reason and "1002" in info.value.reason
        closing = await asyncio.wait_for(got, WAIT)
        assert closing[0] == 0x88  # a close frame, masked, with code 1002
        mask, body = closing[2:6], closing[6 : 6 + (closing[1] & 0x7F)]
        assert int.from_bytes(bytes(b ^ mask[i % 4] for i, b in enumerate(body))[:2], "big") == 1002
        await conn.aclose(timeout=0.2)
    finally:
        server.close()
        await server.wait_closed()


async def test_an_upgrade_never_answered_times_out_and_closes_the_socket() -> None:
    gone: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        gone.set_result(await reader.read())  # EOF once the client gives up
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(TimeoutError):
            await connect(f"ws://127.0.0.1:{port}", max_size=None, open_timeout=0.3)
        assert await asyncio.wait_for(gone, WAIT) == b""
    finally:
        server.close()
        await server.wait_closed()


async def test_a_refused_tcp_connection_is_an_os_error() -> None:
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    with pytest.raises(OSError):
        await asyncio.wait_for(connect(f"ws://127.0.0.1:{port}", max_size=None), WAIT)
