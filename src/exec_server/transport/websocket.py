"""The WebSocket listener: ``websockets.asyncio.server.serve`` with our upgrade gate,
and :class:`WebSocketTransport`, the adapter each upgraded connection is served through.

The library owns the wire: the HTTP upgrade, framing, Pong replies, the
closing handshake, and closing every connection when the server closes. Every
HTTP request first meets :class:`~exec_server.transport.http_gate.UpgradeGate` as the
library's ``process_request`` hook (Origin refusal, ``/readyz``, paths,
authentication). Each upgraded connection is handed to the handler as a
:class:`WebSocketTransport`.

Settings, and why: no compression (upstream negotiates none, and it would
cost CPU and copies on every message); no server pings (clients ping if they
want to); TCP_NODELAY on accepted sockets (small request/response messages);
no message size limit in the library but a *frame* limit, so an oversized
message is discarded by the transport fragment by fragment (reported as
:class:`~exec_server.transport.base.OversizedMessage`, answered with a JSON-RPC
error) while a single frame over the frame limit closes the connection with
1009: the library buffers a frame whole, so that is the memory guard.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import ssl as ssl_module
from collections.abc import Awaitable, Callable
from typing import Final

from websockets.asyncio.connection import Connection
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from exec_server.transport.base import (
    FEED,
    FEED_MIN,
    HEAD_SIZE,
    Inbound,
    Outbound,
    OversizedMessage,
)
from exec_server.transport.http_gate import UpgradeGate
from exec_server.transport.ws_auth import Grant

__all__ = [
    "WRITE_LIMIT",
    "WebSocketTransport",
    "serve_websocket",
]

logger = logging.getLogger("exec_server.transport")
#: the library's own handshake and frame messages. Its debug lines quote every
#: frame, i.e. file contents, environments and tokens, which must never reach a
#: log: only its warnings and errors pass (the gate logs each upgrade once).
wire_logger = logging.getLogger("exec_server.transport.wire")
wire_logger.setLevel(logging.WARNING)

#: bytes the socket's write buffer holds before senders wait (backpressure).
WRITE_LIMIT: Final = 1 << 20
#: seconds a closing handshake may take before the connection is aborted.
CLOSE_TIMEOUT: Final = 2.0

Handler = Callable[["WebSocketTransport"], Awaitable[None]]


def _set_nodelay(sock: socket.socket | None) -> None:
    """Disable Nagle on a TCP socket (small request/response messages)."""
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _close_reason(text: str) -> str:
    """``text`` cut to the 123 UTF-8 bytes a close frame's reason holds, on a
    character boundary."""
    return text.encode(errors="replace")[:123].decode(errors="ignore")


class WebSocketTransport:
    """Adapter over a websockets asyncio connection.

    Sends Text frames (a message over :data:`FEED_MIN` as a fragmented message
    of :data:`FEED` pieces, so the library never holds a framed copy of all
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
        self._close_with: tuple[int, str] = (1000, "")

    @property
    def hangup_fd(self) -> int | None:
        """The socket's descriptor, which shows the peer leaving while nobody reads;
        None once it is closed."""
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
            if len(data) <= FEED_MIN:
                await self.ws.send(data, text=True)
            else:
                view = memoryview(data)
                pieces = (view[i : i + FEED] for i in range(0, len(view), FEED))
                await self.ws.send(pieces, text=True)
        except ConnectionClosed as exc:
            raise ConnectionResetError(str(exc)) from exc

    def refuse(self, reason: str) -> None:
        """Close with 1008 (policy violation) and ``reason`` instead of a normal
        closure: the peer broke the JSON-RPC protocol (PROTOCOL.md §3.5) and learns
        how. ``reason`` is cut to the 123 bytes a close frame holds."""
        self._close_with = (1008, _close_reason(reason))

    async def aclose(self) -> None:
        """Closing handshake (1000, or what :meth:`refuse` set); the TCP connection
        is aborted if it has not ended after :data:`CLOSE_TIMEOUT` (a peer that
        does not read leaves the close frame stuck behind a full write buffer)."""
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT):
                await self.ws.close(*self._close_with)
        except TimeoutError:
            self.ws.transport.abort()



