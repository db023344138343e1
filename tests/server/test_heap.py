"""The server settles its start-up heap (``gc.freeze``) before serving, in both modes,
and hands memory freed by big transfers back once they stop (``HeapReleaser``)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading

from exec_server.server.heap import BIG_TRANSFER, HeapReleaser

TIMEOUT = 30.0

#: Runs the real server with ``settle_startup_heap`` wrapped to report, on
#: stderr, how many objects it froze and whether the server had answered
#: anyone yet; then prints the URL (websocket) or reads stdin to EOF (stdio).
_PROBE = textwrap.dedent(
    """
    import asyncio, gc, sys
    from exec_server.config import ServerConfig
    from exec_server.server import app

    real = app.settle_startup_heap

    def settle():
        real()
        sys.stderr.write(f"frozen {gc.get_freeze_count()}\\n")
        sys.stderr.flush()

    app.settle_startup_heap = settle

    def announce(url):
        sys.stderr.write("announced\\n")
        sys.stderr.flush()
        import os, signal
        os.kill(os.getpid(), signal.SIGTERM)  # stop at once: this test only starts it

    asyncio.run(app.run_server(ServerConfig(listen=sys.argv[1]), announce=announce))
    """
)


def _run(listen: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, listen],
        input=b"",
        capture_output=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    return done.stderr.decode().splitlines()


def test_websocket_server_freezes_its_start_up_heap_before_announcing() -> None:
    lines = _run("ws://127.0.0.1:0")
    frozen = [line for line in lines if line.startswith("frozen ")]
    assert len(frozen) == 1
    assert int(frozen[0].split()[1]) > 10_000  # the imported modules' objects
    assert lines.index(frozen[0]) < lines.index("announced")


def test_stdio_server_freezes_its_start_up_heap() -> None:
    lines = _run("stdio")
    frozen = [line for line in lines if line.startswith("frozen ")]
    assert len(frozen) == 1
    assert int(frozen[0].split()[1]) > 10_000
    assert "announced" not in lines  # stdio has no URL to announce


# -- HeapReleaser: one trim once big transfers stop ------------------------------

class _Trims:
    """A stand-in for ``malloc_trim``: counts calls and which thread made them."""

    def __init__(self) -> None:
        self.calls = 0
        self.threads: list[int] = []
        self.event = asyncio.Event()
        self._loop = asyncio.get_running_loop()

    def __call__(self) -> None:
        self.calls += 1
        self.threads.append(threading.get_ident())
        self._loop.call_soon_threadsafe(self.event.set)


async def test_small_transfers_never_start_a_trim() -> None:
    trims = _Trims()
    releaser = HeapReleaser(trims, delay=0.0)
    for size in (0, 1, 64 << 10, BIG_TRANSFER - 1):
        releaser.note_transfer(size)
    assert releaser._timer is None
    assert releaser.releases == 0


async def test_a_burst_of_big_transfers_makes_one_trim_in_a_worker_thread() -> None:
    trims = _Trims()
    releaser = HeapReleaser(trims, delay=0.05)
    releaser.note_transfer(BIG_TRANSFER)
    first = releaser._timer
    assert first is not None
    releaser.note_transfer(64 << 20)  # another one before the delay: the countdown restarts
    assert first.cancelled()
    assert releaser._timer is not first
    async with asyncio.timeout(TIMEOUT):
        await trims.event.wait()
    assert trims.calls == 1
    assert releaser.releases == 1
    assert releaser._timer is None  # nothing else pending
    assert trims.threads[0] != threading.get_ident()  # never on the event loop (~6 ms)


async def test_without_a_trim_function_nothing_is_scheduled() -> None:
    releaser = HeapReleaser(None, delay=0.0)
    releaser.note_transfer(64 << 20)
    assert releaser._timer is None
    assert releaser.releases == 0


# -- HeapReleaser.watch: a trim when the resident size grew without big messages --


class _Resident:
    """A stand-in for ``resident_bytes``: returns the sizes it is given, in turn."""

    def __init__(self, *sizes: int) -> None:
        self.sizes = list(sizes)
        self.looks = asyncio.Event()

    def __call__(self) -> int | None:
        self.looks.set()
        return self.sizes.pop(0) if len(self.sizes) > 1 else self.sizes[0]


async def _looks(resident: _Resident, count: int) -> None:
    for _ in range(count):
        resident.looks.clear()
        async with asyncio.timeout(TIMEOUT):
            await resident.looks.wait()


async def test_growth_past_the_settled_size_makes_one_trim_then_settles_again() -> None:
    mib = 1 << 20
    trims = _Trims()
    # start, +10 MiB (no trim), +600 MiB (trim), after it 550 (settles), stays: no trim
    resident = _Resident(100 * mib, 110 * mib, 700 * mib, 550 * mib, 550 * mib)
    releaser = HeapReleaser(trims, delay=0.0, resident=resident)
    releaser.watch(interval=0.0, growth=64 * mib)
    try:
        async with asyncio.timeout(TIMEOUT):
            await trims.event.wait()
        assert releaser.releases == 1
        await _looks(resident, 6)  # 550 is where it settled: no second trim
        assert releaser.releases == 1
        assert trims.calls == 1
    finally:
        releaser.unwatch()
    assert releaser._watcher is None


async def test_watching_without_a_trim_function_looks_at_nothing() -> None:
    resident = _Resident(1)
    releaser = HeapReleaser(None, resident=resident)
    releaser.watch(interval=0.0)
    assert releaser._watcher is None
    assert not resident.looks.is_set()
