"""What every message transport shares: the interface, the message types, the size rule.

A transport moves whole messages as bytes. A message past ``max_message_size``
is discarded as it arrives and reported as :class:`OversizedMessage`, its head
kept so the request id can still be answered (PROTOCOL.md §14).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Protocol, TypeAlias

__all__ = [
    "FEED", "FEED_MIN", "HEAD_SIZE", "Inbound", "MessageTransport", "Outbound", "OversizedMessage"
]

HEAD_SIZE: Final = 256
#: A message longer than this is sent in pieces of :data:`FEED`, so no framed
#: copy of all of it is ever held.
FEED_MIN: Final = 4 << 20
FEED: Final = 1 << 20


@dataclass(frozen=True, slots=True)
class OversizedMessage:
    """A message larger than ``limit``; only its ``head`` was kept."""

    size: int
    limit: int
    head: bytes


#: What ``receive`` returns; None at EOF.
Inbound: TypeAlias = bytes | bytearray | OversizedMessage | None

Outbound: TypeAlias = bytes | bytearray


class MessageTransport(Protocol):
    """A bidirectional, message-framed connection."""

    #: used in logs and parse-error texts (PROTOCOL.md §3.6).
    label: str
    #: ``"websocket"`` or ``"line"``; picks the parse-error wording.
    kind: str

    @property
    def hangup_fd(self) -> int | None:
        """A descriptor that shows the peer leaving while nobody reads (``EPOLLRDHUP``)."""
        ...

    async def receive(self) -> Inbound: ...

    async def send(self, data: Outbound) -> None:
        """Waits for buffer space (backpressure); ConnectionError once closed."""
        ...

    def refuse(self, reason: str) -> None:
        """The peer broke the protocol (§3.5): tell it ``reason`` where the framing can."""
        ...

    async def aclose(self) -> None:
        """Idempotent."""
        ...
