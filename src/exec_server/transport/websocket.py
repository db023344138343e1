"""The WebSocket listener (``websockets.asyncio.server.serve`` behind our
:class:`~exec_server.transport.http_gate.UpgradeGate`) and :class:`WebSocketTransport`.

No compression (upstream negotiates none), no server pings, TCP_NODELAY. No
message size limit in the library but a *frame* limit (it buffers a frame
whole): an oversized message is discarded fragment by fragment and answered
with a JSON-RPC error, a frame over the limit closes with 1009.
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

__all__ = ["WRITE_LIMIT", "WebSocketTransport", "serve_websocket"]

logger = logging.getLogger("exec_server.transport")
#: the library's own messages: its debug lines quote every frame (file contents,
#: tokens), which must never reach a log.
wire_logger = logging.getLogger("exec_server.transport.wire")
wire_logger.setLevel(logging.WARNING)

#: bytes the socket's write buffer holds before senders wait (backpressure).
WRITE_LIMIT: Final = 1 << 20
#: seconds a closing handshake may take before the connection is aborted.
CLOSE_TIMEOUT: Final = 2.0

Handler = Callable[["WebSocketTransport"], Awaitable[None]]


def _set_nodelay(sock: socket.socket | None) -> None:
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class WebSocketTransport:
    """A message over :data:`FEED_MIN` is sent in :data:`FEED` fragments (no framed copy
    of all of it); Text and Binary frames are accepted, UTF-8 unchecked (the JSON
    decoder answers bad text)."""

    kind = "websocket"

    def __init__(
        self, ws: Connection, *, label: str, max_message_size: int, grant: Grant | None = None
    ) -> None:
        self.ws = ws
        self.label = label
        self.max_message_size = max_message_size
        self.grant = grant if grant is not None else Grant()
        self._close_with: tuple[int, str] = (1000, "")

    @property
    def hangup_fd(self) -> int | None:
        sock = self.ws.transport.get_extra_info("socket")
        fd = sock.fileno() if sock is not None else -1
        return fd if fd >= 0 else None

    async def receive(self) -> Inbound:
        limit = self.max_message_size
        # From the second fragment, a bytearray grown in place (a join holds it twice).
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
        """Close with 1008 (policy violation) and ``reason`` (PROTOCOL.md §3.5), cut to
        the 123 UTF-8 bytes a close frame holds."""
        self._close_with = (1008, reason.encode(errors="replace")[:123].decode(errors="ignore"))

    async def aclose(self) -> None:
        """Closing handshake; aborted after :data:`CLOSE_TIMEOUT` (a peer that does
        not read leaves the close frame stuck behind a full write buffer)."""
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT):
                await self.ws.close(*self._close_with)
        except TimeoutError:
            self.ws.transport.abort()


class _BoundedConnection(ServerConnection):
    """Stops reading while its write buffer is full: else a client that pings without
    reading the Pongs grows the buffer without bound. The library pauses reading for
    its own reason too (its queue is full): reading resumes once neither holds."""

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
    handler: Handler, host: str, port: int, *, max_message_size: int,
    gate: UpgradeGate | None = None, ssl: ssl_module.SSLContext | None = None,
) -> Server:
    """``handler(transport)`` runs once per upgraded connection; the caller closes the
    server. A frame over ``2 * max_message_size + 1 MiB`` closes with 1009 (the slack
    keeps a small limit from refusing the 1 MiB fragments clients send)."""
    upgrade_gate = gate if gate is not None else UpgradeGate()
    limit = 2 * max_message_size + (1 << 20)

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
