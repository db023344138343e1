"""Jobs that run long give their place in the worker pool to jobs waiting for one
(``fs/workers.py``, ``STUCK_AFTER``): a call on a hung mount may never return."""

from __future__ import annotations

import asyncio
import threading

from exec_server.fs import workers
from exec_server.fs.workers import WorkerPool

WAIT = 20.0


async def test_a_waiting_job_gets_a_thread_once_the_running_ones_are_stuck() -> None:
    pool = WorkerPool(max_workers=2, idle_timeout=1.0)
    release = threading.Event()
    started = [threading.Event(), threading.Event()]

    stuck_threads: set[int] = set()

    def stuck(i: int) -> str:
        stuck_threads.add(threading.get_ident())
        started[i].set()
        assert release.wait(WAIT)
        return f"stuck {i}"

    blocked = [asyncio.ensure_future(pool.run(stuck, i)) for i in range(2)]
    try:
        for event in started:
            assert await asyncio.to_thread(event.wait, WAIT)
        loop = asyncio.get_running_loop()
        began = loop.time()
        served_by = await asyncio.wait_for(pool.run(threading.get_ident), WAIT)
        assert served_by not in stuck_threads  # a third thread
        # Not before the running jobs were stuck for STUCK_AFTER seconds.
        assert loop.time() - began >= workers.STUCK_AFTER * 0.9
        assert not any(b.done() for b in blocked)
        assert pool.threads == 1  # the stuck two are counted out of the limit
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
