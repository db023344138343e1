"""Two connected in-process transports (tests, embedding)."""

from __future__ import annotations

import asyncio

from exec_server.transport.base import Inbound, Outbound

__all__ = ["MemoryTransport", "memory_pair"]


class MemoryTransport:
    """One end of an in-process pair; line-framing error texts."""

    kind = "line"
    hangup_fd = None  # EOF arrives as a message

    def __init__(
        self, inbound: asyncio.Queue[bytes | None], outbound: asyncio.Queue[bytes | None], *,
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

    def refuse(self, reason: str) -> None:
        del reason  # no close reason to carry: the peer sees EOF

    async def aclose(self) -> None:
        """Close both directions: the peer sees EOF, our reader stops."""
        if not self.closed:
            self.closed = True
            self._outbound.put_nowait(None)
            self._inbound.put_nowait(None)


def memory_pair(*, label: str = "memory") -> tuple[MemoryTransport, MemoryTransport]:
    a_to_b: asyncio.Queue[bytes | None] = asyncio.Queue()
    b_to_a: asyncio.Queue[bytes | None] = asyncio.Queue()
    return (
        MemoryTransport(b_to_a, a_to_b, label=f"{label} a"),
        MemoryTransport(a_to_b, b_to_a, label=f"{label} b"),
    )
