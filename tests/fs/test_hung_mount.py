"""A path on a hung mount never stalls the server (fs calls and spawns run in fs/pool.py).

The mount is a FUSE filesystem whose daemon never answers, not even its INIT:
every look-up under it waits until the test closes ``/dev/fuse``, which fails
the waiting calls with ``ENOTCONN``. While one connection's call waits there,
other connections must be served (a ``stat`` on the event loop used to freeze
the whole server), and calls stuck in every worker thread must not hold up
the calls that need one (upstream's blocking pool has 512 threads).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from exec_server._os.linux import c_int, c_ulong, call_syscall
from exec_server.client import ExecServerClient
from exec_server.client.fs import RemoteFileSystem
from exec_server.client.sandbox_contexts import workspace_write
from exec_server.exceptions import ExecServerError
from exec_server.fs import pool as workers

WAIT = 20.0
_MS_NOSUID, _MS_NODEV, _MNT_DETACH = 2, 4, 2


class HungMount:
    """A FUSE mount at ``path`` that never answers until :meth:`release`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        opts = f"fd={self._fd},rootmode=40000,user_id=0,group_id=0".encode()
        try:
            call_syscall("mount", b"hungfuse", os.fsencode(path), b"fuse",
                         c_ulong(_MS_NOSUID | _MS_NODEV), opts)
        except OSError:
            os.close(self._fd)
            raise

    def release(self) -> None:
        """Close the daemon's end: every waiting call fails with ENOTCONN; detach."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            with contextlib.suppress(OSError):
                call_syscall("umount2", os.fsencode(self.path), c_int(_MNT_DETACH))


@pytest.fixture
def hung(tdir: Path) -> Iterator[HungMount]:
    mnt = tdir / "mnt"
    mnt.mkdir()
    try:
        mount = HungMount(mnt)
    except OSError as exc:  # no /dev/fuse, not root, ...
        pytest.skip(f"cannot mount a FUSE filesystem here: {exc}")
    try:
        yield mount
    finally:
        mount.release()


@contextlib.asynccontextmanager
async def _clients(server: Any, n: int) -> AsyncIterator[list[RemoteFileSystem]]:
    """``n`` connections to the server (a process of its own: were its loop to stall,
    this test's would not, and it would fail instead of hanging)."""
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(await ExecServerClient.connect(server.url))
            for _ in range(n)
        ]
        yield [RemoteFileSystem(client) for client in clients]


def _calls(target: Path, tdir: Path, ctx: Any = None) -> dict[str, Any]:
    return {
        "getMetadata": lambda fs: fs.get_metadata(target, sandbox=ctx),
        "readFile": lambda fs: fs.read_file(target, sandbox=ctx),
        "writeFile": lambda fs: fs.write_file(target, b"x", sandbox=ctx),
        "createDirectory": lambda fs: fs.create_directory(target, recursive=True, sandbox=ctx),
        "remove": lambda fs: fs.remove(target, recursive=True, force=True, sandbox=ctx),
        "readDirectory": lambda fs: fs.read_directory(target, sandbox=ctx),
        "copy": lambda fs: fs.copy(target, tdir / "copied", recursive=False, sandbox=ctx),
        "canonicalize": lambda fs: fs.canonicalize(target, sandbox=ctx),
    }


METHODS = [
    "getMetadata",
    "readFile",
    "writeFile",
    "createDirectory",
    "remove",
    "readDirectory",
    "copy",
    "canonicalize",
]


@pytest.mark.parametrize("sandboxed", [False, True], ids=["direct", "workspace-write"])
@pytest.mark.parametrize("method", METHODS)
async def test_a_call_into_a_hung_mount_does_not_stall_other_connections(
    server: Any, hung: HungMount, tdir: Path, method: str, sandboxed: bool, wait_until: Any
) -> None:
    """Direct, and under the current client's workspace-write context: its reads run
    in the server, its writes are checked (lstat, realpath) before a confined helper
    runs them, and the context itself is decoded (realpath of its roots) first."""
    (tdir / "ok.txt").write_bytes(b"fine")
    ctx = workspace_write(tdir, tmp=False) if sandboxed else None
    async with _clients(server, 2) as (stuck, other):
        waiting = asyncio.ensure_future(_calls(hung.path / "x", tdir, ctx)[method](stuck))
        try:
            # Stuck on the mount before the other calls are sent.
            await wait_until(lambda: _threads_waiting_on_fuse(server.pid) >= 1, WAIT)
            async with asyncio.timeout(WAIT):
                meta = await other.get_metadata(tdir / "ok.txt")
                assert meta.size == 4
                assert await other.read_file(tdir / "ok.txt") == b"fine"
                await other.write_file(tdir / "new.txt", b"new")
                names = {e.file_name for e in await other.read_directory(tdir)}
                assert {"ok.txt", "new.txt"} <= names
            assert not waiting.done()  # still waiting on the mount
        finally:
            hung.release()
        # Aborted: the call fails (as upstream's) or, confined, may find the
        # directory under the detached mount; either way it ends.
        outcome = await asyncio.wait_for(asyncio.gather(waiting, return_exceptions=True), WAIT)
        if not sandboxed:
            assert isinstance(outcome[0], ExecServerError), outcome
            assert "not connected" in str(outcome[0])


