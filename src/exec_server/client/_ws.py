"""A lean WebSocket client connection: websockets' sans-I/O opening handshake, then
our own framing over an ``asyncio.BufferedProtocol``.

Why not ``websockets.asyncio.client``: it copies every inbound frame twice on
the way to the caller (its reader copies the payload out of its buffer, its
assembler joins the frames into ``bytes``), so a 32 MiB ``read_file`` reply,
43 MB of JSON text, cost the client ~117 MiB with the decoded file. Here a
frame's payload is received straight into one buffer of its size (the socket
reads into it), and that buffer is the message: the text once, then the file.

What is kept from the library: the HTTP upgrade (request, response checks),
through :class:`websockets.client.ClientProtocol`, fed exactly the response's
head so no frame byte reaches it. What is done here, per RFC 6455: masked
client frames (text, fragmented over ``fragment`` bytes), unmasked server
frames checked (reserved bits, opcodes, control frame rules, size limit), Pong
for every Ping, and the closing handshake.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import socket
import ssl
import struct
from typing import Final

from websockets.client import ClientProtocol
from websockets.http11 import Response
from websockets.protocol import State
from websockets.uri import parse_uri

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - the C extension is missing
    from websockets.utils import apply_mask

__all__ = ["WsClientConnection", "WsClosed", "connect"]

#: Bytes read from the socket per read while no big frame is being received.
_SCRATCH: Final = 256 * 1024
#: Write buffer size above which senders wait for the socket to drain.
_WRITE_HIGH: Final = 1 << 20
_OP_CONT, _OP_TEXT, _OP_BINARY, _OP_CLOSE, _OP_PING, _OP_PONG = 0, 1, 2, 8, 9, 10
_HEAD_END: Final = b"\r\n\r\n"
#: Close codes after which the end of the stream is clean (websockets' ``ConnectionClosedOK``).
_OK_CODES: Final = (1000, 1001)


class WsClosed(Exception):
    """The connection is over; ``clean`` when both sides closed it normally."""

    def __init__(self, reason: str, *, clean: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.clean = clean


def _close_payload(code: int, reason: str = "") -> bytes:
    return struct.pack("!H", code) + reason.encode()


def _frame_header(opcode: int, fin: bool, size: int, mask: bytes) -> bytes:
    first = (0x80 if fin else 0) | opcode
    if size < 126:
        return bytes((first, 0x80 | size)) + mask
    if size < 0x10000:
        return struct.pack("!BBH", first, 0xFE, size) + mask
    return struct.pack("!BBQ", first, 0xFF, size) + mask


class WsClientConnection(asyncio.BufferedProtocol):
    """One client connection; made by :func:`connect`."""

    def __init__(
        self, handshake: ClientProtocol, max_size: int | None, token: str | None = None
    ) -> None:
        self._token = token
        self._hs = handshake
        self._max_size = max_size
        self._transport: asyncio.Transport | None = None
        self._opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._head_tail = b""  # the last bytes of the response head fed so far
        self._head_done = False  # the response's head is complete
        self._scratch = bytearray(_SCRATCH)
        self._have = 0  # unparsed bytes at the start of the scratch area
        # A frame whose payload is being received straight into its own buffer.
        self._frame: bytearray | None = None
        self._frame_filled = 0
        self._frame_opcode = 0
        self._frame_fin = True
        # A fragmented message being gathered (None between messages).
        self._fragments: list[bytes | bytearray] | None = None
        self._fragments_size = 0
        self._messages: collections.deque[bytes | bytearray] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._closed: WsClosed | None = None
        self._close_sent = False
        self._close_received: asyncio.Future[None] = self._opened.get_loop().create_future()
        self._lost: asyncio.Future[None] = self._opened.get_loop().create_future()
        self._paused = False
        self._drain: asyncio.Future[None] | None = None
        self._send_lock = asyncio.Lock()

    # -- asyncio.BufferedProtocol -------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        transport.set_write_buffer_limits(high=_WRITE_HIGH)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        request = self._hs.connect()
        if self._token is not None:
            request.headers["Authorization"] = f"Bearer {self._token}"
        self._hs.send_request(request)
        self._flush_handshake()

    def get_buffer(self, sizehint: int) -> memoryview:
        frame = self._frame
        if frame is not None:
            return memoryview(frame)[self._frame_filled :]
        return memoryview(self._scratch)[self._have :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._frame is not None:
            self._frame_filled += nbytes
            if self._frame_filled == len(self._frame):
                frame, self._frame = self._frame, None
                self._on_frame(self._frame_opcode, self._frame_fin, frame)
            return
        start = self._have
        self._have += nbytes
        if not self._opened.done():
            self._feed_handshake(start)
            if not self._opened.done() or self._open_failed():
                return
        self._parse()

    def _open_failed(self) -> bool:
        opened = self._opened
        return opened.done() and (opened.cancelled() or opened.exception() is not None)

    def eof_received(self) -> bool | None:
        if not self._opened.done():
            self._hs.receive_eof()  # a refusal's body may run to the end of the stream
            self._handshake_events()
        return None  # the transport closes; connection_lost reports it

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._opened.done():
            self._opened.set_exception(
                self._hs.handshake_exc
                or ConnectionError(f"connection closed during the handshake: {exc or 'EOF'}")
            )
        self._end(WsClosed("connection closed without a close frame", clean=False))
        if not self._lost.done():
            self._lost.set_result(None)
        self._resolve_drain()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._resolve_drain()

    # -- handshake -------------------------------------------------------------

    def _feed_handshake(self, start: int) -> None:
        """Give the library the response that arrived: up to the end of its head while
        that may be a 101 (no frame byte after it reaches the library), all of it
        once the head is known to be a refusal (its body, if any, follows)."""
        chunk = bytes(self._scratch[start : self._have])
        self._have = 0
        if self._head_done:
            self._hs.receive_data(chunk)
        else:
            seen = self._head_tail + chunk
            end = seen.find(_HEAD_END)
            if end < 0:
                self._head_tail = seen[-3:]
                self._hs.receive_data(chunk)
            else:
                self._head_done = True
                cut = end + len(_HEAD_END) - len(self._head_tail)  # in ``chunk``
                self._hs.receive_data(chunk[:cut])
                rest = chunk[cut:]
                if self._hs.state is State.OPEN:  # a 101: what follows are frames
                    self._scratch[: len(rest)] = rest
                    self._have = len(rest)
                else:  # a refusal: its body, if any
                    self._hs.receive_data(rest)
        self._handshake_events()

    def _handshake_events(self) -> None:
        for event in self._hs.events_received():
            if isinstance(event, Response) and not self._opened.done():
                if self._hs.state is State.OPEN:
                    self._opened.set_result(None)
                else:
                    exc = self._hs.handshake_exc or ConnectionError("WebSocket upgrade refused")
                    self._opened.set_exception(exc)
        if not self._opened.done() and self._hs.handshake_exc is not None:
            self._opened.set_exception(self._hs.handshake_exc)  # a malformed response
        if self._open_failed():
            if self._transport is not None:
                self._transport.abort()
            return
        self._flush_handshake()

    def _flush_handshake(self) -> None:
        data = b"".join(self._hs.data_to_send())  # the request (b"" would mean EOF: none here)
        if data and self._transport is not None:
            self._transport.write(data)

    # -- inbound frames --------------------------------------------------------

    def _parse(self) -> None:
        """Handle every whole frame in the scratch area; a frame whose payload is not
        all there yet gets its own buffer, which the socket then reads into."""
        buf = self._scratch
        pos, have = 0, self._have
        while self._closed is None and have - pos >= 2:
            b0, b1 = buf[pos], buf[pos + 1]
            opcode, fin = b0 & 0x0F, bool(b0 & 0x80)
            if b0 & 0x70:
                return self._fail(1002, "reserved bits must be 0")
            if b1 & 0x80:
                return self._fail(1002, "incorrect masking")
            size, start = b1 & 0x7F, pos + 2
            if size == 126:
                if have - start < 2:
                    break
                size, start = int.from_bytes(buf[start : start + 2], "big"), start + 2
            elif size == 127:
                if have - start < 8:
                    break
                size, start = int.from_bytes(buf[start : start + 8], "big"), start + 8
            if opcode >= 8:
                if opcode not in (_OP_CLOSE, _OP_PING, _OP_PONG):
                    return self._fail(1002, "invalid opcode")
                if not fin or size > 125:
                    return self._fail(1002, "bad control frame")
            elif opcode not in (_OP_CONT, _OP_TEXT, _OP_BINARY):
                return self._fail(1002, "invalid opcode")
            limit = self._max_size
            if limit is not None and size + (self._fragments_size if opcode == 0 else 0) > limit:
                return self._fail(1009, f"message over the limit of {limit} bytes")
            if have - start >= size:
                payload = buf[start : start + size]  # one copy, out of the scratch area
                pos = start + size
                self._on_frame(opcode, fin, payload)
                continue
            # The payload goes on arriving: into a buffer of its own, this part first.
            frame = bytearray(size)
            got = have - start
            frame[:got] = buf[start:have]
            self._frame, self._frame_filled = frame, got
            self._frame_opcode, self._frame_fin = opcode, fin
            pos = have
            break
        if self._closed is not None:
            self._have = 0  # nothing more is read
            return
        rest = have - pos
        if rest and pos:
            buf[:rest] = buf[pos:have]
        self._have = rest

    def _on_frame(self, opcode: int, fin: bool, payload: bytes | bytearray) -> None:
        if opcode in (_OP_TEXT, _OP_BINARY):
            if self._fragments is not None:
                return self._fail(1002, "expected a continuation frame")
            if fin:
                self._deliver(payload)
            else:
                self._fragments, self._fragments_size = [payload], len(payload)
        elif opcode == _OP_CONT:
            if self._fragments is None:
                return self._fail(1002, "unexpected continuation frame")
            self._fragments.append(payload)
            self._fragments_size += len(payload)
            if fin:
                parts, self._fragments, self._fragments_size = self._fragments, None, 0
                self._deliver(b"".join(parts))
        elif opcode == _OP_PING:
            self._write_frame(_OP_PONG, payload)
        elif opcode == _OP_CLOSE:
            self._on_close(payload)

    def _on_close(self, payload: bytes | bytearray) -> None:
        if len(payload) >= 2:
            code = int.from_bytes(payload[:2], "big")
            reason = bytes(payload[2:]).decode("utf-8", "replace")
        else:
            code, reason = 1005, ""
        if not self._close_sent:
            self._write_frame(_OP_CLOSE, _close_payload(code) if code != 1005 else b"")
            self._close_sent = True
        text = f"connection closed ({code}{': ' + reason if reason else ''})"
        self._end(WsClosed(text, clean=code in _OK_CODES or code == 1005))
        if not self._close_received.done():
            self._close_received.set_result(None)
        if self._transport is not None:
            self._transport.close()

    def _fail(self, code: int, why: str) -> None:
        """A protocol violation or an oversized message: close with ``code``, stop reading."""
        if not self._close_sent:
            self._write_frame(_OP_CLOSE, _close_payload(code, why))
            self._close_sent = True
        self._end(WsClosed(f"connection failed ({code}: {why})", clean=False))
        self._have = 0
        if self._transport is not None:
            self._transport.close()

    def _deliver(self, message: bytes | bytearray) -> None:
        self._messages.append(message)
        self._wake()

    def _end(self, closed: WsClosed) -> None:
        if self._closed is None:
            self._closed = closed
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- outbound --------------------------------------------------------------

    def _write_frame(
        self, opcode: int, payload: bytes | bytearray | memoryview, fin: bool = True
    ) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        mask = os.urandom(4)
        header = _frame_header(opcode, fin, len(payload), mask)
        masked = apply_mask(payload, mask) if len(payload) else b""
        if len(masked) <= 65536:
            transport.write(header + masked)
        else:
            transport.write(header)
            transport.write(masked)

    def _resolve_drain(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    async def _drained(self) -> None:
        while self._paused and self._closed is None:
            if self._drain is None or self._drain.done():
                self._drain = asyncio.get_running_loop().create_future()
            await self._drain
        if self._closed is not None:
            raise self._closed

    # -- API ---------------------------------------------------------------------

    async def send(self, data: bytes | bytearray | memoryview, fragment: int) -> None:
        """Send one text message, in frames of at most ``fragment`` bytes, each written
        as the socket drains (so a big message is never held masked whole).

        Raises:
            WsClosed: the connection is over.
        """
        lock = self._send_lock
        await lock.acquire()
        handed_over = False
        try:
            if self._closed is not None or self._close_sent:
                raise self._closed or WsClosed("connection closed", clean=True)
            view = memoryview(data).cast("B")
            if len(view) <= fragment:
                self._write_frame(_OP_TEXT, view)
                await self._drained()
                return
            # A fragmented message must be finished once begun: a caller
            # cancelled between two fragments (a timeout around a big
            # write_file) released the lock mid-message, and the next message's
            # first frame broke the connection ("expected a continuation
            # frame"; found by an audit). The fragments go out in a task of
            # their own, which lets the lock go; the caller may stop waiting.
            rest = asyncio.ensure_future(self._send_fragments(view, fragment))
            handed_over = True
        finally:
            if not handed_over:
                lock.release()
        rest.add_done_callback(_retrieve)
        await asyncio.shield(rest)

    async def _send_fragments(self, view: memoryview, fragment: int) -> None:
        """All of ``view`` in frames of ``fragment`` bytes; releases the send lock."""
        try:
            size = len(view)
            for at in range(0, size, fragment):
                last = at + fragment >= size
                self._write_frame(_OP_TEXT if at == 0 else _OP_CONT, view[at : at + fragment], last)
                await self._drained()
        finally:
            self._send_lock.release()

    async def recv(self) -> bytes | bytearray:
        """The next message (a ``bytearray`` when it was received in place).

        Raises:
            WsClosed: no message is left and the connection is over.
        """
        while not self._messages:
            if self._closed is not None:
                raise self._closed
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._messages.popleft()

    async def aclose(self, timeout: float = 2.0) -> None:  # noqa: ASYNC109
        """Start the closing handshake (1000), wait up to ``timeout`` for its answer,
        then close the socket."""
        transport = self._transport
        if transport is None:
            return
        if not self._close_sent and self._closed is None:
            self._write_frame(_OP_CLOSE, _close_payload(1000))
            self._close_sent = True
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await asyncio.wait(
                        (self._close_received, self._lost), return_when=asyncio.FIRST_COMPLETED
                    )
        self._end(WsClosed("connection closed (1000)", clean=True))
        transport.close()
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(self._lost)
        except TimeoutError:
            transport.abort()


def _retrieve(task: asyncio.Future[None]) -> None:
    """Mark a finished send's error seen: its caller may have stopped waiting."""
    if not task.cancelled():
        task.exception()