class _BoundedConnection(ServerConnection):
    """A connection that stops reading while its write buffer is full.

    The library answers every ping at once and writes whatever the buffer
    holds, so a client that pings (or sends requests) without reading the
    answers would grow the server's write buffer without bound: 300,000 pings
    kept ~35 MiB. Reading pauses instead until the buffer drains, and TCP holds
    the client back. The library pauses reading for its own reason too (its
    queue of received messages is full): reading resumes only once neither
    reason holds.
    """

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._holds: set[str] = set()
        self.recv_messages.pause = functools.partial(self._hold, "queue")
        self.recv_messages.resume = functools.partial(self._release, "queue")

    def pause_writing(self) -> None:
        super().pause_writing()
        self._hold("write")

    def resume_writing(self) -> None:
        super().resume_writing()
        self._release("write")

    def _hold(self, reason: str) -> None:
        if not self._holds and not self.transport.is_closing():
            self.transport.pause_reading()
        self._holds.add(reason)

    def _release(self, reason: str) -> None:
        if reason not in self._holds:
            return
        self._holds.discard(reason)
        if not self._holds and not self.transport.is_closing():
            self.transport.resume_reading()


def _label(ws: ServerConnection) -> str:
    peer = ws.remote_address
    if isinstance(peer, tuple) and len(peer) >= 2:
        host = f"[{peer[0]}]" if ":" in str(peer[0]) else str(peer[0])
        return f"exec-server websocket {host}:{peer[1]}"
    return "exec-server websocket"


async def serve_websocket(
    handler: Handler,
    host: str,
    port: int,
    *,
    max_message_size: int,
    frame_limit: int | None = None,
    gate: UpgradeGate | None = None,
    ssl: ssl_module.SSLContext | None = None,
) -> Server:
    """Listen on ``host:port``; ``handler(transport)`` runs once per upgraded connection.

    The caller closes the returned server (``close()`` closes every connection
    with 1001, ``wait_closed()`` waits for the handlers); a peer that does not
    complete a closing handshake is cut off after :data:`CLOSE_TIMEOUT`.

    Args:
        max_message_size: a bigger message is discarded as it arrives and
            reported as :class:`~exec_server.transport.base.OversizedMessage`;
            the connection stays.
        frame_limit: a single frame bigger than this fails the connection with
            1009 (the library buffers a frame whole). Default
            ``2 * max_message_size + 1 MiB``: the slack keeps a small limit from
            closing connections for the 1 MiB fragments clients commonly send.
        gate: what every HTTP request meets before the upgrade (default:
            refuse Origin, no authentication).
        ssl: serve TLS (``wss://``) with this context.
    """
    upgrade_gate = gate if gate is not None else UpgradeGate()
    limit = frame_limit if frame_limit is not None else 2 * max_message_size + (1 << 20)

    async def connection(ws: ServerConnection) -> None:
        _set_nodelay(ws.transport.get_extra_info("socket"))
        grant = getattr(ws, "grant", None)  # set by the gate
        transport = WebSocketTransport(
            ws,
            label=_label(ws),
            max_message_size=max_message_size,
            grant=grant if isinstance(grant, Grant) else None,
        )
        try:
            await handler(transport)
        except Exception:
            logger.exception("%s: connection handler failed", transport.label)
        finally:
            await transport.aclose()

    return await serve(
        connection,
        host,
        port,
        ssl=ssl,
        process_request=upgrade_gate.process_request,
        create_connection=_BoundedConnection,
        server_header=None,
        compression=None,
        ping_interval=None,
        close_timeout=CLOSE_TIMEOUT,
        max_size=(None, limit),
        write_limit=WRITE_LIMIT,
        logger=wire_logger,
    )
