"""Blocking filesystem work never stalls the server, and the worker pool behaves."""

from __future__ import annotations

import asyncio
import base64
import functools
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from exec_server.client.fs import RemoteFileSystem
from exec_server.exceptions import InvalidRequestError
from exec_server.fs import ops
from exec_server.fs.workers import NEAR_JOB_LIMIT, WorkerPool, current_cpu, job_kind
from exec_server.protocol import fs_types as t

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


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux affinity API")
async def test_pool_job_runs_with_the_full_cpu_set() -> None:
    """The worker is narrowed to the caller's CPU only to wake it; the job itself
    runs with every allowed CPU, so long jobs can still spread out."""
    allowed = os.sched_getaffinity(0)
    pool = WorkerPool(max_workers=2)
    for _ in range(5):  # new thread first, then the same idle thread re-used
        seen = await asyncio.wait_for(pool.run(os.sched_getaffinity, 0), WAIT)
        assert seen == allowed
    assert current_cpu() in allowed


async def test_pool_without_cpu_following_runs_jobs() -> None:
    pool = WorkerPool(max_workers=1, follow_caller_cpu=False)
    assert await asyncio.wait_for(pool.run(lambda: 7), WAIT) == 7


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


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux scheduling policies")
async def test_pool_workers_run_as_batch_threads() -> None:
    """Workers do not preempt the event loop when woken (SCHED_BATCH)."""
    pool = WorkerPool(max_workers=1)
    policy = await asyncio.wait_for(pool.run(os.sched_getscheduler, 0), WAIT)
    assert policy == os.SCHED_BATCH
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the caller is untouched


def _job(delay: float) -> None:
    """A job whose run time the test chooses: the pool measures how long jobs run."""
    if delay:
        time.sleep(delay)


def _other_job() -> None:
    """A second kind of job."""


def test_job_kind_is_the_function_behind_partials_and_closures() -> None:
    def make() -> Callable[[], None]:
        def closure() -> None:
            pass

        return closure

    assert job_kind(functools.partial(_job, 0.0)) == job_kind(_job)
    assert job_kind(functools.partial(functools.partial(_job), 0.0)) == job_kind(_job)
    assert job_kind(make()) == job_kind(make())  # a closure made per call: one kind
    assert job_kind(_job) != job_kind(_other_job)
    assert job_kind(os.getpid) == job_kind(os.getpid)  # a builtin is its own kind


@pytest.mark.skipif(current_cpu() is None, reason="needs sched_getcpu and affinity control")
async def test_kinds_of_long_jobs_are_not_woken_on_the_callers_cpu() -> None:
    """A kind of job that runs long starts wherever the kernel places it; short
    kinds (and kinds never seen) are still woken on the caller's CPU, and a kind
    that turns short again is woken there again."""
    pool = WorkerPool(max_workers=1)
    assert pool.wakes_near(_job) and pool.wakes_near(_other_job)  # never run: short
    slow = 20 * NEAR_JOB_LIMIT
    for _ in range(3):
        await asyncio.wait_for(pool.run(_job, slow), WAIT)
    assert not pool.wakes_near(_job)
    assert not pool.wakes_near(functools.partial(_job, 0.0))  # same kind
    assert await _runs_until_near(pool, _other_job)
    assert not pool.wakes_near(_job)  # kinds are kept apart
    # The average follows the recent runs: quick runs bring the kind back.
    assert await _runs_until_near(pool, functools.partial(_job, 0.0))


async def _runs_until_near(pool: WorkerPool, job: Callable[[], None]) -> bool:
    """Run quick ``job`` until its kind is woken near again (a run the machine
    happened to preempt only delays that); False if it never is."""
    for _ in range(1000):
        await asyncio.wait_for(pool.run(job), WAIT)
        if pool.wakes_near(job):
            return True
    return False


async def test_pool_without_cpu_following_wakes_nothing_near() -> None:
    pool = WorkerPool(max_workers=1, follow_caller_cpu=False)
    await asyncio.wait_for(pool.run(_other_job), WAIT)
    assert not pool.wakes_near(_other_job)


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
