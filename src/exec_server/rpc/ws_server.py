"""A lean WebSocket server: websockets' sans-I/O protocol under an asyncio.BufferedProtocol.

Why not ``websockets.asyncio.server``: every message there crosses an
assembler, an async generator and an async send context; for our small
request/response and notification traffic that per-message overhead is a
large share of the server's CPU time. Here ``data_received`` feeds the
sans-I/O :class:`websockets.server.ServerProtocol`, completed messages go to a
deque read by :meth:`WsConnection.receive`, and :meth:`WsConnection.send`
writes the frame straight to the transport (awaiting only when the write
buffer is over its high-water mark: backpressure). :meth:`WsConnection.send_threadsafe`
lets a worker thread send a small reply itself when the socket takes it at
once (every write holds one lock, so frames never interleave).

Reads go into one receive area per connection (``BufferedProtocol``), an
anonymous mapping touched only as far as data lands in it: a plain
``Protocol`` gets a new 256 KiB ``bytes`` per read, which malloc maps, shrinks
and unmaps again (three system calls and a page fault for every request).
Whole frames are parsed straight from the area; only a partial frame is
copied aside.

Every HTTP request first meets :class:`~exec_server.rpc.http_gate.UpgradeGate`
(Origin refusal, ``/readyz``, paths, authentication). Behaviour kept from the
library: the rest of the HTTP upgrade (no subprotocol, no compression),
automatic Pong replies (only the latest ping's while the write buffer is
full, see :meth:`WsConnection._pong`), the closing handshake,
UTF-8 is *not* checked (the JSON decoder rejects bad text), and a frame
larger than ``frame_limit`` fails the connection with 1009 (the memory guard,
see ``rpc/transport.py``). Messages larger than ``max_message_size`` are
discarded fragment by fragment and reported as :class:`OversizedMessage`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import mmap
import os
import socket
import ssl as ssl_module
import struct
import threading
from collections.abc import Awaitable, Callable
from typing import Final

from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - the C extension is missing
    from websockets.utils import apply_mask

from exec_server.rpc.http_gate import UpgradeGate
from exec_server.rpc.transport import HEAD_SIZE, Inbound, Outbound, OversizedMessage, set_nodelay
from exec_server.rpc.ws_auth import Grant

__all__ = ["WsConnection", "WsServer", "serve_websocket"]

logger = logging.getLogger("exec_server.rpc")
#: the library's own handshake and frame messages ("connection open", "HTTP
#: response sent"): the gate already logs each upgrade once, so these show
#: only with ``--log-level debug``.
wire_logger = logging.getLogger("exec_server.rpc.wire")

#: inbound messages buffered before we stop reading the socket (PROTOCOL.md §14).
INBOUND_HIGH: Final = 128
INBOUND_LOW: Final = 32
WRITE_HIGH: Final = 1 << 20
OPEN_TIMEOUT: Final = 10.0
CLOSE_TIMEOUT: Final = 5.0
#: bytes read from the socket at most per read (asyncio's own read size).
RECV_AREA: Final = 256 * 1024

Handler = Callable[["WsConnection"], Awaitable[None]]

_HEADER16: Final = struct.Struct("!BBH")
_HEADER64: Final = struct.Struct("!BBQ")
#: payloads up to this size are joined with their header into one write.
_JOIN_LIMIT: Final = 1 << 16
#: payloads over this size are fed to the transport a piece at a time (see ``_pump``).
STREAM_MIN: Final = 4 << 20
#: bytes handed to the transport per piece of a fed payload.
_FEED: Final = 1 << 20


class WsConnection(asyncio.BufferedProtocol):
    """One accepted socket; a ``MessageTransport`` once the upgrade is done."""

    kind = "websocket"

    def __init__(self, server: WsServer) -> None:
        self._server = server
        self._proto = ServerProtocol(max_size=(None, server.frame_limit), logger=wire_logger)
        self._transport: asyncio.Transport | None = None
        self.label = "exec-server websocket"
        #: ``host:port`` of the peer, for the upgrade's log line.
        self.peer = "unknown peer"
        #: what the upgrade was accepted with (a JWT's expiry), set by the gate.
        self.grant = Grant()
        #: the close frame :meth:`aclose` sends (code, reason).
        self.close_with: tuple[int, str] = (1000, "")
        self.max_message_size = server.max_message_size
        self._inbound: collections.deque[bytes | bytearray | OversizedMessage] = (
            collections.deque()
        )
        self._waiter: asyncio.Future[None] | None = None
        self._paused_reading = False
        #: the latest ping's payload while the write buffer is full (see ``_pong``).
        self._pong_due: bytes | None = None
        #: ``_send_due_pong`` is scheduled.
        self._pong_pending = False
        self._drain: asyncio.Future[None] | None = None
        #: what senders see: the transport's buffer is full, or a big payload is being fed.
        self._write_paused = False
        #: the transport's own flow control (``pause_writing``/``resume_writing``).
        self._transport_paused = False
        #: the unsent rest of a big payload, fed to the transport as it drains.
        self._stream: memoryview | None = None
        #: frames written while a payload is being fed: they follow it, in order.
        self._backlog: collections.deque[tuple[Outbound, Outbound | None]] = (
            collections.deque()
        )
        #: the library's end of output (EOF or close) came while a payload was fed.
        self._end_pending = False
        #: :meth:`close` was called while a payload was fed.
        self._close_pending = False
        #: ``_resume_pump`` is scheduled.
        self._pump_pending = False
        self._eof = False
        self._lost = False
        self._task: asyncio.Task[None] | None = None
        #: optional consumer tried first for a message arriving while none is
        #: queued: returns True if it took the message (answered it at once).
        self.on_message: Callable[[bytes | bytearray | OversizedMessage], bool] | None = None
        #: frames held back by :meth:`cork` (written together by :meth:`uncork`).
        self._corked: list[Outbound] | None = None
        #: held by every write, from the loop or from :meth:`send_threadsafe`.
        self._wlock = threading.Lock()
        #: the socket's fd, for :meth:`send_threadsafe` (-1 before ``connection_made``).
        self._fd = -1
        #: the unsent end of a frame :meth:`send_threadsafe` wrote in part: goes first.
        self._tail: bytes | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        # message being assembled: its first fragment, then (from the second) a
        # bytearray that grows in place, not a list joined at the end (a second
        # copy of the whole message beside its parts: 85 MiB for a 64 MiB write).
        self._body: bytes | bytearray = b""
        self._size = 0
        self._head = b""
        #: where the socket is read into (made at the first read).
        self._area: memoryview | None = None
        # Fast path (see ``_receive_fast``): unparsed bytes, and whether it is on.
        self._rbuf = bytearray()
        self._fast = False
        self._fast_pending = False
        #: bytes of a fragmented message received so far (fast path), None between messages.
        self._frag_size: int | None = None

    @property
    def transport(self) -> asyncio.Transport | None:
        """The underlying socket transport (None before ``connection_made``)."""
        return self._transport

    # -- asyncio.BufferedProtocol -------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        sock = transport.get_extra_info("socket")
        set_nodelay(sock)
        if transport.get_extra_info("sslcontext") is None:  # raw bytes on the fd are the stream
            with contextlib.suppress(AttributeError, OSError):
                self._fd = sock.fileno()
        self._loop = asyncio.get_running_loop()
        transport.set_write_buffer_limits(high=WRITE_HIGH)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            host = f"[{peer[0]}]" if ":" in str(peer[0]) else str(peer[0])
            self.peer = f"{host}:{peer[1]}"
            self.label = f"exec-server websocket {self.peer}"
        self._server.connections.add(self)
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(OPEN_TIMEOUT, self._open_timeout)

    def get_buffer(self, sizehint: int) -> memoryview:
        area = self._area
        if area is None:
            area = self._area = memoryview(mmap.mmap(-1, RECV_AREA))
        return area

    @property
    def hangup_fd(self) -> int | None:
        """The socket's descriptor, which shows the peer's leaving (for a processor
        that stops reading, ``server/app.py``); None once closed."""
        return self._fd if self._fd >= 0 else None

    def buffer_updated(self, nbytes: int) -> None:
        assert self._area is not None
        self._received(self._area[:nbytes])

    def _received(self, chunk: memoryview) -> None:
        """Bytes read from the socket (a view of the receive area, valid until we return)."""
        if self._fast:
            data = self._receive_fast(chunk)
            if not data:
                return
        else:
            data = bytes(chunk)
        self._proto.receive_data(data)
        events = self._proto.events_received()
        self._flush()
        for event in events:
            if isinstance(event, Frame):
                self._on_frame(event)
            elif isinstance(event, Request):
                self._on_request(event)
        if self._fast_pending:
            # Only if nothing followed the upgrade request in this read: the
            # library must not hold part of a frame when we take over.
            self._fast_pending = False
            self._fast = self._proto.state is State.OPEN and data.endswith(b"\r\n\r\n")
        self._after_events()

    def eof_received(self) -> bool | None:
        self._proto.receive_eof()
        self._proto.events_received()
        self._flush()
        self._after_events()
        # True keeps asyncio from closing the socket at once: a frame still being
        # fed is finished first, then ``close`` (pending) ends the connection.
        return self._stream is not None

    def connection_lost(self, exc: Exception | None) -> None:
        with self._wlock:  # no thread is writing to the socket as asyncio closes it
            self._lost = True
            self._fd = -1
            self._stream = None
            self._backlog.clear()
            self._tail = None
            self._pong_due = None
        self._server.connections.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._set_eof()
        # What was read but never made a message: a frame cut by the reset (ours
        # or, once it parses, the library's) and the receive area. The
        # connection itself may live on until a full collection (its handler's
        # objects refer to it), so nothing big may hang off it.
        self._discarded(len(self._rbuf))
        self._rbuf = bytearray()
        self._area = None
        proto = self._proto
        if proto.state in (State.OPEN, State.CLOSING):
            proto.receive_eof()  # the library drops a partial frame it buffers...
            proto.events_received()
            proto.data_to_send()
            # ...but the error it records for it keeps its parser's frame, and
            # with it the last frame parsed (a fragment, or a whole message).
            proto.parser_exc = None
        # Waiting senders wake and raise a fresh error themselves: an exception
        # kept in the future would hold their frames (and the frame each was
        # sending, 85 MiB for a big reply) in a cycle through this connection.
        self._resolve_drain()

    def pause_writing(self) -> None:
        self._transport_paused = True
        self._write_paused = True

    def resume_writing(self) -> None:
        self._transport_paused = False
        if self._stream is not None:
            # Fed from the next callback, not from inside this one: asyncio (3.11)
            # calls this from its write-ready handler, and if a write made here
            # fails, that handler and the failure both end the connection
            # (``connection_lost`` twice; the second call's error was logged and
            # kept the failed write's frames, with the payload, alive).
            if not self._pump_pending and self._loop is not None:
                self._pump_pending = True
                self._loop.call_soon(self._resume_pump)
            return  # still feeding: senders keep waiting
        self._write_paused = False
        self._resolve_drain()
        self._pong_when_writable()

    def _resume_pump(self) -> None:
        self._pump_pending = False
        if self._stream is None or self._lost or self._transport_paused:
            return
        with self._wlock:
            self._pump()
        if self._stream is None:
            self._after_pump()

    def _resolve_drain(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def _pong_when_writable(self) -> None:
        """The write buffer has room again: send the pong that waited for it, if any.

        From a callback of its own, as ``_resume_pump`` (a write made inside
        ``resume_writing`` that fails ends the connection twice).
        """
        if self._pong_due is not None and not self._pong_pending and self._loop is not None:
            self._pong_pending = True
            self._loop.call_soon(self._send_due_pong)

    def _send_due_pong(self) -> None:
        self._pong_pending = False
        payload = self._pong_due
        if payload is None or self._write_paused:
            return
        self._pong_due = None
        if self._proto.state is State.OPEN:  # nothing may follow our close frame
            self._pong(payload)

    # -- handshake -----------------------------------------------------------

    def _on_request(self, request: Request) -> None:
        decision = self._server.gate.decide(request, self.peer)
        if isinstance(decision, Grant):
            self.grant = decision
            response = self._proto.accept(request)
        else:
            response = decision
        self._proto.send_response(response)
        self._flush()
        if self._proto.state is not State.OPEN:
            if isinstance(decision, Grant):  # the library refused the handshake itself
                logger.info("upgrade from %s refused: %s", self.peer, self._proto.handshake_exc)
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._fast_pending = True
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        task = self._task
        assert task is not None
        self._server.tasks.add(task)
        try:
            await self._server.handler(self)
        except Exception:
            logger.exception("%s: connection handler failed", self.label)
        finally:
            self._server.tasks.discard(task)
            self._inbound.clear()  # nobody reads them any more
            await self.aclose()

    def _open_timeout(self) -> None:
        self._timer = None
        if self._proto.state is State.CONNECTING and self._transport is not None:
            self._transport.abort()

    # -- inbound -------------------------------------------------------------

    def _on_frame(self, frame: Frame) -> None:
        opcode = frame.opcode
        if self._eof:
            return  # after a close frame or a failure: no message can complete
        if opcode in (Opcode.TEXT, Opcode.BINARY):
            self._body = b""
            self._size = 0
            self._head = b""
        elif opcode is Opcode.CLOSE:
            # The protocol answers it; for us the message stream ends here,
            # before the TCP close (so a quick reconnect finds us detached).
            self._set_eof()
            return
        elif opcode is not Opcode.CONT:
            return  # ping/pong are answered by the protocol
        data = bytes(frame.data)
        self._size += len(data)
        body = self._body
        if self._size > self.max_message_size:
            if not self._head:
                self._head = (bytes(body[:HEAD_SIZE]) + data[:HEAD_SIZE])[:HEAD_SIZE]
                self._body = b""
        elif not body:
            self._body = data
        elif isinstance(body, bytearray):
            body += data
        else:
            self._body = bytearray(body)
            self._body += data
        if not frame.fin:
            return
        if self._size > self.max_message_size:
            item: bytes | bytearray | OversizedMessage = OversizedMessage(
                self._size, self.max_message_size, self._head
            )
        else:
            item = self._body
        self._body = b""
        self._message(item)

    def _message(self, item: bytes | bytearray | OversizedMessage) -> None:
        """A complete inbound message: offered to ``on_message``, else queued."""
        if self._eof:
            return  # the stream has ended (our close, or the handler is gone): nobody reads it
        hook = self.on_message
        if hook is not None and not self._inbound and hook(item):
            return
        self._inbound.append(item)
        if len(self._inbound) >= INBOUND_HIGH and not self._paused_reading:
            self._paused_reading = True
            assert self._transport is not None
            self._transport.pause_reading()
        self._wake()

    def _receive_fast(self, chunk: memoryview) -> bytes:
        """Parse data frames (whole or fragmented) and pings here; return what the library gets.

        The sans-I/O parser costs tens of microseconds per frame and copies
        big payloads several times; almost every client frame is a masked data
        frame, decoded here in a few microseconds with one unmasking copy.
        Anything else (a close frame, reserved bits, an unmasked, oversized or
        out-of-order frame) and everything after it goes to the library for
        good, at a frame boundary and with its fragmentation state
        (``current_size``) brought up to date, so its checks and errors apply
        unchanged.
        """
        kept = self._rbuf
        buf: bytearray | memoryview
        if kept:
            kept += chunk
            buf = kept
        else:
            buf = chunk  # parsed in place; a partial frame at the end is kept
        pos = 0
        end = len(buf)
        limit = self._server.frame_limit
        while end - pos >= 2:
            b0 = buf[pos]
            b1 = buf[pos + 1]
            opcode = b0 & 0x0F
            fin = b0 & 0x80
            if b0 & 0x70 or not b1 & 0x80:
                break  # reserved bits / unmasked: the library fails the connection
            if opcode == 0:
                if self._frag_size is None:
                    break  # continuation without a message: the library's error
            elif opcode in (1, 2):
                if self._frag_size is not None:
                    break  # new message inside a fragmented one: the library's error
            elif opcode != 9 or not fin:
                break  # close, pong, reserved or fragmented control frames
            size = b1 & 0x7F
            start = pos + 2
            if size == 126:
                if end - start < 2:
                    return self._keep(buf, pos)
                size = int.from_bytes(buf[start : start + 2], "big")
                start += 2
            elif size == 127:
                if end - start < 8:
                    return self._keep(buf, pos)
                size = int.from_bytes(buf[start : start + 8], "big")
                start += 8
            if size > limit or (opcode == 9 and size > 125):
                break
            if end - start - 4 < size:
                return self._keep(buf, pos)
            mask = bytes(buf[start : start + 4])
            start += 4
            view = memoryview(buf)
            try:
                payload = apply_mask(view[start : start + size], mask)
            finally:
                view.release()
            pos = start + size
            if opcode == 9:
                self._pong(payload)
                continue
            if fin and opcode and size <= self.max_message_size:
                # A whole message in one frame (nearly every client message): no
                # Frame object, no fragment bookkeeping.
                self._message(payload)
                if self._eof or self._lost:
                    break
                continue
            if opcode:
                frame = Frame(Opcode.TEXT if opcode == 1 else Opcode.BINARY, payload, fin=bool(fin))
            else:
                frame = Frame(Opcode.CONT, payload, fin=bool(fin))
            self._frag_size = None if fin else (self._frag_size or 0) + size
            self._on_frame(frame)
            if self._eof or self._lost:
                break
        else:
            return self._keep(buf, pos)
        # Hand the rest (from a frame boundary) to the library from now on.
        self._fast = False
        self._proto.current_size = self._frag_size
        rest = bytes(buf[pos:])
        kept.clear()
        return rest

    def _pong(self, payload: bytes) -> None:
        """Answer a ping as the library would (server frames are unmasked).

        While the write buffer is full only the latest ping is remembered and
        answered once there is room (RFC 6455 §5.5.3 allows answering just the
        most recent one): a client pinging without reading used to have every
        pong kept (3 M unread pongs held 390 MB). Reading goes on, as it does
        while replies to requests wait (until 128 messages are queued): a
        client that writes before it reads must not be stalled by its own
        keepalive pings, and ignored pings cost only their parsing.
        """
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if self._write_paused:
            self._pong_due = payload
            return
        self._pong_due = None  # this one answers any earlier ping still due
        self._write(bytes((0x8A, len(payload))) + payload)

    def _keep(self, buf: bytearray | memoryview, pos: int) -> bytes:
        """Keep the unparsed end of ``buf`` (a partial frame) for the next read."""
        if buf is self._rbuf:
            if pos:
                del buf[:pos]
        elif pos < len(buf):
            self._rbuf += buf[pos:]
        return b""

    def _after_events(self) -> None:
        state = self._proto.state
        if state is State.CLOSED:
            self._set_eof()
            self.close()  # after a frame still being fed, as after one the transport holds
            return
        if state is State.CLOSING:
            self._set_eof()  # closing handshake (or a protocol failure): no more messages
        if self._proto.close_expected() and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(CLOSE_TIMEOUT, self._abort)

    def _abort(self) -> None:
        self._timer = None
        if self._transport is not None:
            self._transport.abort()

    def _set_eof(self) -> None:
        """No more messages: a close frame, a failure, or the end of the connection.

        A message still being gathered can never complete now; it is let go at
        once (a client that sent 35 MiB of fragments and left used to leave
        them mapped until a full garbage collection happened to run).
        """
        self._eof = True
        self._discarded(len(self._body))
        self._body = b""
        self._head = b""
        self._size = 0
        self._wake()

    def _discarded(self, size: int) -> None:
        """``size`` bytes of an unfinished message were let go: tell ``on_discard``."""
        hook = self._server.on_discard
        if size and hook is not None:
            hook(size)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def receive(self) -> Inbound:
        """Next message (bytes), an :class:`OversizedMessage`, or None at EOF."""
        while not self._inbound:
            if self._eof:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self._inbound.popleft()
        if self._paused_reading and len(self._inbound) <= INBOUND_LOW:
            self._paused_reading = False
            if self._transport is not None and not self._transport.is_closing():
                self._transport.resume_reading()
        return item

    # -- outbound ------------------------------------------------------------

    def _flush(self) -> None:
        transport = self._transport
        if transport is None or self._lost:
            self._proto.data_to_send()  # discard
            return
        for data in self._proto.data_to_send():
            if data[:1] == b"\x8a" and len(data) <= 127:
                self._pong(data[2:])  # the library's pong (one frame per item): as ours
            elif data:
                self._write(data)
            elif self._stream is not None:
                self._end_pending = True  # after the payload being fed and what follows it
            else:
                self._end_output()

    def _end_output(self) -> None:
        """The library's end of output: half-close, or close where that is impossible."""
        transport = self._transport
        if transport is None or self._lost:
            return
        if transport.can_write_eof():
            self._flush_tail()
            with self._wlock, contextlib.suppress(Exception):
                transport.write_eof()
        else:
            transport.close()

    @property
    def send_ready(self) -> bool:
        """Whether :meth:`send_nowait` would send now (the write buffer has room)."""
        return not self._write_paused and not self._lost

    def send_nowait(self, data: Outbound) -> bool:
        """Send one Text frame unless the write buffer is full (then False, nothing sent).

        Lets a producer send from a callback, without a task, while the
        client keeps up.

        Raises:
            ConnectionResetError: the connection is closing or gone.
        """
        if self._write_paused:
            return False
        self._write_frame(data)
        return True

    async def send(self, data: Outbound) -> None:
        """Send one Text frame; waits while the write buffer is full.

        Raises:
            ConnectionResetError: the connection is closing or gone.
        """
        self._write_frame(data)
        if self._write_paused:
            if self._drain is None or self._drain.done():
                self._drain = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._drain)
            if self._lost:
                raise ConnectionResetError("connection lost")

    def _write_frame(self, data: Outbound) -> None:
        transport = self._transport
        if (
            self._proto.state is not State.OPEN
            or transport is None
            or self._lost
            or transport.is_closing()
        ):
            raise ConnectionResetError("websocket is closed")
        # Server frames are unmasked and we negotiate no extension, so the
        # frame is a fixed header plus the payload: written directly, without
        # the library's serialisation copies (replies can be hundreds of MiB).
        size = len(data)
        if size < 126:
            header = bytes((0x81, size))
        elif size < 0x10000:
            header = _HEADER16.pack(0x81, 126, size)
        else:
            header = _HEADER64.pack(0x81, 127, size)
        corked = self._corked
        if corked is not None and size <= _JOIN_LIMIT:
            corked.append(header)
            corked.append(data)
            return
        if corked:
            self.uncork()
            self._corked = []
        if size <= _JOIN_LIMIT:
            self._write(header + data)
        else:
            self._write(header, data)

    def _write(self, data: Outbound, more: Outbound | None = None) -> None:
        """Every write from the loop: under the lock, after a thread's unsent tail
        and after any payload still being fed (``more``: a big payload after ``data``)."""
        transport = self._transport
        assert transport is not None
        with self._wlock:
            tail = self._tail
            if tail is not None:
                self._tail = None
                transport.write(tail)
            if self._stream is not None:
                self._backlog.append((data, more))
                return
            transport.write(data)
            if more is None or not self._hand_over(more):
                return
            self._pump()
        if self._stream is None:
            self._after_pump()

    def _hand_over(self, more: Outbound) -> bool:
        """Write the big payload that follows a header: to the transport at once,
        or (over ``STREAM_MIN``) as the payload to feed; True then. Under the lock."""
        if len(more) <= STREAM_MIN:
            # A view: what the socket does not take at once is copied into the
            # transport's buffer once; a ``bytes`` payload would first be sliced
            # (a second copy of the rest).
            assert self._transport is not None
            self._transport.write(memoryview(more))
            return False
        self._stream = memoryview(more)
        self._write_paused = True
        return True

    def _pump(self) -> None:
        """Feed the payload being streamed, then the frames behind it, while the
        transport has room (``resume_writing`` calls again). Under the lock.

        Why: asyncio's socket transport copies whatever the socket does not
        take at once into its own buffer. A 64 MiB ``fs/readFile`` reply is
        85 MiB, so the reply and that copy of it were held together; fed a
        megabyte at a time, the transport holds two at most.
        """
        transport = self._transport
        assert transport is not None
        while True:
            view = self._stream
            while view is not None:
                if self._transport_paused:
                    return
                if transport.is_closing():
                    self._stream = None
                    self._backlog.clear()
                    return
                # Set before writing: the write may call pause_writing.
                self._stream = view[_FEED:] if len(view) > _FEED else None
                transport.write(view[:_FEED])
                view = self._stream
            if not self._backlog:
                return
            data, more = self._backlog.popleft()
            transport.write(data)
            if more is not None:
                self._hand_over(more)

    def _after_pump(self) -> None:
        """The fed payloads and their backlog are written: senders may go on."""
        if self._end_pending:
            self._end_pending = False
            self._end_output()
        if self._close_pending:
            self._close_pending = False
            if self._transport is not None:
                self._transport.close()
        self._write_paused = self._transport_paused
        if not self._write_paused:
            self._resolve_drain()
            self._pong_when_writable()

    def _flush_tail(self) -> None:
        transport = self._transport
        with self._wlock:
            tail = self._tail
            self._tail = None
            if tail is not None and transport is not None and not self._lost:
                transport.write(tail)

    def send_threadsafe(
        self, data: Outbound, on_commit: Callable[[], None] | None = None
    ) -> bool:
        """From any thread: send one small Text frame now, ahead of anything the loop writes later.

        Returns False, having done nothing, when the connection is closing,
        the write buffer holds data or the frame is big: the caller sends
        through the loop instead. Otherwise the frame is committed: written
        now, its unsent end (a full socket) written by the loop before any
        other write, or dropped with a connection that is failing anyway.
        ``on_commit`` runs under the write lock just before the frame is
        written, so nothing the loop sends afterwards can overtake it.
        """
        size = len(data)
        if size >= _JOIN_LIMIT:
            return False
        frame = (bytes((0x81, size)) if size < 126 else _HEADER16.pack(0x81, 126, size)) + data
        with self._wlock:
            transport = self._transport
            if (
                self._fd < 0
                or transport is None
                or self._lost
                or self._write_paused
                or self._stream is not None
                or self._tail is not None
                or self._proto.state is not State.OPEN
                or transport.is_closing()
                or transport.get_write_buffer_size()
            ):
                return False
            if on_commit is not None:
                on_commit()
            try:
                sent = os.write(self._fd, frame)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                return True  # the connection is failing: the loop sees it lost
            if sent == len(frame):
                return True
            self._tail = frame[sent:]
        loop = self._loop
        assert loop is not None
        with contextlib.suppress(RuntimeError):  # the loop is gone: so is the connection
            loop.call_soon_threadsafe(self._flush_tail)
        return True

    def cork(self) -> None:
        """Hold small frames back until :meth:`uncork`, to write them in one send.

        A request answered at once often produces a notification and its
        reply together (a terminal's echo, then the ``process/write`` reply):
        one ``send`` and one TCP segment instead of two, so the peer wakes once.
        """
        if self._corked is None:
            self._corked = []

    def uncork(self) -> None:
        """Write what :meth:`cork` held back (one ``send``) and stop holding."""
        parts = self._corked
        self._corked = None
        if not parts:
            return
        transport = self._transport
        if transport is None or self._lost or transport.is_closing():
            return
        self._write(parts[0] + parts[1] if len(parts) == 2 else b"".join(parts))

    def close(self) -> None:
        """Close the socket once everything written so far is sent, as the
        transport's own ``close`` does, including the rest of a frame still
        being fed (which the transport has not seen yet)."""
        if self._transport is None:
            return
        if self._stream is not None:
            self._close_pending = True
        else:
            self._transport.close()

    def going_away(self) -> None:
        """Server shutdown: a close frame (1001 going away) ahead of the socket's
        close, so clients learn the connection ended on purpose (RFC 6455 §7.4.1)
        instead of seeing it drop without one. The peer's answer is not awaited."""
        if not self._lost and self._proto.state is State.OPEN:
            self._proto.send_close(1001, "server shutting down")
            self._flush()
            self._set_eof()
        self.close()

    async def aclose(self) -> None:
        """Start the closing handshake (1000); the socket closes when it completes."""
        if self._lost:
            return
        if self._proto.state is State.OPEN:
            self._proto.send_close(*self.close_with)
            self._flush()
            self._after_events()
        elif self._transport is not None and self._proto.state is State.CONNECTING:
            self._transport.close()


