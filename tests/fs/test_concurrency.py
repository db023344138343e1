"""Blocking filesystem work never stalls the server, and the worker pool behaves."""

from __future__ import annotations

import asyncio
import base64
import os
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest

from exec_server.client.fs import RemoteFileSystem
from exec_server.exceptions import InvalidRequestError
from exec_server.fs import direct as ops
from exec_server.fs.pool import WorkerPool
from exec_server.protocol.types import fs as t

WAIT = 30.0


async def test_other_connections_served_during_long_copy(
    live_server: Any, tdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Connection A's recursive copy is held inside its worker thread; connection B
    (and a second request on a third connection) must still be answered."""
    (tdir / "src").mkdir()
    (tdir / "src" / "f").write_text("payload")
    (tdir / "other.txt").write_text("other")
    entered = threading.Event()
    release = threading.Event()
    real_copy_tree = ops._copy_tree

    def held_copy_tree(source: str, destination: str) -> None:
        entered.set()
        assert release.wait(WAIT)
        real_copy_tree(source, destination)

    monkeypatch.setattr(ops, "_copy_tree", held_copy_tree)
    fs_a = RemoteFileSystem(await live_server.client())
    fs_b = RemoteFileSystem(await live_server.client())
    fs_c = RemoteFileSystem(await live_server.client())
    copy = asyncio.create_task(fs_a.copy(tdir / "src", tdir / "dst", recursive=True))
    try:
        assert await asyncio.to_thread(entered.wait, WAIT)
        assert await asyncio.wait_for(fs_b.read_file(tdir / "other.txt"), WAIT) == b"other"
        meta, entries = await asyncio.wait_for(
            asyncio.gather(fs_c.get_metadata(tdir / "src" / "f"), fs_b.read_directory(tdir)),
            WAIT,
        )
        assert meta.size == len(b"payload")
        assert {e.file_name for e in entries} == {"src", "other.txt"}
        assert not copy.done()
    finally:
        release.set()
    await asyncio.wait_for(copy, WAIT)
    assert (tdir / "dst" / "f").read_text() == "payload"


async def test_pool_runs_jobs_in_parallel_and_propagates_errors() -> None:
    pool = WorkerPool(max_workers=4)
    gate = threading.Event()
    blocked = asyncio.ensure_future(pool.run(gate.wait, WAIT))
    # A second job completes while the first one is still blocked.
    assert await asyncio.wait_for(pool.run(lambda: 6 * 7), WAIT) == 42
    with pytest.raises(ZeroDivisionError):
        await asyncio.wait_for(pool.run(lambda: 1 / 0), WAIT)
    assert not blocked.done()
    gate.set()
    assert await asyncio.wait_for(blocked, WAIT) is True
    assert 1 <= pool.threads <= 4


async def test_pool_queues_beyond_max_workers() -> None:
    pool = WorkerPool(max_workers=1)
    gate = threading.Event()
    first = asyncio.ensure_future(pool.run(gate.wait, WAIT))
    second = asyncio.ensure_future(pool.run(lambda: "second"))
    await asyncio.sleep(0)
    assert pool.threads == 1
    assert not second.done()
    gate.set()
    assert await asyncio.wait_for(second, WAIT) == "second"
    assert await first is True


async def test_pool_cancelled_caller_drops_the_result() -> None:
    pool = WorkerPool(max_workers=2)
    gate = threading.Event()
    finished = threading.Event()

    def job() -> str:
        gate.wait(WAIT)
        finished.set()
        return "late"

    task = asyncio.ensure_future(pool.run(job))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    gate.set()
    assert await asyncio.to_thread(finished.wait, WAIT)
    # The pool keeps working afterwards.
    assert await asyncio.wait_for(pool.run(lambda: "next"), WAIT) == "next"


def test_idle_threads_exit() -> None:
    pool = WorkerPool(max_workers=3, idle_timeout=0.01)

    async def burst() -> None:
        gate = threading.Event()
        jobs = [asyncio.ensure_future(pool.run(gate.wait, WAIT)) for _ in range(3)]
        await asyncio.sleep(0)
        gate.set()
        await asyncio.wait_for(asyncio.gather(*jobs), WAIT)

    before = {t for t in threading.enumerate() if t.name == "exec-server-fs"}
    asyncio.run(burst())
    mine = [t for t in threading.enumerate() if t.name == "exec-server-fs" and t not in before]
    assert mine
    for thread in mine:
        thread.join(WAIT)
        assert not thread.is_alive()
    assert pool.threads == 0


async def test_pool_backlog_runs_in_order_on_one_thread() -> None:
    pool = WorkerPool(max_workers=1)
    order: list[int] = []
    gate = threading.Event()
    first = asyncio.ensure_future(pool.run(gate.wait, WAIT))
    rest = [asyncio.ensure_future(pool.run(order.append, i)) for i in range(5)]
    await asyncio.sleep(0)
    gate.set()
    await asyncio.wait_for(asyncio.gather(first, *rest), WAIT)
    assert order == [0, 1, 2, 3, 4]
    assert pool.threads == 1


async def test_sequential_jobs_reuse_the_thread_that_answered() -> None:
    """A worker is idle again before its answer is delivered, so the caller's next
    job finds that same thread free instead of starting another."""
    pool = WorkerPool(max_workers=4)
    threads = {await asyncio.wait_for(pool.run(threading.get_ident), WAIT) for _ in range(50)}
    assert len(threads) == 1
    assert pool.threads == 1


async def test_concurrent_big_writes_each_land_whole(live_server: Any, tdir: Path) -> None:
    """Big writes are decoded a slice at a time as they are written. Several at
    once, on four connections, one with a
    bad character in its second half: each gets its own answer, the good ones
    land whole, the refused one keeps the old file, and no temp file is left."""
    clients = [await live_server.client() for _ in range(4)]
    datas = [os.urandom((1 << 20) + k) for k in range(3)]
    bad_target = tdir / "bad"
    bad_target.write_bytes(b"old")
    text = base64.b64encode(os.urandom(1 << 20))
    offset = len(text) * 3 // 4
    bad = text[:offset] + b"*" + text[offset + 1 :]

    async def good(client: Any, k: int) -> None:
        await RemoteFileSystem(client).write_file(tdir / f"f{k}", datas[k])

    async def refused(client: Any) -> None:
        params = t.WriteFileParams(path=str(bad_target), data_base64=msgspec.Raw(b'"' + bad + b'"'))
        with pytest.raises(InvalidRequestError) as info:
            await client.call("fs/writeFile", params, t.EmptyResult)
        assert info.value.message == (
            f"fs/writeFile requires valid base64 dataBase64: Invalid symbol 42, offset {offset}."
        )

    for _ in range(3):
        jobs = [good(client, k) for k, client in enumerate(clients[:3])] + [refused(clients[3])]
        await asyncio.wait_for(asyncio.gather(*jobs), WAIT)
        for k, data in enumerate(datas):
            assert (tdir / f"f{k}").read_bytes() == data
        assert bad_target.read_bytes() == b"old"
        assert sorted(os.listdir(tdir)) == ["bad", "f0", "f1", "f2"]