async def connect(
    url: str,
    *,
    max_size: int | None,
    open_timeout: float = 10.0,
    token: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> WsClientConnection:
    """Open a connection to ``url`` (``ws://`` or ``wss://``) and complete the upgrade.

    Args:
        token: sent as ``Authorization: Bearer <token>`` on the upgrade.
        ssl_context: verifies a ``wss://`` server (default: the system's CAs).

    Raises:
        OSError: the TCP (or TLS) connection failed (``ssl.SSLError`` included).
        websockets.WebSocketException: bad URL or refused upgrade.
        TimeoutError: no upgrade within ``open_timeout`` seconds.
        ValueError: ``ssl_context`` with a ``ws://`` URL.
    """
    wsuri = parse_uri(url)
    if ssl_context is not None and not wsuri.secure:
        raise ValueError(f"a TLS context needs a wss:// URL, not {url}")
    handshake = ClientProtocol(wsuri, max_size=max_size)
    loop = asyncio.get_running_loop()
    context = (ssl_context or ssl.create_default_context()) if wsuri.secure else None
    async with asyncio.timeout(open_timeout):
        transport, conn = await loop.create_connection(
            lambda: WsClientConnection(handshake, max_size, token),
            wsuri.host,
            wsuri.port,
            ssl=context,
            server_hostname=wsuri.host if context is not None else None,
        )
        try:
            await conn._opened
        except BaseException:
            transport.abort()
            raise
    return conn
