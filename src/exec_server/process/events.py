"""What the process manager reports, no wire shapes: per process output chunks, one
:class:`Exited`, then :class:`Closed`, all numbered (PROTOCOL.md §8.2); read snapshots."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from exec_server.protocol.types.process import OutputChunk, ProcessStream

__all__ = ["Closed", "EventSink", "Exited", "Output", "ProcessEvent", "Snapshot"]


@dataclass(frozen=True, slots=True)
class Output:
    """One read of a child's output fd."""

    process_id: str
    seq: int
    stream: ProcessStream
    data: bytes


@dataclass(frozen=True, slots=True)
class Exited:
    """The child was reaped; ``sandbox_denied`` None: started without ``report_denial``."""

    process_id: str
    seq: int
    exit_code: int
    sandbox_denied: bool | None


@dataclass(frozen=True, slots=True)
class Closed:
    """Exited and every output stream at EOF: nothing follows."""

    process_id: str
    seq: int


ProcessEvent = Output | Exited | Closed

#: ``await sink(event)`` delivers one event (awaiting = backpressure). False: it reached
#: no live receiver (lossless mode then keeps the chunk); None counts as delivered.
EventSink = Callable[[ProcessEvent], Awaitable[bool | None]]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A ``process/read``: retained chunks after the cursor and where the process stands."""

    chunks: list[OutputChunk]
    next_seq: int
    exit_code: int | None
    closed: bool
    sandbox_denied: bool | None

    @property
    def exited(self) -> bool:
        return self.exit_code is not None