class WsServer:
    """The listening sockets plus every live connection."""

    def __init__(
        self,
        handler: Handler,
        *,
        max_message_size: int,
        frame_limit: int,
        on_discard: Callable[[int], None] | None = None,
        gate: UpgradeGate | None = None,
    ) -> None:
        self.handler = handler
        #: decides each HTTP request before the upgrade (Origin, path, auth).
        self.gate = gate if gate is not None else UpgradeGate()
        self.max_message_size = max_message_size
        self.frame_limit = frame_limit
        #: called on the loop with the size of a message (or frame) dropped unfinished.
        self.on_discard = on_discard
        self.connections: set[WsConnection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.server: asyncio.Server | None = None

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        """The listening sockets (``getsockname()`` gives the bound address)."""
        return tuple(self.server.sockets) if self.server is not None else ()

    def close(self, close_connections: bool = True) -> None:
        """Stop accepting and, by default, close every connection (each gets a
        1001 close frame; handlers see EOF).

        (Same signature as ``websockets.asyncio.server.Server.close``.)
        """
        if self.server is not None:
            self.server.close()
        if not close_connections:
            return
        for conn in list(self.connections):
            conn.going_away()

    async def wait_closed(self) -> None:
        """Wait for every connection handler to finish."""
        if self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)
        if self.server is not None:
            await self.server.wait_closed()


