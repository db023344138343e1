"""Jobs that run long give their place in the worker pool to jobs waiting for one
(``fs/pool.py``, ``STUCK_AFTER``): a call on a hung mount may never return."""

from __future__ import annotations

import asyncio
import threading
import time

from exec_server.fs import pool as workers
from exec_server.fs.pool import WorkerPool

WAIT = 20.0


def _thread_and_time() -> tuple[int, float]:
    return threading.get_ident(), time.monotonic()


async def test_a_waiting_job_gets_a_thread_once_the_running_ones_are_stuck() -> None:
    pool = WorkerPool(max_workers=2, idle_timeout=1.0)
    release = threading.Event()
    started = [threading.Event(), threading.Event()]

    stuck_threads: set[int] = set()
    stuck_since: list[float] = []

    def stuck(i: int) -> str:
        stuck_threads.add(threading.get_ident())
        stuck_since.append(time.monotonic())
        started[i].set()
        assert release.wait(WAIT)
        return f"stuck {i}"

    blocked = [asyncio.ensure_future(pool.run(stuck, i)) for i in range(2)]
    try:
        for event in started:
            assert await asyncio.to_thread(event.wait, WAIT)
        served_by, served_at = await asyncio.wait_for(pool.run(_thread_and_time), WAIT)
        assert served_by not in stuck_threads  # a third thread
        # Not before a running job was stuck for STUCK_AFTER seconds.
        assert served_at - min(stuck_since) >= workers.STUCK_AFTER
        assert not any(b.done() for b in blocked)
        assert pool.threads <= 2  # the limit still holds for the threads counted in
    finally:
        release.set()
    assert await asyncio.wait_for(asyncio.gather(*blocked), WAIT) == ["stuck 0", "stuck 1"]


async def test_short_jobs_still_queue_behind_the_limit() -> None:
    """Jobs running for less than STUCK_AFTER keep their places: a queued job
    waits for one of them, and no thread past the limit starts."""
    pool = WorkerPool(max_workers=1, idle_timeout=1.0)
    release = threading.Event()
    started = threading.Event()
    order: list[str] = []

    def first() -> None:
        started.set()
        assert release.wait(WAIT)
        order.append("first")

    running = asyncio.ensure_future(pool.run(first))
    assert await asyncio.to_thread(started.wait, WAIT)
    queued = asyncio.ensure_future(pool.run(order.append, "second"))
    await asyncio.sleep(0)  # let it be submitted
    assert pool.threads == 1
    release.set()
    await asyncio.wait_for(asyncio.gather(running, queued), WAIT)
    assert order == ["first", "second"]
