"""Memory a client can make the WebSocket server hold: messages it abandons
halfway; and the single-frame guard (docs/server.md, "Transports")."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from ws_frames import TIMEOUT, UPGRADE, client_frame, read_frame, upgraded

MiB = 1 << 20


def _reset(writer: asyncio.StreamWriter) -> None:
    """Drop the connection with a TCP reset: no close frame, no FIN."""
    writer.get_extra_info("socket").setsockopt(
        socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0"
    )
    writer.transport.abort()


# -- 2. an abandoned message is let go with the connection --------------------


PARTIAL = 16 * MiB
_HEAD = b'{"id":1,"method":"fs/writeFile","params":{"dataBase64":"'


def _fragments(size: int) -> bytes:
    """A Text message's first ``size`` bytes in 1 MiB fragments, without its last one."""
    first = client_frame(_HEAD + b"A" * (MiB - len(_HEAD)), fin=False)
    rest = client_frame(b"A" * MiB, opcode=0, fin=False)
    return first + rest * (size // MiB - 1)


def _vm_rss(pid: int) -> int:
    """Resident memory of ``pid`` in bytes (``VmRSS`` of /proc/PID/status)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS line")


def _sockets(server: Any) -> int:
    return sum(target.startswith("socket:") for target in server.open_fds().values())


@pytest.mark.parametrize("end", ["reset", "close"])
async def test_abandoned_32_mib_messages_leave_the_server_resident_size_as_it_was(
    server_factory: Callable[..., Any],
    wait_until: Callable[..., Awaitable[None]],
    end: str,
) -> None:
    """A real server, three clients in turn each sending 32 MiB of a message in
    1 MiB fragments, then leaving (TCP reset, or a close frame). The server's
    resident size comes back to where it was, with no collection forced (each
    message used to stay mapped: +105 MB for three)."""
    srv = server_factory()
    init = json.dumps({"id": 0, "method": "initialize", "params": {"clientName": "t"}})
    partial = _fragments(32 * MiB)

    idle = _sockets(srv)
    reader, writer = await upgraded(srv.url)  # a warm-up: its buffers stay allocated
    writer.write(client_frame(init.encode()))
    assert (await read_frame(reader))[0] == 1
    writer.close()
    await wait_until(lambda: _sockets(srv) <= idle)
    baseline = _vm_rss(srv.pid)

    for _ in range(3):
        reader, writer = await upgraded(srv.url)
        writer.write(partial)
        writer.write(client_frame(b"sync", opcode=9))  # the pong follows the last fragment
        assert await read_frame(reader) == (10, b"sync")
        if end == "close":
            writer.write(client_frame((1000).to_bytes(2, "big"), opcode=8))
            assert (await read_frame(reader))[0] == 8
            writer.close()
        else:
            _reset(writer)
        await wait_until(lambda: _sockets(srv) <= idle)
    grown = _vm_rss(srv.pid) - baseline
    assert grown < 16 * MiB, f"the server holds {grown >> 20} MiB more than before"


# -- 3. the single-frame guard is twice the limit plus 1 MiB ------------------


async def test_the_frame_guard_is_twice_the_message_limit_plus_1_mib(
    server_factory: Callable[..., Any],
) -> None:
    """docs/server.md, "Message size": with ``--max-message-size 1M`` a single frame
    of up to 3 MiB (2 x 1 MiB + 1 MiB) is an oversized message (-32600, the
    connection stays); one byte more closes the connection with 1009."""
    srv = server_factory("--max-message-size", "1M")
    guard = 2 * MiB + MiB

    def request(size: int) -> bytes:
        text = b'{"id":7,"method":"fs/writeFile","params":{"dataBase64":"'
        return client_frame(text + b"A" * (size - len(text) - 3) + b'"}}')

    reader, writer = await upgraded(srv.url)
    for size in (3_000_101, guard):
        writer.write(request(size))
        reply = json.loads((await read_frame(reader))[1])
        assert reply == {
            "id": 7,
            "error": {
                "code": -32600,
                "message": f"JSON-RPC message from exec-server websocket {_peer(writer)} "
                f"is too large: {size} bytes exceeds the limit of {MiB} bytes",
            },
        }
    writer.write(request(guard + 1))
    opcode, data = await read_frame(reader)
    assert opcode == 8
    assert int.from_bytes(data[:2], "big") == 1009
    assert data[2:] == f"frame with {guard + 1} bytes exceeds limit of {guard} bytes".encode()
    writer.close()


def _peer(writer: asyncio.StreamWriter) -> str:
    host, port = writer.get_extra_info("sockname")[:2]
    return f"{host}:{port}"


#: pings a flooding client sends: ~39 MB of pongs if the server kept one per ping.
FLOOD = 300_000
#: pings per client write.
BATCH = 1000


async def test_a_client_that_pings_without_reading_is_held_back_not_buffered() -> None:
    """In-process: a client with a tiny receive window sends a ping flood and reads
    nothing. The server stops reading once its write buffer is full (TCP then
    holds the client), so what it holds stays at the write limit instead of
    growing by a pong per ping; when the client reads again every ping is
    answered in order and the connection carries messages as before."""
    from exec_server.transport.websocket import WRITE_LIMIT, serve_websocket

    got: asyncio.Queue[bytes] = asyncio.Queue()

    async def echo(conn: Any) -> None:
        while (msg := await conn.receive()) is not None:
            got.put_nowait(bytes(msg))
            await conn.send(bytes(msg))

    server = await serve_websocket(echo, "127.0.0.1", 0, max_message_size=MiB)
    writer: asyncio.StreamWriter | None = None
    sender: asyncio.Task[None] | None = None
    try:
        port = server.sockets[0].getsockname()[1]
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before the handshake
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 22)
        writer.write(UPGRADE)
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT)
        (conn,) = server.connections

        async def flood() -> None:
            assert writer is not None
            batch = client_frame(b"p" * 125, opcode=9) * BATCH
            for _ in range(FLOOD // BATCH):
                writer.write(batch)
                await writer.drain()
            writer.write(client_frame(b'{"after":"flood"}'))
            await writer.drain()

        sender = asyncio.create_task(flood())
        held = 0
        async with asyncio.timeout(60):
            while conn.transport.is_reading():  # a transport state: nothing to await
                held = max(held, conn.transport.get_write_buffer_size())
                await asyncio.sleep(0.005)
        held = max(held, conn.transport.get_write_buffer_size())
        assert not sender.done()  # the client is held back: its flood is not through
        # at most the limit plus the pongs of the one read in progress (asyncio reads
        # up to 256 KiB at a time; a pong is as big as its ping)
        assert held <= WRITE_LIMIT + 300 * 1024, f"{held} bytes held for a non-reading client"

        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        pongs = 0
        async with asyncio.timeout(120):
            while True:
                opcode, data = await read_frame(reader)
                if opcode == 10:
                    assert data == b"p" * 125
                    pongs += 1
                    continue
                assert (opcode, data) == (1, b'{"after":"flood"}')
                break
        assert pongs == FLOOD  # nothing dropped: every ping answered, in order
        await asyncio.wait_for(sender, TIMEOUT)
        assert await asyncio.wait_for(got.get(), TIMEOUT) == b'{"after":"flood"}'
    finally:
        if sender is not None and not sender.done():
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
        if writer is not None:
            writer.transport.abort()
        server.close()
        await server.wait_closed()
