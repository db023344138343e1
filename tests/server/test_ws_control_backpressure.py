"""Memory a client can make the WebSocket server hold: pongs it never reads, and
messages it abandons halfway; and the single-frame guard (docs/server.md,
"Transports")."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import socket
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

from exec_server.client._ws import _frame_header
from exec_server.rpc.ws_server import RECV_AREA, WRITE_HIGH, WsConnection, serve_websocket

TIMEOUT = 10.0
MiB = 1 << 20
#: pings (125-byte payload, 131 bytes each on the wire) per client write.
BATCH = 1000
ZERO_MASK = b"\0\0\0\0"


def _client_frame(payload: bytes, opcode: int = 1, fin: bool = True) -> bytes:
    """A masked client frame (RFC 6455 §5.2); the zero mask leaves the payload as is."""
    return _frame_header(opcode, fin, len(payload), ZERO_MASK) + payload


async def _read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    async with asyncio.timeout(TIMEOUT):
        b0, b1 = await reader.readexactly(2)
        size = b1 & 0x7F
        if size == 126:
            size = int.from_bytes(await reader.readexactly(2), "big")
        elif size == 127:
            size = int.from_bytes(await reader.readexactly(8), "big")
        return b0 & 0x0F, await reader.readexactly(size)


async def _upgrade(
    host: str, port: int, *, rcvbuf: int | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:  # before connecting: the window is agreed in the handshake
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, port))
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(
        b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT)
    assert head.startswith(b"HTTP/1.1 101")
    return reader, writer


def _reset(writer: asyncio.StreamWriter) -> None:
    """Drop the connection with a TCP reset: no close frame, no FIN."""
    writer.get_extra_info("socket").setsockopt(
        socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0"
    )
    writer.transport.abort()


def _read_again(writer: asyncio.StreamWriter) -> None:
    """Let the client take data quickly again (4 KiB windows make reading slow)."""
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)


class _Echo:
    """An in-process ``serve_websocket`` handler that sends every message back."""

    def __init__(self) -> None:
        self.conns: list[WsConnection] = []
        self.connected = asyncio.Event()
        self.got: asyncio.Queue[bytes] = asyncio.Queue()  # each message, as it is received
        self.discarded: list[int] = []  # what ``on_discard`` was told
        self.ended = asyncio.Event()  # the handler saw the end of the message stream

    async def handler(self, conn: WsConnection) -> None:
        self.conns.append(conn)
        self.connected.set()
        while (msg := await conn.receive()) is not None:
            assert isinstance(msg, (bytes, bytearray))
            self.got.put_nowait(bytes(msg))
            await conn.send(bytes(msg))
        self.ended.set()


@contextlib.asynccontextmanager
async def _echo_server(
    *, rcvbuf: int | None = None
) -> AsyncIterator[tuple[_Echo, WsConnection, asyncio.StreamReader, asyncio.StreamWriter]]:
    echo = _Echo()
    srv = await serve_websocket(
        echo.handler, "127.0.0.1", 0, max_message_size=64 * MiB, on_discard=echo.discarded.append
    )
    writer: asyncio.StreamWriter | None = None
    try:
        port = srv.sockets[0].getsockname()[1]
        reader, writer = await _upgrade("127.0.0.1", port, rcvbuf=rcvbuf)
        await asyncio.wait_for(echo.connected.wait(), TIMEOUT)
        yield echo, echo.conns[0], reader, writer
    finally:
        if writer is not None:  # at once: a server closing waits for what the client reads
            writer.transport.abort()
        srv.close()
        await srv.wait_closed()


# -- 1. pongs obey the write buffer's back-pressure ---------------------------

#: pings sent by a flood: 39 MB of pongs if each were kept.
FLOOD = 300_000
#: Seconds one batch of the flood may take to be read: a hang detector only. A
#: CI run beside a heavy differential test once took over 10 s for one batch
#: (the whole flood: ~4 s alone, up to 28 s beside three busy CPUs).
FLOOD_BATCH_TIMEOUT = 60.0


def _ping(payload: bytes) -> bytes:
    return _client_frame(payload, opcode=9)


@pytest.mark.parametrize("parser", ["fast", "library"])
async def test_pongs_a_client_never_reads_are_not_kept(parser: str) -> None:
    """In-process: a client with a tiny receive buffer sends 300k pings and reads
    nothing. Once the write buffer is full the server keeps only the latest
    ping's payload (RFC 6455 §5.5.3), so what it holds stays at the high-water
    mark instead of growing by a pong per ping; when the client reads again
    the latest ping is answered and the connection carries messages as before.
    ``library``: an unsolicited pong first hands the connection to websockets'
    parser, whose pongs go out through ``_flush``."""
    async with _echo_server(rcvbuf=4096) as (echo, conn, reader, writer):
        transport: Any = conn.transport
        if parser == "library":
            writer.write(_client_frame(b"unsolicited", opcode=10))
        batch = _ping(b"p" * 125) * BATCH
        held = 0
        for _ in range(FLOOD // BATCH):
            writer.write(batch)
            await asyncio.wait_for(writer.drain(), FLOOD_BATCH_TIMEOUT)  # the server reads on
            held = max(held, transport.get_write_buffer_size())
        writer.write(_ping(b"last") + _client_frame(b'{"after":"flood"}'))
        got = await asyncio.wait_for(echo.got.get(), TIMEOUT)
        assert got == b'{"after":"flood"}'  # so every ping before it was parsed
        held = max(held, transport.get_write_buffer_size())
        assert held <= WRITE_HIGH + 256, f"{held} bytes held for a client that reads nothing"
        assert (not conn._fast) if parser == "library" else conn._fast

        _read_again(writer)
        pongs = 0
        answered = echoed = False
        while not (answered and echoed):
            opcode, data = await _read_frame(reader)
            if opcode == 10:
                assert not answered and data in (b"p" * 125, b"last")
                answered = data == b"last"
                pongs += 1
            else:
                assert (opcode, data) == (1, b'{"after":"flood"}')
                echoed = True
        assert pongs < FLOOD // 2  # the kernel's buffers took some; the rest waited for one
        writer.write(_ping(b"again") + _client_frame(b"{}"))
        assert await _read_frame(reader) == (10, b"again")
        assert await _read_frame(reader) == (1, b"{}")
        assert not echo.ended.is_set()
        assert not echo.discarded  # whole messages are not reported


# -- 2. an abandoned message is let go with the connection --------------------


@contextlib.contextmanager
def _traced_without_collector() -> Iterator[Callable[[], int]]:
    """Python's allocations traced, the cyclic collector off: what is freed is freed
    by reference counting. Yields a function giving the bytes traced now."""
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    tracemalloc.start()
    try:
        yield lambda: tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
        if enabled:
            gc.enable()


def _feed(conn: WsConnection, data: bytes) -> None:
    """Hand ``data`` to the connection as socket reads (the receive area, as asyncio does)."""
    view = memoryview(data)
    for start in range(0, len(view), RECV_AREA):
        piece = view[start : start + RECV_AREA]
        conn.get_buffer(-1)[: len(piece)] = piece
        conn.buffer_updated(len(piece))


PARTIAL = 16 * MiB
_HEAD = b'{"id":1,"method":"fs/writeFile","params":{"dataBase64":"'


def _fragments(size: int) -> bytes:
    """A Text message's first ``size`` bytes in 1 MiB fragments, without its last one."""
    first = _client_frame(_HEAD + b"A" * (MiB - len(_HEAD)), fin=False)
    rest = _client_frame(b"A" * MiB, opcode=0, fin=False)
    return first + rest * (size // MiB - 1)


def _half_frame(size: int) -> bytes:
    """The first half of a single Text frame of ``size`` bytes."""
    frame = _client_frame(_HEAD + b"A" * (size - len(_HEAD)))
    return frame[: len(frame) // 2]


@pytest.mark.parametrize(
    ("parser", "cut", "end"),
    [
        ("fast", "fragments", "reset"),
        ("fast", "fragments", "eof"),
        ("fast", "fragments", "close"),
        ("fast", "frame", "reset"),
        ("fast", "frame", "eof"),
        ("library", "fragments", "reset"),
        ("library", "frame", "reset"),
        ("library", "fragments", "close"),
    ],
)
async def test_a_half_received_message_is_let_go_when_the_client_leaves(
    parser: str, cut: str, end: str
) -> None:
    """In-process, collector off: the client sends 16 MiB of a message (fragments, or
    a single frame cut halfway) and then resets TCP, ends its side (FIN) or sends a
    close frame. What the server gathered is freed as soon as the message stream
    ends, by reference counting: it used to stay with the connection until a full
    collection.
    ``on_discard`` is told how much was let go (the heap may keep it resident
    otherwise), except for a frame the library buffered: it does not say.
    ``library``: an unsolicited pong first hands the connection to websockets'
    parser, which buffers a cut frame itself."""
    async with _echo_server() as (echo, conn, _reader, writer):
        with _traced_without_collector() as traced:
            if parser == "library":
                _feed(conn, _client_frame(b"unsolicited", opcode=10))
                assert not conn._fast
            before = traced()
            _feed(conn, _fragments(PARTIAL) if cut == "fragments" else _half_frame(2 * PARTIAL))
            assert traced() - before >= PARTIAL - MiB  # held while the message may go on
            if end == "close":
                writer.write(_client_frame((1000).to_bytes(2, "big"), opcode=8))
            elif end == "eof":
                writer.write_eof()
            else:
                _reset(writer)
            await asyncio.wait_for(echo.ended.wait(), TIMEOUT)
            held = traced() - before
            assert held < MiB, f"{held} bytes still held after the client left"
            if (parser, cut) != ("library", "frame"):
                assert PARTIAL - MiB <= sum(echo.discarded) <= PARTIAL + MiB


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
    host, port = srv.url.removeprefix("ws://").rsplit(":", 1)
    init = json.dumps({"id": 0, "method": "initialize", "params": {"clientName": "t"}})
    partial = _fragments(32 * MiB)

    idle = _sockets(srv)
    reader, writer = await _upgrade(host, int(port))  # a warm-up: its buffers stay allocated
    writer.write(_client_frame(init.encode()))
    assert (await _read_frame(reader))[0] == 1
    writer.close()
    await wait_until(lambda: _sockets(srv) <= idle)
    baseline = _vm_rss(srv.pid)

    for _ in range(3):
        reader, writer = await _upgrade(host, int(port))
        writer.write(partial)
        writer.write(_client_frame(b"sync", opcode=9))  # the pong follows the last fragment
        assert await _read_frame(reader) == (10, b"sync")
        if end == "close":
            writer.write(_client_frame((1000).to_bytes(2, "big"), opcode=8))
            assert (await _read_frame(reader))[0] == 8
            writer.close()
        else:
            _reset(writer)
        await wait_until(lambda: _sockets(srv) <= idle)
    grown = _vm_rss(srv.pid) - baseline
    assert grown < 16 * MiB, f"the server holds {grown >> 20} MiB more than before"


def _unread(local_port: int, remote_port: int) -> int:
    """Bytes waiting in the receive queue of the TCP socket ``local_port`` ->
    ``remote_port`` (/proc/net/tcp): what its owner has not read yet."""
    with open("/proc/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            local, remote = fields[1], fields[2]
            if int(local.split(":")[1], 16) == local_port and int(
                remote.split(":")[1], 16
            ) == remote_port:
                return int(fields[4].split(":")[1], 16)
    raise AssertionError(f"no socket {local_port} -> {remote_port}")


async def test_a_ping_flood_nobody_reads_leaves_the_server_resident_size_bounded(
    server_factory: Callable[..., Any],
    wait_until: Callable[..., Awaitable[None]],
) -> None:
    """A real server, the audit's case: 300k pings from a client with a tiny receive
    buffer that reads nothing (the server's resident size grew by one pong per
    ping: 390 MB for 3 M). Measured once the server has read them all; then the
    client reads, and the latest ping and a request sent after the flood are
    answered."""
    srv = server_factory()
    host, port = srv.url.removeprefix("ws://").rsplit(":", 1)
    reader, writer = await _upgrade(host, int(port), rcvbuf=4096)
    client_port = writer.get_extra_info("sockname")[1]
    init = json.dumps({"id": 1, "method": "initialize", "params": {"clientName": "t"}})
    writer.write(_client_frame(init.encode()))
    assert json.loads((await _read_frame(reader))[1])["id"] == 1
    baseline = _vm_rss(srv.pid)
    batch = _ping(b"p" * 125) * BATCH
    for _ in range(FLOOD // BATCH):
        writer.write(batch)
        await asyncio.wait_for(writer.drain(), FLOOD_BATCH_TIMEOUT)
    writer.write(_ping(b"last") + _client_frame(b'{"id":2,"method":"environment/status"}'))
    await asyncio.wait_for(writer.drain(), TIMEOUT)
    await wait_until(lambda: _unread(int(port), client_port) == 0)  # all read and answered
    grown = _vm_rss(srv.pid) - baseline
    assert grown < 16 * MiB, f"the server holds {grown >> 20} MiB more for unread pongs"
    _read_again(writer)
    answered = replied = False
    while not (answered and replied):
        opcode, data = await _read_frame(reader)
        if opcode == 10:
            answered = data == b"last"
        else:
            assert json.loads(data) == {"id": 2, "result": {"status": "ready"}}
            replied = True
    writer.close()


# -- 3. the single-frame guard is twice the limit plus 1 MiB ------------------


async def test_the_frame_guard_is_twice_the_message_limit_plus_1_mib(
    server_factory: Callable[..., Any],
) -> None:
    """docs/server.md, "Message size": with ``--max-message-size 1M`` a single frame
    of up to 3 MiB (2 x 1 MiB + 1 MiB) is an oversized message (-32600, the
    connection stays); one byte more closes the connection with 1009."""
    srv = server_factory("--max-message-size", "1M")
    host, port = srv.url.removeprefix("ws://").rsplit(":", 1)
    guard = 2 * MiB + MiB

    def request(size: int) -> bytes:
        text = b'{"id":7,"method":"fs/writeFile","params":{"dataBase64":"'
        return _client_frame(text + b"A" * (size - len(text) - 3) + b'"}}')

    reader, writer = await _upgrade(host, int(port))
    for size in (3_000_101, guard):
        writer.write(request(size))
        reply = json.loads((await _read_frame(reader))[1])
        assert reply == {
            "id": 7,
            "error": {
                "code": -32600,
                "message": f"JSON-RPC message from exec-server websocket {_peer(writer)} "
                f"is too large: {size} bytes exceeds the limit of {MiB} bytes",
            },
        }
    writer.write(request(guard + 1))
    opcode, data = await _read_frame(reader)
    assert opcode == 8
    assert int.from_bytes(data[:2], "big") == 1009
    assert data[2:] == f"frame with {guard + 1} bytes exceeds limit of {guard} bytes".encode()
    writer.close()


def _peer(writer: asyncio.StreamWriter) -> str:
    host, port = writer.get_extra_info("sockname")[:2]
    return f"{host}:{port}"