def _threads_waiting_on_fuse(pid: int) -> int:
    """Threads of ``pid`` and of its descendants (a spawn's ``vfork`` child, the
    sandbox helpers) blocked in the FUSE request path."""
    count = 0
    for tid in _listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/wchan") as f:
            count += f.read().startswith("fuse")
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as f:
            # A child is listed by the thread that made it.
            count += sum(_threads_waiting_on_fuse(int(child)) for child in f.read().split())
    return count


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


async def test_calls_stuck_in_every_worker_thread_leave_room_for_others(
    server: Any, hung: HungMount, tdir: Path, wait_until: Any
) -> None:
    """More stuck calls than the pool has threads (a connection each: a connection's
    own calls run in order); a call that needs a worker is still answered."""
    many = workers.DEFAULT_MAX_WORKERS + 4
    (tdir / "d").mkdir()
    (tdir / "d" / "f").write_bytes(b"f")
    async with _clients(server, many + 1) as clients:
        *stuck, other = clients
        waiting = [
            asyncio.ensure_future(fs.get_metadata(hung.path / f"x{i}"))
            for i, fs in enumerate(stuck)
        ]
        try:
            # Every thread the pool may start is stuck before the other call is sent.
            await wait_until(
                lambda: _threads_waiting_on_fuse(server.pid) >= workers.DEFAULT_MAX_WORKERS,
                WAIT,
            )
            async with asyncio.timeout(WAIT):
                entries = await other.read_directory(tdir / "d")
                assert [e.file_name for e in entries] == ["f"]
                await other.copy(tdir / "d" / "f", tdir / "d" / "g", recursive=False)
                assert (tdir / "d" / "g").read_bytes() == b"f"
            assert not any(w.done() for w in waiting)
        finally:
            hung.release()
        results = await asyncio.wait_for(asyncio.gather(*waiting, return_exceptions=True), WAIT)
    assert all(isinstance(r, ExecServerError) for r in results), results


async def test_a_context_rooted_in_a_hung_mount_does_not_stall_other_connections(
    server: Any,
    hung: HungMount,
    tdir: Path,
    legacy_workspace_write_context: Any,
    wait_until: Any,
) -> None:
    """Decoding a context looks at its roots (a legacy workspace-write one: is there a
    ``.git`` in the writable root?): in a worker."""
    (tdir / "ok.txt").write_bytes(b"fine")
    ctx = legacy_workspace_write_context(hung.path / "ws")
    async with _clients(server, 2) as (stuck, other):
        waiting = asyncio.ensure_future(stuck.write_file(tdir / "ok.txt", b"no", sandbox=ctx))
        try:
            await wait_until(lambda: _threads_waiting_on_fuse(server.pid) >= 1, WAIT)
            async with asyncio.timeout(WAIT):
                assert await other.read_file(tdir / "ok.txt") == b"fine"
                await other.write_file(tdir / "other.txt", b"served")
            assert not waiting.done()
        finally:
            hung.release()
        await asyncio.wait_for(asyncio.gather(waiting, return_exceptions=True), WAIT)
    assert (tdir / "ok.txt").read_bytes() == b"fine"  # outside the workspace: refused


async def test_a_process_started_in_a_hung_mount_does_not_stall_other_connections(
    server: Any, hung: HungMount, tdir: Path, wait_until: Any
) -> None:
    """The spawning thread waits until the child has changed to its cwd and exec'd:
    for a cwd on the hung mount that is a worker, not the event loop."""
    async with contextlib.AsyncExitStack() as stack:
        stuck, other = [
            await stack.enter_async_context(await ExecServerClient.connect(server.url))
            for _ in range(2)
        ]
        waiting = asyncio.ensure_future(stuck.spawn(["true"], cwd=str(hung.path / "x")))
        try:
            # The child is stuck changing to that cwd before the other call is sent.
            await wait_until(lambda: _threads_waiting_on_fuse(server.pid) >= 1, WAIT)
            async with asyncio.timeout(WAIT):
                handle = await other.spawn(["/bin/echo", "served"], cwd=str(tdir))
                done = await handle.collect()
                assert done.stdout == b"served\n"
            assert not waiting.done()
        finally:
            hung.release()
        outcome = await asyncio.wait_for(asyncio.gather(waiting, return_exceptions=True), WAIT)
    assert isinstance(outcome[0], ExecServerError), outcome
    assert "not connected" in str(outcome[0])


async def test_a_spawn_that_fails_in_a_worker_reports_it_and_frees_the_id(
    server: Any, tdir: Path
) -> None:
    """A spawn runs in a worker; its failure comes back as the OS error, and the
    process id is usable again."""
    missing = tdir / "never-looked-up" / "x"
    async with await ExecServerClient.connect(server.url) as client:
        with pytest.raises(ExecServerError, match="No such file or directory"):
            await asyncio.wait_for(client.spawn(["true"], cwd=str(missing), process_id="p"), WAIT)
        handle = await asyncio.wait_for(
            client.spawn(["/bin/echo", "again"], cwd=str(tdir), process_id="p"), WAIT
        )
        assert (await asyncio.wait_for(handle.collect(), WAIT)).stdout == b"again\n"
