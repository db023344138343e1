"""Newline-delimited JSON on a byte stream: ``--listen stdio`` (PROTOCOL.md §2.6).

An oversized line is discarded chunk by chunk: no more than the limit is buffered.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Final

from exec_server.transport.base import (
    FEED,
    FEED_MIN,
    HEAD_SIZE,
    Inbound,
    Outbound,
    OversizedMessage,
)

__all__ = ["StreamTransport", "open_stdio"]

_READ_CHUNK: Final = 1 << 20
#: A line at least this long is handed over in the buffer it was read into, when
#: copying out what follows it copies less.
_HAND_OVER_MIN: Final = 64 << 10


class StreamTransport:
    """Blank lines are ignored. Big lines are not copied whole: one read is returned in
    the buffer it was gathered in, one sent is fed to the pipe 1 MiB at a time as it
    drains (asyncio's pipe transport would copy its unsent rest)."""

    kind = "line"

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, label: str,
        max_message_size: int, hangup_fd: int | None = None,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.label = label
        self.max_message_size = max_message_size
        self.hangup_fd = hangup_fd
        self._buffer = bytearray()
        self._scanned = 0
        self._eof = False
        #: the line being fed (:meth:`send`), every later one chained behind it.
        self._feeding: asyncio.Future[None] | None = None

    async def receive(self) -> Inbound:
        limit = self.max_message_size
        buf = self._buffer
        while True:
            # only scan bytes not scanned before: long lines arrive in many chunks
            newline = buf.find(b"\n", self._scanned)
            if newline >= 0:
                self._scanned = 0
                if newline > limit:
                    head = bytes(buf[:HEAD_SIZE])
                    del buf[: newline + 1]
                    return OversizedMessage(newline, limit, head)
                line: bytes | bytearray
                if newline >= _HAND_OVER_MIN and len(buf) - newline - 1 < newline:
                    # The line is most of the buffer: keep it there, copy the rest out.
                    self._buffer = bytearray(memoryview(buf)[newline + 1 :])
                    del buf[newline:]  # drops the newline and the rest: no copy
                    line, buf = buf, self._buffer
                else:
                    line = bytes(memoryview(buf)[:newline])
                    del buf[: newline + 1]
                if line and not line.isspace():
                    return line
                continue
            self._scanned = len(buf)
            if self._eof:
                self._scanned = 0
                if buf and not buf.isspace():
                    line = bytes(buf)
                    buf.clear()
                    return line
                return None
            if len(buf) > limit:
                self._scanned = 0
                return await self._discard_line()
            chunk = await self.reader.read(_READ_CHUNK)
            if not chunk:
                self._eof = True
            else:
                buf += chunk

    async def _discard_line(self) -> OversizedMessage:
        head = bytes(self._buffer[:HEAD_SIZE])
        size = len(self._buffer)
        self._buffer.clear()
        while True:
            chunk = await self.reader.read(_READ_CHUNK)
            if not chunk:
                self._eof = True
                return OversizedMessage(size, self.max_message_size, head)
            newline = chunk.find(b"\n")
            if newline >= 0:
                size += newline
                self._buffer += chunk[newline + 1 :]
                return OversizedMessage(size, self.max_message_size, head)
            size += len(chunk)

    async def send(self, data: Outbound) -> None:
        if self.writer.is_closing():
            raise ConnectionResetError("stream closed")
        if self._feeding is None and len(data) <= FEED_MIN:
            self.writer.write(data)
            self.writer.write(b"\n")
            await self.writer.drain()
            return
        # A big line, or any line sent while one is being fed: written in order,
        # behind it, by a task of its own, so a cancelled sender cannot leave
        # half a line on the stream.
        feed = asyncio.ensure_future(self._feed(self._feeding, data))
        self._feeding = feed
        feed.add_done_callback(self._fed)
        await asyncio.shield(feed)

    async def _feed(self, before: asyncio.Future[None] | None, data: Outbound) -> None:
        if before is not None:
            await asyncio.wait({before})  # its outcome is its own sender's
        writer = self.writer
        if writer.is_closing():
            raise ConnectionResetError("stream closed")
        with memoryview(data) as view:
            for start in range(0, len(view), FEED):
                if writer.is_closing():
                    raise ConnectionResetError("stream closed")
                writer.write(view[start : start + FEED])
                await writer.drain()
        writer.write(b"\n")
        await writer.drain()

    def _fed(self, feed: asyncio.Future[None]) -> None:
        if self._feeding is feed:
            self._feeding = None
        if not feed.cancelled():
            feed.exception()  # seen by its sender, if it still waits; no "never retrieved"

    def refuse(self, reason: str) -> None:
        del reason  # a line stream has no close reason

    async def aclose(self) -> None:
        if not self.writer.is_closing():
            self.writer.close()
        with contextlib.suppress(OSError, ConnectionError):
            await self.writer.wait_closed()


async def open_stdio(label: str, max_message_size: int) -> StreamTransport:
    """stdin and stdout as one transport (neither is closed with it)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(0, "rb", buffering=0, closefd=False)
    )
    w_transport, w_protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(1, "wb", buffering=0, closefd=False)
    )
    writer = asyncio.StreamWriter(w_transport, w_protocol, None, loop)
    return StreamTransport(
        reader, writer, label=label, max_message_size=max_message_size, hangup_fd=0
    )