async def serve_websocket(
    handler: Handler,
    host: str,
    port: int,
    *,
    max_message_size: int,
    frame_limit: int | None = None,
    on_discard: Callable[[int], None] | None = None,
    gate: UpgradeGate | None = None,
    ssl: ssl_module.SSLContext | None = None,
) -> WsServer:
    """Listen on ``host:port``; ``handler(conn)`` runs once per upgraded connection.

    Args:
        max_message_size: a bigger message is discarded as it arrives and
            reported as :class:`OversizedMessage`; the connection stays.
        frame_limit: a single frame bigger than this fails the connection with
            1009 (a frame is buffered whole before it is parsed). Default
            ``2 * max_message_size + 1 MiB``: the slack keeps a small limit from
            closing connections for the 1 MiB fragments clients commonly send.
        on_discard: called on the loop with the bytes of a message a client
            left unfinished (it disconnected or closed in the middle), once they
            are let go: big freed blocks may stay resident until the heap is
            trimmed (``server/heap.py``'s ``note_transfer`` fits).
        gate: what every HTTP request meets before the upgrade (default:
            refuse Origin, no authentication).
        ssl: serve TLS (``wss://``) with this context.
    """
    server = WsServer(
        handler,
        max_message_size=max_message_size,
        frame_limit=frame_limit if frame_limit is not None else 2 * max_message_size + (1 << 20),
        on_discard=on_discard,
        gate=gate,
    )
    loop = asyncio.get_running_loop()
    server.server = await loop.create_server(lambda: WsConnection(server), host, port, ssl=ssl)
    return server
