"""The stdin queue of a process is bounded by bytes as well as by writes
(docs/processes.md, "Pipes and PTYs"): a write that would take it past
``WRITE_QUEUE_BYTES`` waits until the child reads; a bigger single write is
taken whole when the queue is empty. A cancelled waiting write queues nothing."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exec_server.process.manager import ProcessManager
from exec_server.process.spec import LaunchSpec
from exec_server.process.stdin import WRITE_QUEUE_BYTES
from exec_server.protocol.types.process import WriteStatus

MiB = 1 << 20


@pytest.fixture
def gate(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A FIFO the child waits on before it reads stdin; write a line to open it.

    Held open read-write here, so neither side's open ever waits.
    """
    path = tmp_path / "gate"
    os.mkfifo(path)
    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    try:
        yield path, fd
    finally:
        os.close(fd)


def _gated_md5(gate: Path, total: int) -> LaunchSpec:
    """A child that reads nothing until the gate opens, then ``total`` bytes of stdin."""
    return LaunchSpec(
        argv=["/bin/sh", "-c", f"read go < {gate}; head -c {total} | md5sum"],
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
        pipe_stdin=True,
    )


def _payload(size: int, seed: int) -> bytes:
    return (bytes([seed]) * 4096 + bytes(range(256)) * 16) * (size // 8192)


async def test_a_write_past_the_byte_bound_waits_until_the_child_reads(
    no_leaks: None, manager: ProcessManager, sink: Any, gate: tuple[Path, int]
) -> None:
    first = _payload(WRITE_QUEUE_BYTES, 1)  # the whole bound: the pipe takes at most 1 MiB
    second = _payload(4 * MiB, 2)
    total = len(first) + len(second)
    await manager.start("p", _gated_md5(gate[0], total))
    assert await manager.write("p", first) is WriteStatus.ACCEPTED
    # Over the bound by bytes, with one write queued (the count allows 128).
    waiting = asyncio.ensure_future(manager.write("p", second))
    for _ in range(3):
        await asyncio.sleep(0)  # it would be accepted at once, without waiting
    assert not waiting.done()
    os.write(gate[1], b"go\n")
    assert await asyncio.wait_for(waiting, 10) is WriteStatus.ACCEPTED
    rec = await sink.closed("p")
    assert rec.data().split()[0].decode() == hashlib.md5(first + second).hexdigest()


async def test_a_write_bigger_than_the_bound_is_taken_by_an_empty_queue(
    no_leaks: None, manager: ProcessManager, sink: Any, gate: tuple[Path, int]
) -> None:
    big = _payload(WRITE_QUEUE_BYTES + 2 * MiB, 3)
    await manager.start("p", _gated_md5(gate[0], len(big) + 1))
    assert await manager.write("p", big) is WriteStatus.ACCEPTED
    waiting = asyncio.ensure_future(manager.write("p", b"!"))  # anything more waits
    for _ in range(3):
        await asyncio.sleep(0)
    assert not waiting.done()
    os.write(gate[1], b"go\n")
    assert await asyncio.wait_for(waiting, 10) is WriteStatus.ACCEPTED
    rec = await sink.closed("p")
    assert rec.data().split()[0].decode() == hashlib.md5(big + b"!").hexdigest()


async def test_a_cancelled_waiting_write_queues_nothing_and_its_id_can_be_retried(
    no_leaks: None, manager: ProcessManager, sink: Any, gate: tuple[Path, int]
) -> None:
    first = _payload(WRITE_QUEUE_BYTES, 4)
    second = _payload(4 * MiB, 5)
    await manager.start("p", _gated_md5(gate[0], len(first) + len(second)))
    assert await manager.write("p", first, "w1") is WriteStatus.ACCEPTED
    waiting = asyncio.ensure_future(manager.write("p", second, "w2"))
    await asyncio.sleep(0)
    assert not waiting.done()
    waiting.cancel()  # the connection went away
    with pytest.raises(asyncio.CancelledError):
        await waiting
    os.write(gate[1], b"go\n")
    # Not remembered: the retry writes (a remembered id would answer without writing).
    assert await asyncio.wait_for(manager.write("p", second, "w2"), 10) is WriteStatus.ACCEPTED
    rec = await sink.closed("p")
    assert rec.data().split()[0].decode() == hashlib.md5(first + second).hexdigest()
