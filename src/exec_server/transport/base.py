"""What every message transport shares: the interface, the message types, the size rule.

A transport moves whole messages as bytes; it neither parses JSON nor knows
about methods. :mod:`~exec_server.transport.websocket` frames one message per
WebSocket message, :mod:`~exec_server.transport.stdio` one per line, and
:mod:`~exec_server.transport.memory` connects two ends in one process.

Size limit (PROTOCOL.md §14: a larger message gets a clear error, not a dropped
connection): a transport discards a message that grows past
``max_message_size`` as it arrives and reports :class:`OversizedMessage`,
keeping only its head so the request id can still be answered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Protocol, TypeAlias

__all__ = [
    "FEED",
    "FEED_MIN",
    "HEAD_SIZE",
    "Inbound",
    "MessageTransport",
    "Outbound",
    "OversizedMessage",
]

#: bytes of an oversized message kept so its ``id`` can still be answered.
HEAD_SIZE: Final = 256
#: A message longer than this is sent in pieces of :data:`FEED`, so no framed
#: copy of all of it is ever held.
FEED_MIN: Final = 4 << 20
FEED: Final = 1 << 20


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

    @property
    def hangup_fd(self) -> int | None:
        """A descriptor that shows the peer leaving while nobody reads (``EPOLLRDHUP``);
        None when there is none."""
        ...

    async def receive(self) -> Inbound:
        """Next inbound message; None once the peer is gone."""
        ...

    async def send(self, data: Outbound) -> None:
        """Send one UTF-8 JSON message (waits for buffer space: backpressure).

        Raises:
            ConnectionError: the connection is closed.
        """
        ...

    def refuse(self, reason: str) -> None:
        """The peer broke the protocol (PROTOCOL.md §3.5): tell it ``reason`` when
        closing, where the framing can carry one."""
        ...

    async def aclose(self) -> None:
        """Close; idempotent."""
        ...
