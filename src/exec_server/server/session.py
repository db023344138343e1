"""Resumable sessions and which connection each is attached to (PROTOCOL.md §4.4-§4.5).

A detached session's processes keep running and buffering for ``config.detach_ttl``,
then are shut down unless a connection resumed it. Resuming an attached session
answers ``-32600`` where upstream 0.163 answers ``-32010`` (CLIENT_COMPAT.md §1.1).
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from exec_server.config import ServerConfig
from exec_server.exceptions import InvalidRequestError
from exec_server.fs.handles import FileHandles
from exec_server.fs.pool import shared_pool
from exec_server.process.manager import ProcessManager
from exec_server.protocol.handshake import Handshake, already_attached_text, unknown_session_text
from exec_server.server.notifications import NotificationSend, notifier

__all__ = ["Attachment", "Session", "SessionRegistry"]

logger = logging.getLogger("exec_server.server")


class Session:
    """A resumable context: a process manager plus attachment bookkeeping."""

    def __init__(self, session_id: str, processes: ProcessManager) -> None:
        self.session_id = session_id
        self.processes = processes
        self.attached_to: str | None = None
        self.detach_deadline: float | None = None
        self.expiry: asyncio.Task[None] | None = None
        #: set whenever the attachment changes, so long polls re-check.
        self.attachment_changed = asyncio.Event()
        self.closed = asyncio.Event()

    def changed(self) -> None:
        self.attachment_changed.set()
        self.attachment_changed = asyncio.Event()


class Attachment:
    """Per-connection state: handshake, attached session, notification sink."""

    def __init__(self, label: str, sink: NotificationSend, *, kind: str = "websocket") -> None:
        self.connection_id = uuid.uuid4().hex
        self.label = label
        self.kind = kind
        self.sink = sink
        self.handshake = Handshake()
        self.session: Session | None = None
        #: work that lives as long as this connection (streamed HTTP bodies), by name.
        self.streams: dict[str, asyncio.Future[None]] = {}
        self.file_handles: FileHandles | None = None

    def close_file_handles(self) -> None:
        """In a worker: closing a descriptor may flush to a slow device."""
        handles, self.file_handles = self.file_handles, None
        if handles is not None:
            shared_pool().submit(_ignore_result, handles.close_all)

    @property
    def attached(self) -> bool:
        return self.session is not None and self.session.attached_to == self.connection_id

    @property
    def evicted(self) -> bool:
        """Another connection resumed our session (§4.5)."""
        s = self.session
        return s is not None and s.attached_to is not None and s.attached_to != self.connection_id


def _ignore_result(result: object, error: BaseException | None) -> None:
    if error is not None:
        logger.error("closing file handles failed", exc_info=error)


class SessionRegistry:
    """Process-wide ``sessionId -> Session`` map with detach/expiry (§4.4)."""

    def __init__(self, config: ServerConfig) -> None:
        self._config = config
        self._sessions: dict[str, Session] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: sessions being shut down (``_remove``): awaited, never cancelled.
        self._closing: set[asyncio.Task[None]] = set()

    def get(self, session_id: str) -> Session | None:
        return self._sessions.get(session_id)

    def create(self, attachment: Attachment) -> Session:
        session = Session(str(uuid.uuid4()), ProcessManager(self._config))
        self._sessions[session.session_id] = session
        self._attach(session, attachment)
        return session

    async def resume(self, session_id: str, attachment: Attachment) -> Session:
        """Reattach a detached session (§4.1)."""
        session = self._sessions.get(session_id)
        if session is None:
            raise InvalidRequestError(unknown_session_text(session_id))
        if session.attached_to is not None:
            raise InvalidRequestError(already_attached_text(session_id))
        deadline = session.detach_deadline
        if deadline is not None and asyncio.get_running_loop().time() >= deadline:
            await self._remove(session)
            raise InvalidRequestError(unknown_session_text(session_id))
        self._attach(session, attachment)
        return session

    def detach(self, attachment: Attachment) -> None:
        """The connection ended: stop notifications, start the TTL (§4.4)."""
        session = attachment.session
        if session is None or session.attached_to != attachment.connection_id:
            return
        session.processes.set_sink(None)
        session.attached_to = None
        loop = asyncio.get_running_loop()
        session.detach_deadline = loop.time() + self._config.detach_ttl
        session.changed()
        task = session.expiry = loop.create_task(self._expire_later(session))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        logger.debug("session %s detached from %s", session.session_id, attachment.label)

    async def aclose(self) -> None:
        """Server shutdown: cancel expiry timers, kill every session's processes."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        sessions = list(self._sessions.values())
        self._sessions.clear()
        for session in sessions:
            await self._close(session)

    def _attach(self, session: Session, attachment: Attachment) -> None:
        session.attached_to = attachment.connection_id
        session.detach_deadline = None
        if session.expiry is not None:
            session.expiry.cancel()
            session.expiry = None
        session.processes.set_sink(notifier(attachment.sink))
        attachment.session = session
        session.changed()

    async def _expire_later(self, session: Session) -> None:
        """Cancelled when a connection resumes the session."""
        await asyncio.sleep(self._config.detach_ttl)
        logger.info("session %s expired after detach", session.session_id)
        await self._remove(session)

    async def _remove(self, session: Session) -> None:
        if self._sessions.get(session.session_id) is not session:
            return  # removed already (an expired resume, then its timer)
        del self._sessions[session.session_id]
        # In a task of its own: a caller cancelled meanwhile must not leave the
        # processes killed but unreaped.
        task = asyncio.get_running_loop().create_task(self._close(session))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        await asyncio.shield(task)

    @staticmethod
    async def _close(session: Session) -> None:
        try:
            await session.processes.shutdown()
        except Exception:
            logger.exception("shutting down processes of session %s failed", session.session_id)
        session.closed.set()
