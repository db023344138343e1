"""Message transports: one JSON-RPC message per WebSocket message or per line.

A transport moves whole messages as bytes; it neither parses JSON nor knows
about methods. :class:`WebSocketTransport` adapts a ``websockets`` asyncio
connection (the listener's, :mod:`exec_server.transport.websocket`);
:class:`StreamTransport` frames lines on a byte stream (stdio).

Size limit (PROTOCOL.md §14: a larger message gets a clear error, not a dropped
connection): the WebSocket transport receives messages fragment by fragment
and, once a message grows past ``max_message_size``, discards the rest of it
and reports :class:`OversizedMessage`. The library still buffers a single
*frame* whole, so it is configured with a frame limit
(:func:`~exec_server.transport.websocket.serve_websocket`) and closes the connection
with 1009 for a larger frame: that is the memory guard. The line transport
discards oversized lines chunk by chunk and never buffers more than the limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol, TypeAlias

from websockets.exceptions import ConnectionClosed

from exec_server.transport.ws_auth import Grant

if TYPE_CHECKING:  # imported with the listener only: stdio serving does without it
    from websockets.asyncio.connection import Connection

__all__ = [
    "CLOSE_TIMEOUT",
    "HEAD_SIZE",
    "Inbound",
    "MemoryTransport",
    "MessageTransport",
    "Outbound",
    "OversizedMessage",
    "StreamTransport",
    "WebSocketTransport",
    "close_reason",
    "memory_pair",
    "set_nodelay",
]

#: seconds a WebSocket closing handshake may take before the connection is aborted.
CLOSE_TIMEOUT: Final = 2.0
#: bytes of an oversized message kept so its ``id`` can still be answered.
HEAD_SIZE: Final = 256
_READ_CHUNK: Final = 1 << 20
#: A line at least this long is handed over in the buffer it was read into
#: (what follows it is copied out instead), when that copies less.
_HAND_OVER_MIN: Final = 64 << 10
#: A line longer than this is written in pieces of :data:`_FEED` as the pipe drains.
_FEED_MIN: Final = 4 << 20
_FEED: Final = 1 << 20


@dataclass(frozen=True, slots=True)
class OversizedMessage:
    """A message larger than the limit; its body was discarded.

    Attributes:
        size: bytes received for it (at least ``limit + 1``).
        limit: the configured maximum.
        head: its first bytes, to recover the request id.
    """

    size: int
    limit: int
    head: bytes


#: What ``receive`` returns: a message, an oversized marker, or None at EOF. A
#: message that came in several WebSocket fragments is the bytearray they were
#: gathered in (not copied into a ``bytes``).
Inbound: TypeAlias = bytes | bytearray | OversizedMessage | None

#: What ``send`` takes: one encoded message.
Outbound: TypeAlias = bytes | bytearray


class MessageTransport(Protocol):
    """A bidirectional, message-framed connection."""

    #: human label used in logs and parse-error texts (PROTOCOL.md §3.6).
    label: str
    #: ``"websocket"`` or ``"line"``; picks the parse-error wording.
    kind: str

    async def receive(self) -> Inbound:
        """Next inbound message; None once the peer is gone."""
        ...

    async def send(self, data: Outbound) -> None:
        """Send one UTF-8 JSON message (waits for buffer space: backpressure).

        Raises:
            ConnectionError: the connection is closed.
        """
        ...

    async def aclose(self) -> None:
        """Close; idempotent."""
        ...


def set_nodelay(sock: socket.socket | None) -> None:
    """Disable Nagle on a TCP socket (small request/response messages)."""
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def close_reason(text: str) -> str:
    """``text`` cut to the 123 UTF-8 bytes a close frame's reason holds, on a
    character boundary."""
    return text.encode(errors="replace")[:123].decode(errors="ignore")


class WebSocketTransport:
    """Adapter over a websockets asyncio connection.

    Sends Text frames (a message over :data:`_FEED_MIN` as a fragmented message
    of :data:`_FEED` pieces, so the library never holds a framed copy of all
    of it); accepts Text and Binary frames, without checking UTF-8 (the JSON
    decoder rejects bad text with a JSON-RPC error).
    """

    kind = "websocket"

    def __init__(
        self,
        ws: Connection,
        *,
        label: str,
        max_message_size: int,
        grant: Grant | None = None,
    ) -> None:
        self.ws = ws
        self.label = label
        self.max_message_size = max_message_size
        #: what the upgrade was accepted with (a signed token's expiry).
        self.grant = grant if grant is not None else Grant()
        #: the close frame :meth:`aclose` sends (code, reason).
        self.close_with: tuple[int, str] = (1000, "")

    @property
    def hangup_fd(self) -> int | None:
        """The socket's descriptor, which shows the peer leaving while nobody reads
        (``ConnectionProcessor._watch_hangup``); None once it is closed."""
        sock = self.ws.transport.get_extra_info("socket")
        fd = sock.fileno() if sock is not None else -1
        return fd if fd >= 0 else None

    async def receive(self) -> Inbound:
        limit = self.max_message_size
        # The first fragment, then (from the second) a bytearray grown in place: a
        # list joined at the end would hold the message twice.
        body: bytes | bytearray = b""
        size = 0
        head = b""
        try:
            async for fragment in self.ws.recv_streaming(decode=False):
                assert isinstance(fragment, bytes)
                size += len(fragment)
                if size > limit:
                    if not head:
                        head = (bytes(body[:HEAD_SIZE]) + fragment[:HEAD_SIZE])[:HEAD_SIZE]
                        body = b""
                elif not body:
                    body = fragment
                elif isinstance(body, bytearray):
                    body += fragment
                else:
                    body = bytearray(body)
                    body += fragment
        except ConnectionClosed:
            return None
        if size > limit:
            return OversizedMessage(size, limit, head)
        return body

    async def send(self, data: Outbound) -> None:
        try:
            if len(data) <= _FEED_MIN:
                await self.ws.send(data, text=True)
            else:
                view = memoryview(data)
                pieces = (view[i : i + _FEED] for i in range(0, len(view), _FEED))
                await self.ws.send(pieces, text=True)
        except ConnectionClosed as exc:
            raise ConnectionResetError(str(exc)) from exc

    def refuse(self, reason: str) -> None:
        """Close with 1008 (policy violation) and ``reason`` instead of a normal
        closure: the peer broke the JSON-RPC protocol (PROTOCOL.md §3.5) and learns
        how. ``reason`` is cut to the 123 bytes a close frame holds."""
        self.close_with = (1008, close_reason(reason))

    async def aclose(self) -> None:
        """Closing handshake with :attr:`close_with`; the TCP connection is aborted
        if it has not ended after :data:`CLOSE_TIMEOUT` (a peer that does not read
        leaves the close frame stuck behind a full write buffer)."""
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT):
                await self.ws.close(*self.close_with)
        except TimeoutError:
            self.ws.transport.abort()


class StreamTransport:
    """Newline-delimited JSON over a byte stream (PROTOCOL.md §2.6).

    Blank lines are ignored; EOF means disconnect; each write is flushed.

    Big lines are not copied whole (a copy of a 32 MiB ``fs/readFile``
    reply costs ~35 MiB of peak memory): a long line read is returned in the
    buffer it was gathered in, and a long line sent is fed to the pipe 1 MiB
    at a time as it drains, instead of asyncio's pipe transport copying its
    unsent rest into its own buffer.
    """

    kind = "line"

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        label: str,
        max_message_size: int,
        hangup_fd: int | None = None,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.label = label
        self.max_message_size = max_message_size
        #: the descriptor the peer's leaving shows on (stdin's), for
        #: ``ConnectionProcessor`` to watch while it does not read; None: unknown.
        self.hangup_fd = hangup_fd
        self._buffer = bytearray()
        self._scanned = 0
        self._eof = False
        #: the line being fed (:meth:`send`), with every later one chained behind it.
        self._feeding: asyncio.Future[None] | None = None

    async def receive(self) -> Inbound:
        limit = self.max_message_size
        buf = self._buffer
        while True:
            # only scan bytes not scanned before: long lines arrive in many chunks
            newline = buf.find(b"\n", self._scanned)
            if newline >= 0:
                self._scanned = 0
                if newline > limit:
                    head = bytes(buf[:HEAD_SIZE])
                    del buf[: newline + 1]
                    return OversizedMessage(newline, limit, head)
                line: bytes | bytearray
                if newline >= _HAND_OVER_MIN and len(buf) - newline - 1 < newline:
                    # The line is most of the buffer: keep it there, copy the rest out.
                    self._buffer = bytearray(memoryview(buf)[newline + 1 :])
                    del buf[newline:]  # drops the newline and the rest: no copy
                    line, buf = buf, self._buffer
                else:
                    line = bytes(memoryview(buf)[:newline])
                    del buf[: newline + 1]
                if line and not line.isspace():
                    return line
                continue
            self._scanned = len(buf)
            if self._eof:
                self._scanned = 0
                if buf and not buf.isspace():
                    line = bytes(buf)
                    buf.clear()
                    return line
                return None
            if len(buf) > limit:
                self._scanned = 0
                return await self._discard_line()
            chunk = await self.reader.read(_READ_CHUNK)
            if not chunk:
                self._eof = True
            else:
                buf += chunk

    async def _discard_line(self) -> OversizedMessage:
        head = bytes(self._buffer[:HEAD_SIZE])
        size = len(self._buffer)
        self._buffer.clear()
        while True:
            chunk = await self.reader.read(_READ_CHUNK)
            if not chunk:
                self._eof = True
                return OversizedMessage(size, self.max_message_size, head)
            newline = chunk.find(b"\n")
            if newline >= 0:
                size += newline
                self._buffer += chunk[newline + 1 :]
                return OversizedMessage(size, self.max_message_size, head)
            size += len(chunk)

    async def send(self, data: Outbound) -> None:
        if self.writer.is_closing():
            raise ConnectionResetError("stream closed")
        if self._feeding is None and len(data) <= _FEED_MIN:
            self.writer.write(data)
            self.writer.write(b"\n")
            await self.writer.drain()
            return
        # A big line, or any line sent while one is being fed: written in order,
        # behind it, by a task of its own, so a cancelled sender cannot leave
        # half a line on the stream.
        feed = asyncio.ensure_future(self._feed(self._feeding, data))
        self._feeding = feed
        feed.add_done_callback(self._fed)
        await asyncio.shield(feed)

    async def _feed(self, before: asyncio.Future[None] | None, data: Outbound) -> None:
        if before is not None:
            await asyncio.wait({before})  # its outcome is its own sender's
        writer = self.writer
        if writer.is_closing():
            raise ConnectionResetError("stream closed")
        if len(data) <= _FEED_MIN:
            writer.write(data)
        else:
            with memoryview(data) as view:
                for start in range(0, len(view), _FEED):
                    if writer.is_closing():
                        raise ConnectionResetError("stream closed")
                    writer.write(view[start : start + _FEED])
                    await writer.drain()
        writer.write(b"\n")
        await writer.drain()

    def _fed(self, feed: asyncio.Future[None]) -> None:
        if self._feeding is feed:
            self._feeding = None
        if not feed.cancelled():
            feed.exception()  # seen by its sender, if it still waits; no "never retrieved"

    async def aclose(self) -> None:
        if not self.writer.is_closing():
            self.writer.close()
        with contextlib.suppress(OSError, ConnectionError):
            await self.writer.wait_closed()


class MemoryTransport:
    """One end of an in-process pair (tests, embedding); line-framing error texts."""

    kind = "line"

    def __init__(
        self,
        inbound: asyncio.Queue[bytes | None],
        outbound: asyncio.Queue[bytes | None],
        *,
        label: str,
    ) -> None:
        self.label = label
        self._inbound = inbound
        self._outbound = outbound
        self.closed = False

    async def receive(self) -> Inbound:
        if self.closed:
            return None
        item = await self._inbound.get()
        if item is None:
            self.closed = True
        return item

    async def send(self, data: Outbound) -> None:
        if self.closed:
            raise ConnectionResetError("transport closed")
        await self._outbound.put(bytes(data) if isinstance(data, bytearray) else data)

    async def aclose(self) -> None:
        """Close both directions: the peer sees EOF, our reader stops."""
        if not self.closed:
            self.closed = True
            for queue in (self._outbound, self._inbound):
                with contextlib.suppress(asyncio.QueueFull):
                    queue.put_nowait(None)


def memory_pair(
    *, label: str = "memory", maxsize: int = 0
) -> tuple[MemoryTransport, MemoryTransport]:
    """Two connected in-process transports (unbounded unless ``maxsize``)."""
    a_to_b: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize)
    b_to_a: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize)
    return (
        MemoryTransport(b_to_a, a_to_b, label=f"{label} a"),
        MemoryTransport(a_to_b, b_to_a, label=f"{label} b"),
    )
