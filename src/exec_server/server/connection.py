"""One connection: reader, in-order dispatch raced against disconnect, close.

:class:`ConnectionProcessor` drives one connection (PROTOCOL.md §2.7, §3.5,
§4). Its read loop takes messages in arrival order and, for ordinary
requests, runs the handler inline and sends the answer before reading the
next message - the reference behaviour, which keeps a pipelined
``process/start`` + ``process/write`` ordered and costs no task or queue hop
per request. Routes marked ``may_block`` (the long-poll ``process/read``) run
in their own task; the loop waits until the handler calls ``ctx.unblock()``
(after its ordered part) or finishes, then reads on while it waits, and its
answer is sent whenever it is ready (answers are matched by id).
``initialize`` and ``initialized`` are always handled inline, so their
ordering holds.

EOF (or a protocol violation that closes: unexpected notifications, client
responses, eviction) cancels in-flight handlers at once, then detaches the
session: processes keep running for the detach TTL (§2.7, §4.6). While a
message is being handled the read loop does not read, so it would not see
EOF; a request still in progress after :data:`READ_AHEAD_AFTER` (a
``process/write`` waiting for a child that does not read its stdin, a worker
job stuck on a FIFO) has the transport read on by a task of its own: later
messages are kept in order for the loop (up to :data:`READ_AHEAD_MESSAGES` /
:data:`READ_AHEAD_BYTES`, then reading waits as before), and EOF cancels the
request and closes. Server shutdown closes every connection the same way
(:meth:`~exec_server.server.app.ExecServer.close_connections`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import select
from collections import deque
from typing import Any, Final

import msgspec

from exec_server.exceptions import ErrorCode, ProtocolClosedError
from exec_server.protocol.codec import ProtocolError, decode_message, encode_error
from exec_server.protocol.codec import encode_notification as _encode_notification
from exec_server.protocol.handshake import malformed_message_text
from exec_server.protocol.messages import (
    MALFORMED_ID,
    ErrorResponse,
    Notification,
    Request,
    RequestId,
    Response,
)
from exec_server.server.router import RequestContext, Router
from exec_server.server.services import ServerServices
from exec_server.server.session import Attachment, SessionRegistry
from exec_server.transport.base import Inbound, MessageTransport, Outbound, OversizedMessage

__all__ = ["ConnectionProcessor"]

logger = logging.getLogger("exec_server.server")

#: A message over this size is let go as soon as it is handled, not kept until the
#: next one arrives. Smaller ones are kept: freed, their memory went back to the
#: system and the next message faulted it in again (~0.8 ms per 1 MiB write);
#: above glibc's largest mmap threshold every message gets fresh pages anyway.
KEEP_MESSAGE_MAX: Final = 32 << 20
#: Messages from this size on are decoded in a worker thread: walking one takes
#: ~0.25 ms per MiB, which the event loop would spend unable to answer anyone.
DECODE_OFF_LOOP: Final = 4 << 20
#: Seconds one message may keep the read loop busy before the transport is read
#: ahead (to notice EOF, §2.7). Most requests take far less; checking costs one
#: timer per busy connection per period, not one per request.
READ_AHEAD_AFTER: Final = 0.1
#: Messages read ahead at most while a request is in progress; then reading
#: waits, and the transport's own bound applies (128 messages on a WebSocket),
#: while the connection's descriptor is watched for the peer leaving
#: (``ConnectionProcessor._watch_hangup``; Linux).
READ_AHEAD_MESSAGES: Final = 4096
#: Bytes read ahead at most (the message that crosses it is still taken).
READ_AHEAD_BYTES: Final = 64 << 20
#: ``{"id": <integer or string>`` at the start of a message (JSON whitespace
#: only), the value ending where the member does: ``1.5``, ``7e3``, ``2.0`` are
#: no ids, not ``1``, ``7``, ``2`` (``_sniff_id``). Possessive, so a failed
#: match does not backtrack into the value.
_ID_PREFIX: Final = re.compile(
    rb'^[ \t\n\r]*\{[ \t\n\r]*"id"[ \t\n\r]*:[ \t\n\r]*'
    rb'(-?[0-9]++|"[^"\\]*+(?:\\.[^"\\]*+)*+")'
    rb"[ \t\n\r]*[,}]"
)


def _sniff_id(head: bytes) -> RequestId:
    """The id of a message we refuse to parse, if it comes first; else -1."""
    match = _ID_PREFIX.match(head)
    if match is None:
        return MALFORMED_ID
    try:
        value: RequestId = msgspec.json.decode(match.group(1), type=RequestId)
    except msgspec.DecodeError:
        return MALFORMED_ID
    return value


async def _not_delivered(method: str, params: msgspec.Struct) -> bool:
    """The sink of a closed connection's attachment: nothing reaches a client."""
    del method, params
    return False


