"""A caller that stops waiting for a big remote ``write_file`` (a timeout around
it) leaves the connection working, and the write lands whole, as it does on the
local backend (its thread runs on).

A message over 1 MiB goes out in fragments; cancelled between two of them (here:
while websockets waits for the socket to drain after the first), a send cut short
would let the next call's frame break the connection (``1002 expected a
continuation frame``)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.connection import Connection

from exec_server.client import _transport as _transport
from exec_server.client.fs import RemoteFileSystem

WAIT = 30.0


async def test_a_cancelled_fragmented_write_leaves_the_connection_working(
    live_server: Any, tdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_transport, "SEND_FRAGMENT", 64 * 1024)
    real_drain: Callable[[Connection], Awaitable[None]] = Connection.drain
    in_flight = asyncio.Event()
    gate = asyncio.Event()
    calls = 0
    armed = False

    async def drain(self: Connection) -> None:
        nonlocal calls
        if not armed:
            await real_drain(self)
            return
        calls += 1
        if calls == 1:  # right after the write's first fragment
            in_flight.set()
            await gate.wait()
        await real_drain(self)

    monkeypatch.setattr(Connection, "drain", drain)
    fs = RemoteFileSystem(await live_server.client())
    armed = True
    data = os.urandom(1 << 20)  # ~1.4 MB of base64: 22 fragments
    write = asyncio.create_task(fs.write_file(tdir / "big.bin", data))
    await asyncio.wait_for(in_flight.wait(), WAIT)
    write.cancel()
    await asyncio.wait_for(asyncio.wait({write}), WAIT)
    assert write.cancelled()
    gate.set()

    # The same client goes on: the next calls are answered...
    meta = await asyncio.wait_for(fs.get_metadata(tdir), WAIT)
    assert meta.is_directory
    # ...after the cancelled write, which the server received whole and made.
    assert await asyncio.wait_for(fs.read_file(tdir / "big.bin"), WAIT) == data
    assert calls > 2  # the rest of the message did go out fragment by fragment
    await asyncio.wait_for(fs.write_file(tdir / "again.bin", data[:200_000]), WAIT)
    assert (tdir / "again.bin").read_bytes() == data[:200_000]
