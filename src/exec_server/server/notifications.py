"""``process/output``, ``process/exited``, ``process/closed``: the wire form of process events."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec

from exec_server.process.events import EventSink, Exited, Output, ProcessEvent
from exec_server.protocol.types.process import (
    NOTIFY_CLOSED,
    NOTIFY_EXITED,
    NOTIFY_OUTPUT,
    ClosedNotification,
    ExitedNotification,
    OutputNotification,
)

__all__ = ["NotificationSend", "denial", "notification", "notifier"]

#: ``await send(method, params)`` sends one notification (awaiting =
#: backpressure); False: it did not reach a live transport.
NotificationSend = Callable[[str, msgspec.Struct], Awaitable[bool | None]]


def denial(verdict: bool | None) -> bool | msgspec.UnsetType:
    """``sandboxDenied``: unset without a verdict (legacy shape)."""
    return msgspec.UNSET if verdict is None else verdict


def notification(event: ProcessEvent) -> tuple[str, msgspec.Struct]:
    if isinstance(event, Output):
        return NOTIFY_OUTPUT, OutputNotification(
            process_id=event.process_id, seq=event.seq, stream=event.stream, chunk=event.data
        )
    if isinstance(event, Exited):
        return NOTIFY_EXITED, ExitedNotification(
            process_id=event.process_id,
            seq=event.seq,
            exit_code=event.exit_code,
            sandbox_denied=denial(event.sandbox_denied),
        )
    return NOTIFY_CLOSED, ClosedNotification(process_id=event.process_id, seq=event.seq)


def notifier(send: NotificationSend) -> EventSink:
    """An event sink for :meth:`ProcessManager.set_sink`."""

    async def sink(event: ProcessEvent) -> bool | None:
        method, params = notification(event)
        return await send(method, params)

    return sink
