"""Writes into FIFOs: whole, waiting for the reader, and never at the pool's expense.

An audit found both: ``fs/writeFile`` into a FIFO with a reader failed after
64 KiB (``EAGAIN``: the descriptor stayed non-blocking after the open), and
twenty ``fs/copy`` calls into a FIFO whose reader never reads held every thread
of the worker pool, so every connection's filesystem calls waited.
"""

from __future__ import annotations

import asyncio
import os
import select
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exec_server.client.fs import ExecutorFileSystem, LocalFileSystem, RemoteFileSystem
from exec_server.exceptions import ExecServerError
from exec_server.fs import pool as workers
from exec_server.fs.pool import WorkerPool, waiting_on_others

TIMEOUT = 30.0
MIB = 1 << 20


class _Reader(threading.Thread):
    """Reads a FIFO until its writer closes it (opened before the writer comes, so
    the writer's open finds a reader)."""

    def __init__(self, fifo: Path) -> None:
        super().__init__(daemon=True)
        self.fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        self.got = bytearray()

    def run(self) -> None:
        # Before any writer came, a read is EOF at once but poll waits (no POLLHUP
        # until a writer has come and gone), so wait for data first.
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        try:
            while poller.poll(TIMEOUT * 1000):
                try:
                    chunk = os.read(self.fd, 4096)
                except BlockingIOError:
                    continue
                if not chunk:
                    return  # the writer closed it
                self.got += chunk
        finally:
            os.close(self.fd)


@pytest.fixture
def fifo(tdir: Path) -> Path:
    path = tdir / "fifo"
    os.mkfifo(path)
    return path


class _StalledReader:
    """Holds a FIFO open for reading and never reads, until :meth:`leave`."""

    def __init__(self, fifo: Path) -> None:
        self.fd: int | None = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)

    def leave(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


@pytest.fixture
def stalled_reader(fifo: Path) -> Iterator[_StalledReader]:
    reader = _StalledReader(fifo)
    try:
        yield reader
    finally:
        reader.leave()


async def test_a_write_into_a_fifo_reaches_its_reader_whole(
    fs: ExecutorFileSystem, fifo: Path
) -> None:
    data = os.urandom(MIB)  # sixteen pipe buffers
    reader = _Reader(fifo)
    reader.start()
    async with asyncio.timeout(TIMEOUT):
        await fs.write_file(fifo, data)
        await asyncio.to_thread(reader.join)
    assert bytes(reader.got) == data


@pytest.mark.parametrize("way", ["local", "ws"])
async def test_copies_into_a_stalled_fifo_leave_the_pool_to_other_calls(
    way: str, live_server: Any, tdir: Path, fifo: Path, stalled_reader: _StalledReader
) -> None:
    """One caller's copies wait on the reader; another's calls that need a worker
    thread are still answered (a connection's own calls stay in order behind
    its waiting ones, as they must)."""
    many = workers.DEFAULT_MAX_WORKERS + 4
    copiers: list[ExecutorFileSystem]
    other: ExecutorFileSystem
    if way == "local":
        other = LocalFileSystem()
        copiers = [other] * many
    else:  # a connection per copy, as a connection's own calls run in order
        copiers = [RemoteFileSystem(await live_server.client()) for _ in range(many)]
        other = RemoteFileSystem(await live_server.client())
    source = tdir / "source.bin"
    source.write_bytes(os.urandom(MIB))
    copies = [
        asyncio.ensure_future(copier.copy(source, fifo, recursive=False)) for copier in copiers
    ]
    try:
        async with asyncio.timeout(TIMEOUT):
            await other.write_file(tdir / "other.txt", b"still served")
            assert "other.txt" in {e.file_name for e in await other.read_directory(tdir)}
        assert not any(copy.done() for copy in copies)  # all still waiting on the reader
    finally:
        stalled_reader.leave()
        async with asyncio.timeout(TIMEOUT):
            results = await asyncio.gather(*copies, return_exceptions=True)
    # The reader left: each copy ended with a broken pipe (or had finished).
    for result in results:
        assert result is None or isinstance(result, ExecServerError), result


async def test_a_job_waiting_on_others_gives_its_thread_back() -> None:
    pool = WorkerPool(max_workers=1)
    entered, gate = threading.Event(), threading.Event()

    def wait_for_reader() -> str:
        with waiting_on_others():
            entered.set()
            assert gate.wait(TIMEOUT)
        return "written"

    waiting = asyncio.ensure_future(pool.run(wait_for_reader))
    try:
        async with asyncio.timeout(TIMEOUT):
            await asyncio.to_thread(entered.wait, TIMEOUT)
            # The pool's only place was given back: this job gets a thread.
            assert await pool.run(lambda: "other call") == "other call"
    finally:
        gate.set()
    async with asyncio.timeout(TIMEOUT):
        assert await waiting == "written"
    assert pool.threads <= 2


async def test_places_given_back_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "MAX_WAITING", 1)
    pool = WorkerPool(max_workers=1)
    gate = threading.Event()
    entered = [threading.Event(), threading.Event()]

    def wait(i: int) -> int:
        with waiting_on_others():
            entered[i].set()
            assert gate.wait(TIMEOUT)
        return i

    first = asyncio.ensure_future(pool.run(wait, 0))
    try:
        async with asyncio.timeout(TIMEOUT):
            await asyncio.to_thread(entered[0].wait, TIMEOUT)
            second = asyncio.ensure_future(pool.run(wait, 1))
            await asyncio.to_thread(entered[1].wait, TIMEOUT)
        # The second kept its place (one given back at most): a third call queues.
        third = asyncio.ensure_future(pool.run(lambda: 3))
        await asyncio.sleep(0)  # let it be submitted
        assert pool._backlog and not third.done()
    finally:
        gate.set()
    async with asyncio.timeout(TIMEOUT):
        assert await asyncio.gather(first, second, third) == [0, 1, 3]


def test_outside_a_pool_job_it_does_nothing() -> None:
    with waiting_on_others():
        pass
