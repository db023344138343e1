"""One connection: reader, in-order dispatch raced against disconnect, close.

Requests run inline in arrival order, each answered before the next is read
(the reference behaviour, PROTOCOL.md §2.7: a pipelined ``process/start`` +
``process/write`` stays ordered); ``may_block`` routes run in a task of their
own. EOF or a closing protocol violation cancels in-flight handlers and
detaches the session (§4.6). A request busy past :data:`READ_AHEAD_AFTER` has
the transport read ahead, so EOF still cancels it.
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
from exec_server.protocol.messages import MALFORMED_ID, Notification, Request, RequestId
from exec_server.server.router import RequestContext, Router
from exec_server.server.services import ServerServices
from exec_server.server.session import Attachment, SessionRegistry
from exec_server.transport.base import Inbound, MessageTransport, Outbound, OversizedMessage

__all__ = ["ConnectionProcessor"]

logger = logging.getLogger("exec_server.server")

#: A bigger message is let go once handled. Smaller ones are kept: freed, their
#: memory went back to the system and the next one faulted it in again.
KEEP_MESSAGE_MAX: Final = 32 << 20
#: Messages from this size on are decoded in a worker (~0.25 ms per MiB on the loop).
DECODE_OFF_LOOP: Final = 4 << 20
#: Seconds one message may keep the read loop busy before the transport is read
#: ahead (to notice EOF, §2.7); one timer per busy connection, not per request.
READ_AHEAD_AFTER: Final = 0.1
#: Messages read ahead at most; then the descriptor is watched for the peer
#: leaving instead (``ConnectionProcessor._watch_hangup``; Linux).
READ_AHEAD_MESSAGES: Final = 4096
#: Bytes read ahead at most (the message that crosses it is still taken).
READ_AHEAD_BYTES: Final = 64 << 20
#: ``{"id": <integer or string>`` at the start of a message, the value ending where
#: the member does (``1.5`` is no id, not ``1``). Possessive: no backtracking.
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
    del method, params
    return False


def _inbound_size(item: bytes | bytearray | OversizedMessage) -> int:
    return len(item.head) if isinstance(item, OversizedMessage) else len(item)


class ConnectionProcessor:
    """One connection: handshake, ordered dispatch, notifications, teardown."""

    def __init__(
        self, transport: MessageTransport, *, router: Router, services: ServerServices,
        registry: SessionRegistry,
    ) -> None:
        self.transport = transport
        self.router = router
        self.services = services
        self.registry = registry
        self._loop = asyncio.get_running_loop()
        self.attachment = Attachment(transport.label, self._notify, kind=transport.kind)
        self._handlers: set[asyncio.Task[None]] = set()
        #: ``--concurrent-requests``: the one being dispatched plus the long polls.
        self._slots = asyncio.Semaphore(services.config.concurrent_requests)
        #: ``_serve`` waits for the next message (nothing is being handled).
        self._parked = False
        self._closed = False
        self._close_reason: str | None = None
        self._close_requested = asyncio.Event()
        self._dispatched = 0
        self._busy_timer: asyncio.TimerHandle | None = None
        self._reader: asyncio.Task[None] | None = None
        self._ahead: deque[bytes | bytearray | OversizedMessage] = deque()
        self._ahead_bytes = 0
        self._peer_gone = False
        self._hangup: select.epoll | None = None

    async def _send(self, data: Outbound) -> bool:
        """False if the connection is closing or gone."""
        if self._closed:
            return False
        try:
            await self.transport.send(data)
        except (ConnectionError, OSError) as exc:
            logger.debug("%s: send failed: %s", self.transport.label, exc)
            self._closed = True
            self.close(f"send failed: {exc}")
            return False
        return not self._closed

    async def _notify(self, method: str, params: msgspec.Struct) -> bool:
        """The session's sink; lossless output drops only chunks that reached a live transport."""
        return await self._send(_encode_notification(method, params))

    async def run(self) -> None:
        """Serve until the peer disconnects, the protocol says close, or :meth:`close`."""
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
            # The sink is our bound method: a cycle that kept the transport's buffers.
            self.attachment.sink = _not_delivered
            with contextlib.suppress(Exception):
                await self.transport.aclose()
            logger.debug("%s: closed (%s)", self.transport.label, self._close_reason or "eof")

    def close(self, reason: str) -> None:
        """End the connection: cancel what is in progress, detach, close."""
        if self._close_reason is None:
            self._close_reason = reason
        self._close_requested.set()

    def refuse(self, reason: str) -> None:
        """:meth:`close`, telling the peer why (a WebSocket closes with 1008)."""
        self.transport.refuse(reason)
        self.close(reason)

    async def _serve(self) -> None:
        while not self._closed:
            item = await self._next()
            if item is None or self._close_requested.is_set():
                return
            self._dispatched += 1
            if self._busy_timer is None:
                self._watch_busy()
            if self.attachment.evicted:
                self.close("session resumed by another connection")
                return
            try:
                await self._handle(item)
            except ProtocolClosedError as exc:
                self.refuse(str(exc))
                return
            if not isinstance(item, OversizedMessage) and len(item) > KEEP_MESSAGE_MAX:
                del item  # an idle connection would hold a 64 MiB write's text

    async def _next(self) -> Inbound:
        """The next message in arrival order; None at EOF."""
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
        self._busy_timer = self._loop.call_later(
            READ_AHEAD_AFTER, self._check_busy, self._dispatched
        )

    def _check_busy(self, dispatched: int) -> None:
        """Timer: is ``_serve`` still on the message it took ``READ_AHEAD_AFTER`` ago?"""
        self._busy_timer = None
        if self._closed or self._parked or self._reader is not None:
            return
        if dispatched != self._dispatched:
            self._watch_busy()  # busy with a later message: give that one its time
            return
        if len(self._ahead) < READ_AHEAD_MESSAGES and self._ahead_bytes < READ_AHEAD_BYTES:
            self._reader = self._loop.create_task(self._read_ahead())

    async def _read_ahead(self) -> None:
        """Read while ``_serve`` is busy, so EOF aborts the request in progress (§2.7)
        instead of a handler waiting for ever (a child's stdin) keeping the session."""
        try:
            receive = self.transport.receive
            while True:
                item = await receive()
                if item is None:
                    self._peer_left()
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
            self._peer_left()
        finally:
            self._reader = None

    def _watch_hangup(self) -> None:
        """At the read-ahead bound, watch the descriptor for the peer leaving without
        reading it (``EPOLLRDHUP``): else a client that queued more than the bound
        behind a stuck request and left kept its session alive. Linux only."""
        fd = self.transport.hangup_fd
        make_epoll = getattr(select, "epoll", None)
        if self._hangup is not None or fd is None or make_epoll is None:
            return
        watcher = make_epoll()
        try:
            watcher.register(fd, select.EPOLLRDHUP)
            self._loop.add_reader(watcher.fileno(), self._peer_left)
        except (OSError, ValueError):
            watcher.close()
            return
        self._hangup = watcher

    def _peer_left(self) -> None:
        self._stop_hangup_watch()
        self._peer_gone = True
        self._close_requested.set()  # cancels the request in progress

    def _stop_hangup_watch(self) -> None:
        watcher = self._hangup
        if watcher is None:
            return
        self._hangup = None
        self._loop.remove_reader(watcher.fileno())
        watcher.close()

    async def _handle(self, item: bytes | bytearray | OversizedMessage) -> None:
        if isinstance(item, OversizedMessage):
            text = (
                f"JSON-RPC message from {self.transport.label} is too large: "
                f"{item.size} bytes exceeds the limit of {item.limit} bytes"
            )
            await self._send(encode_error(_sniff_id(item.head), ErrorCode.INVALID_REQUEST, text))
            return
        try:
            if len(item) < DECODE_OFF_LOOP:
                message = decode_message(item)
            else:  # walked in a worker, a window at a time: the loop runs on
                message = await asyncio.to_thread(decode_message, item)
        except ProtocolError as exc:
            text = malformed_message_text(self.transport.kind, self.transport.label, exc.message)
            await self._send(encode_error(MALFORMED_ID, ErrorCode.INVALID_REQUEST, text))
            return
        if isinstance(message, Request):
            await self._start_request(message)
        elif isinstance(message, Notification):
            if message.method != "initialized":
                raise ProtocolClosedError(f"unexpected notification `{message.method}`")
            att = self.attachment
            att.handshake.on_initialized(attached=att.attached)
        else:
            raise ProtocolClosedError("unexpected response from client")

    async def _start_request(self, request: Request) -> None:
        await self._slots.acquire()
        ctx = RequestContext(self.attachment, self.services, self.registry)
        if not self.router.may_block(request.method):
            try:  # inline: answered before the next is read
                await self._send(await self.router.dispatch(ctx, request))
            finally:
                self._slots.release()
            return
        released = ctx.released = asyncio.Event()
        replied = ctx.replied = asyncio.Event()
        task = asyncio.create_task(self._run_request(ctx, request, released, replied))
        self._handlers.add(task)
        task.add_done_callback(self._handler_done)
        await released.wait()

    def _handler_done(self, task: asyncio.Task[None]) -> None:
        self._handlers.discard(task)
        self._slots.release()

    async def _run_request(
        self, ctx: RequestContext, request: Request, released: asyncio.Event,
        replied: asyncio.Event,
    ) -> None:
        try:
            await self._send(await self.router.dispatch(ctx, request))
        except ProtocolClosedError as exc:
            self.refuse(str(exc))
        finally:
            replied.set()
            released.set()
