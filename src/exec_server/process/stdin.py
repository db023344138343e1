"""A child's stdin: a bounded queue of writes (PROTOCOL.md §8.5), so a child that does
not read slows its writer instead of growing the server. Write errors (EPIPE, EIO: the
child stopped reading) drop the queue, as upstream ignores them."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Final

from exec_server.process.spawn import close_quietly, set_if_pending

__all__ = ["WRITE_QUEUE_BYTES", "WRITE_QUEUE_DEPTH", "Stdin", "wait_in", "wake_all"]

#: Pending writes before ``write`` waits (§14).
WRITE_QUEUE_DEPTH: Final = 128
#: Bytes queued before ``write`` waits: enough that a fast reader never waits for the next
#: round trip. A bigger single write is taken whole once the queue is empty.
WRITE_QUEUE_BYTES: Final = 16 << 20
#: Remembered ``writeId`` values (CLIENT_COMPAT.md §5.1).
WRITE_ID_MEMORY: Final = 4096


def wake_all(futures: list[asyncio.Future[None]]) -> None:
    for fut in futures:
        set_if_pending(fut)
    futures.clear()


async def wait_in(futures: list[asyncio.Future[None]]) -> None:
    """Wait for the next ``wake_all(futures)``; a cancelled wait leaves no future behind."""
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    futures.append(fut)
    try:
        await fut
    finally:
        if not fut.done():
            fut.cancel()
            with contextlib.suppress(ValueError):
                futures.remove(fut)


@dataclass(slots=True, eq=False)
class Stdin:
    """The writable end of one child's stdin (``fd`` None: there is none, or it closed)."""

    fd: int | None = None
    write_ids: OrderedDict[str, None] = field(default_factory=OrderedDict, init=False)
    _queue: deque[memoryview] = field(default_factory=deque, init=False)
    #: bytes in ``_queue`` (what :data:`WRITE_QUEUE_BYTES` bounds).
    _queued: int = field(default=0, init=False)
    _space: list[asyncio.Future[None]] = field(default_factory=list, init=False)
    _armed: bool = field(default=False, init=False)
    #: close once the queue is written (``process/closeStdin``).
    _eof: bool = field(default=False, init=False)

    def _full(self, size: int) -> bool:
        queued = self._queued
        return len(self._queue) >= WRITE_QUEUE_DEPTH or (
            queued > 0 and queued + size > WRITE_QUEUE_BYTES
        )

    async def write(self, data: bytes, write_id: str | None) -> None:
        """Queue ``data`` once there is room; dropped if stdin closed meanwhile. Cancelled
        while waiting, nothing is queued or remembered: a retry with the same id writes."""
        while self.fd is not None and data and self._full(len(data)):
            await wait_in(self._space)
        if write_id is not None:
            self.write_ids[write_id] = None
            if len(self.write_ids) > WRITE_ID_MEMORY:
                self.write_ids.popitem(last=False)
        if self.fd is not None and data:
            self._queue.append(memoryview(data))
            self._queued += len(data)
            self._flush()

    def _flush(self) -> None:
        fd = self.fd
        queue = self._queue
        queued = self._queued
        while queue and fd is not None:
            head = queue[0]
            try:
                n = os.write(fd, head)
            except BlockingIOError:
                if not self._armed:
                    asyncio.get_running_loop().add_writer(fd, self._flush)
                    self._armed = True
                if self._queued < queued:
                    wake_all(self._space)  # room for a waiting write, perhaps
                return
            except OSError:
                queue.clear()
                self._queued = 0
                break
            self._queued -= n
            if n < len(head):
                queue[0] = head[n:]
            else:
                queue.popleft()
        if self._armed and fd is not None:
            asyncio.get_running_loop().remove_writer(fd)
            self._armed = False
        wake_all(self._space)
        if self._eof and not queue:
            self.close()

    def close_when_flushed(self) -> None:
        """End of input: close once every queued write reached the child."""
        self._eof = True
        self._flush()

    def close(self) -> None:
        """Close now, dropping what is queued; waiting writes return."""
        fd = self.fd
        if fd is None:
            return
        if self._armed:
            asyncio.get_running_loop().remove_writer(fd)
            self._armed = False
        self.fd = None
        self._queue.clear()
        self._queued = 0
        close_quietly(fd)
        wake_all(self._space)