def _inbound_size(item: bytes | bytearray | OversizedMessage) -> int:
    return len(item.head) if isinstance(item, OversizedMessage) else len(item)


class ConnectionProcessor:
    """One connection: handshake, ordered dispatch, notifications, teardown."""

    def __init__(
        self,
        transport: MessageTransport,
        *,
        router: Router,
        services: ServerServices,
        registry: SessionRegistry,
    ) -> None:
        self.transport = transport
        self.router = router
        self.services = services
        self.registry = registry
        self._loop: asyncio.AbstractEventLoop | None = None
        self.attachment = Attachment(transport.label, self._notify, kind=transport.kind)
        self._handlers: set[asyncio.Task[None]] = set()
        #: requests in progress at once (``--concurrent-requests``): the one
        #: being dispatched plus the long polls in ``_handlers``.
        self._slots = asyncio.Semaphore(services.config.concurrent_requests)
        #: ``_serve`` waits for the next message (so nothing is being handled).
        self._parked = False
        self._closed = False
        self._close_reason: str | None = None
        self._close_requested = asyncio.Event()
        #: messages ``_serve`` took so far (tells a request still in progress apart).
        self._dispatched = 0
        self._busy_timer: asyncio.TimerHandle | None = None
        #: reads the transport while ``_serve`` is busy (``_read_ahead``).
        self._reader: asyncio.Task[None] | None = None
        #: messages it read, for ``_serve`` in arrival order, and their size.
        self._ahead: deque[bytes | bytearray | OversizedMessage] = deque()
        self._ahead_bytes = 0
        #: the reader saw EOF.
        self._peer_gone = False
        #: watches for the peer leaving while reading ahead is at its bound.
        self._hangup: select.epoll | None = None

    # -- outbound ---------------------------------------------------------

    async def _send(self, data: Outbound) -> bool:
        """Hand one message to the transport; False if the connection is closing or gone."""
        if self._closed:
            return False
        try:
            await self.transport.send(data)
        except (ConnectionError, OSError) as exc:
            logger.debug("%s: send failed: %s", self.transport.label, exc)
            self._closed = True
            self._request_close(f"send failed: {exc}")
            return False
        return not self._closed

    async def _notify(self, method: str, params: msgspec.Struct) -> bool:
        """The session's notification sink while we are attached.

        Returns whether the notification reached a live transport: lossless
        output only drops chunks that did (a send into a dead or closing
        connection must not count as delivered).
        """
        return await self._send(_encode_notification(method, params))

    # -- main loop --------------------------------------------------------

    async def run(self) -> None:
        """Serve until the peer disconnects, the protocol says close, or :meth:`close`."""
        self._loop = asyncio.get_running_loop()
        serve = asyncio.create_task(self._serve())
        closer = asyncio.create_task(self._close_requested.wait())
        try:
            await asyncio.wait({serve, closer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._closed = True
            if self._busy_timer is not None:
                self._busy_timer.cancel()
                self._busy_timer = None
            self._stop_hangup_watch()
            tasks: list[asyncio.Future[Any]] = [
                serve, closer, *self._handlers, *self.attachment.streams.values()
            ]
            if self._reader is not None:
                tasks.append(self._reader)
            self._ahead.clear()
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            for result in results:
                if isinstance(result, Exception):
                    logger.error("%s: task failed", self.transport.label, exc_info=result)
            self.registry.detach(self.attachment)
            self.attachment.close_file_handles()
            # The attachment's sinks are this processor's bound methods: a cycle
            # that kept the processor, its transport and their buffers until a
            # full collection. Nothing is sent through them once detached.
            self.attachment.sink = _not_delivered
            with contextlib.suppress(Exception):
                await self.transport.aclose()
            logger.debug("%s: closed (%s)", self.transport.label, self._close_reason or "eof")

    def close(self, reason: str) -> None:
        """End the connection: cancel what is in progress, detach, close (server shutdown)."""
        self._request_close(reason)

    def refuse(self, reason: str) -> None:
        """End the connection, telling the peer why (a WebSocket closes with 1008):
        a protocol violation, or an expired token."""
        self.transport.refuse(reason)
        self._request_close(reason)

    def _request_close(self, reason: str) -> None:
        if self._close_reason is None:
            self._close_reason = reason
        self._close_requested.set()

    async def _serve(self) -> None:
        """Read and dispatch in arrival order until EOF or a closing violation."""
        while not self._closed:
            item = await self._next()
            if item is None or self._close_requested.is_set():
                return
            self._dispatched += 1
            if self._busy_timer is None:
                self._watch_busy()
            if self.attachment.evicted:
                self._request_close("session resumed by another connection")
                return
            try:
                await self._handle(item)
            except ProtocolClosedError as exc:
                self.refuse(str(exc))
                return
            if not isinstance(item, OversizedMessage) and len(item) > KEEP_MESSAGE_MAX:
                del item  # an idle connection would hold a 64 MiB write's 85 MiB text

    async def _next(self) -> Inbound:
        """The next message in arrival order (read ahead, or from the transport); None at EOF."""
        while True:
            ahead = self._ahead
            if ahead:
                item = ahead.popleft()
                self._ahead_bytes -= _inbound_size(item)
                return item
            if self._peer_gone:
                return None
            reader = self._reader
            self._parked = True
            try:
                if reader is None:
                    return await self.transport.receive()
                # The reader waits for the next message: it hands it over and ends.
                await asyncio.wait((reader,))
            finally:
                self._parked = False

    def _watch_busy(self) -> None:
        loop = self._loop
        assert loop is not None
        self._busy_timer = loop.call_later(READ_AHEAD_AFTER, self._check_busy, self._dispatched)

    def _check_busy(self, dispatched: int) -> None:
        """Timer: is ``_serve`` still on the message it took ``READ_AHEAD_AFTER`` ago?"""
        self._busy_timer = None
        if self._closed or self._parked or self._reader is not None:
            return
        if dispatched != self._dispatched:
            self._watch_busy()  # busy with a later message: give that one its time
            return
        if len(self._ahead) < READ_AHEAD_MESSAGES and self._ahead_bytes < READ_AHEAD_BYTES:
            loop = self._loop
            assert loop is not None
            self._reader = loop.create_task(self._read_ahead())

    async def _read_ahead(self) -> None:
        """Read the transport while ``_serve`` is busy, so EOF ends what it waits for.

        A disconnect aborts the request in progress (PROTOCOL.md §2.7):
        without this, a handler waiting for something only the peer's
        departure should end (a child's stdin, for ever) kept the session
        attached and its processes alive. Ends when ``_serve`` waits for the
        next message (it was handed over), at EOF, or at the read-ahead bound.
        """
        try:
            receive = self.transport.receive
            while True:
                item = await receive()
                if item is None:
                    self._peer_gone = True
                    self._close_requested.set()  # cancels the request in progress
                    return
                self._ahead.append(item)
                self._ahead_bytes += _inbound_size(item)
                del item  # ``_serve`` lets a big one go once handled: not kept here
                if self._parked:
                    return
                if len(self._ahead) >= READ_AHEAD_MESSAGES or self._ahead_bytes >= READ_AHEAD_BYTES:
                    self._watch_hangup()
                    return
        except Exception:  # task boundary: a failed read ends the connection
            logger.exception("%s: read failed", self.transport.label)
            self._peer_gone = True
            self._close_requested.set()
        finally:
            self._reader = None

    def _watch_hangup(self) -> None:
        """Reading ahead stopped at its bound: watch the connection's descriptor for
        the peer leaving, without reading it (``EPOLLRDHUP``; a reset is
        ``EPOLLHUP``/``EPOLLERR``, always reported).

        Without this, a client that queued more than the bound behind a request
        waiting for good and then left went unnoticed until that request ended:
        its session and processes lived on (found by an audit: 4300 requests
        behind a blocked ``process/write``). Linux only; elsewhere, and for a
        descriptor epoll refuses (stdin from a file), nothing is watched.
        """
        loop = self._loop
        fd = self.transport.hangup_fd
        make_epoll = getattr(select, "epoll", None)
        if self._hangup is not None or fd is None or make_epoll is None or loop is None:
            return
        watcher = make_epoll()
        try:
            watcher.register(fd, select.EPOLLRDHUP)
            loop.add_reader(watcher.fileno(), self._on_hangup)
        except (OSError, ValueError):
            watcher.close()
            return
        self._hangup = watcher

    def _on_hangup(self) -> None:
        self._stop_hangup_watch()
        self._peer_gone = True
        self._close_requested.set()  # cancels the request in progress

    def _stop_hangup_watch(self) -> None:
        watcher = self._hangup
        if watcher is None:
            return
        self._hangup = None
        if self._loop is not None:
            self._loop.remove_reader(watcher.fileno())
        watcher.close()

    async def _handle(self, item: bytes | bytearray | OversizedMessage) -> None:
        if isinstance(item, OversizedMessage):
            await self._send(
                encode_error(
                    _sniff_id(item.head),
                    ErrorCode.INVALID_REQUEST,
                    f"JSON-RPC message from {self.transport.label} is too large: "
                    f"{item.size} bytes exceeds the limit of {item.limit} bytes",
                )
            )
            return
        try:
            if len(item) < DECODE_OFF_LOOP:
                message = decode_message(item)
            else:  # walked in a worker, a window at a time: the loop runs on
                message = await asyncio.to_thread(decode_message, item)
        except ProtocolError as exc:
            await self._send(
                encode_error(
                    MALFORMED_ID,
                    ErrorCode.INVALID_REQUEST,
                    malformed_message_text(self.transport.kind, self.transport.label, exc.message),
                )
            )
            return
        if isinstance(message, Request):
            await self._start_request(message)
        elif isinstance(message, Notification):
            if message.method != "initialized":
                raise ProtocolClosedError(f"unexpected notification `{message.method}`")
            att = self.attachment
            att.handshake.on_initialized(attached=att.attached)
        else:
            assert isinstance(message, (Response, ErrorResponse))
            raise ProtocolClosedError("unexpected response from client")

    async def _start_request(self, request: Request) -> None:
        await self._slots.acquire()
        ctx = RequestContext(
            request.id, request.method, self.attachment, self.services, self.registry
        )
        if not self.router.may_block(request.method):
            try:
                await self._answer(ctx, request)  # inline: answered before the next is read
            finally:
                self._slots.release()
            return
        task = asyncio.create_task(self._run_request(ctx, request))
        self._handlers.add(task)
        task.add_done_callback(self._handler_done)
        await ctx.released.wait()

    def _handler_done(self, task: asyncio.Task[None]) -> None:
        self._handlers.discard(task)
        self._slots.release()

    async def _answer(self, ctx: RequestContext, request: Request) -> None:
        try:
            await self._send(await self.router.dispatch(ctx, request))
        finally:
            ctx.mark_replied()

    async def _run_request(self, ctx: RequestContext, request: Request) -> None:
        """A ``may_block`` request, in a task of its own."""
        try:
            await self._answer(ctx, request)
        except ProtocolClosedError as exc:
            self.refuse(str(exc))
        finally:
            ctx.released.set()
