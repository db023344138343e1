"""A confined ``fs/writeFile`` that is cancelled, times out or whose helper dies
never leaves its temp file behind, and the target is the whole old or new file.

Found by an audit: a 40 MiB write under a workspace-write context whose client
disconnected while the helper child was writing got its child SIGKILLed, and the
child's named ``.<target>.<random>.tmp`` (up to the whole 40 MiB) stayed in the
workspace. Now (docs/sandboxed-fs.md) the child writes into an unnamed file
(``O_TMPFILE``) that gets a name only once complete, the server removes the temp
name it chose after a helper dies in the instant it has one, and a cancelled
write's child finishes instead of being killed half way, as a direct write does.

The zygote's ``test_pause`` hook (``--test-hooks``) stops the child at a stage of
the write and tells the test through a FIFO, so every case below cancels or kills
a child that is provably in the middle of writing (``write``: half the data is in
the new file) or putting its file in place (``linked``: the temp name exists).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from exec_server.client.fs import LocalFileSystem
from exec_server.config import ServerConfig
from exec_server.exceptions import InternalError
from exec_server.fs.confined import SandboxedFileSystem
from exec_server.fs.fdops import temp_name
from exec_server.fs.helper.client import Zygote, remove_temp_file
from exec_server.fs.helper.confine import landlock_abi
from exec_server.process.spec import LaunchSpec
from exec_server.sandbox.manager import SandboxManager

TIMEOUT = 10.0
#: the helper timeout of the cases that reach it (the pause comes within milliseconds).
SHORT = 2.0
OLD = b"old contents\n" * 40_000
NEW = os.urandom(1 << 20)
NAME = "target.bin"


def service(timeout: float = TIMEOUT) -> SandboxedFileSystem:
    """A zygote service with failure injection on."""
    config = ServerConfig(fs_helper_timeout=timeout)
    zygote = Zygote(test_hooks=True, prefork=False)
    return SandboxedFileSystem(config, SandboxManager(config), mode="zygote", zygote=zygote)


def contents(path: Path) -> bytes:
    return path.read_bytes()


def temp_files(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.startswith(".") and n.endswith(".tmp"))


class Pause:
    """Stops a write's child at ``stage`` until :meth:`release` (the zygote's
    ``test_pause`` hook); the FIFOs live in ``where``, outside the written directory."""

    def __init__(self, where: Path, stage: str, *, named: bool = False) -> None:
        where.mkdir(exist_ok=True)
        paused, resume = where / "paused", where / "resume"
        os.mkfifo(paused)
        os.mkfifo(resume)
        # Held open by the test, so the child's opens never block: it writes to a
        # reader that exists, and reads from a FIFO that has a writer.
        self._paused = os.open(paused, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self._resume = os.open(resume, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        self.spec = {"stage": stage, "paused": str(paused), "resume": str(resume), "named": named}

    def inject(self, sfs: SandboxedFileSystem) -> None:
        """Make every request of ``sfs`` carry the hook."""
        zygote = sfs.zygote
        original = zygote.run

        async def run(
            header: dict[str, object],
            data: Any = b"",
            *,
            timeout: float,  # noqa: ASYNC109
            owner: Any = None,
        ) -> Any:
            return await original(
                {**header, "test_pause": self.spec}, data, timeout=timeout, owner=owner
            )

        zygote.run = run  # type: ignore[method-assign]

    async def reached(self) -> int:
        """Wait until the child is paused; returns its pid."""
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        loop.add_reader(self._paused, ready.set)
        try:
            async with asyncio.timeout(TIMEOUT):
                await ready.wait()
        finally:
            loop.remove_reader(self._paused)
        stage, pid = os.read(self._paused, 100).decode().split()
        assert stage == self.spec["stage"]
        return int(pid)

    def release(self) -> None:
        os.write(self._resume, b"g")

    def close(self) -> None:
        os.close(self._paused)
        os.close(self._resume)


def unnamed_file_size(pid: int, directory: Path) -> int | None:
    """The size of the unnamed (``O_TMPFILE``) file in ``directory`` that ``pid`` has
    open, if any: its ``/proc`` link reads ``<directory>/#<inode> (deleted)``."""
    fds = Path(f"/proc/{pid}/fd")
    for fd in fds.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith(f"{directory}/#"):
            return os.stat(fd).st_size
    return None


@contextlib.asynccontextmanager
async def paused_service(
    layout: Any,
    stage: str,
    *,
    named: bool = False,
    timeout: float = TIMEOUT,  # noqa: ASYNC109
) -> AsyncIterator[tuple[SandboxedFileSystem, Pause]]:
    """A zygote service whose write children pause at ``stage``; closed afterwards."""
    sfs = service(timeout)
    pause = Pause(layout.root / "ctl", stage, named=named)
    pause.inject(sfs)
    try:
        yield sfs, pause
    finally:
        pause.close()
        await sfs.aclose()


async def cancel(write: asyncio.Task[None]) -> None:
    """Cancel the caller's call (as a disconnect does) and see it cancelled."""
    write.cancel()
    await asyncio.wait({write}, timeout=TIMEOUT)
    assert write.cancelled()


async def paused_mid_write(
    sfs: SandboxedFileSystem, pause: Pause, target: Path, context: dict[str, Any]
) -> tuple[asyncio.Task[None], int]:
    """Start writing NEW over ``target`` and wait until its child is paused there."""
    fs = LocalFileSystem(confined=sfs)
    write = asyncio.create_task(fs.write_file(target, NEW, sandbox=context))
    pid = await pause.reached()
    assert contents(target) == OLD
    temps = temp_files(target.parent)
    if pause.spec["stage"] == "linked":
        # Putting the finished file in place: the temp name exists right now.
        assert len(temps) == 1 and contents(target.parent / temps[0]) == NEW
    elif pause.spec["named"]:
        # As where O_TMPFILE is missing (and as every write was before the fix).
        assert len(temps) == 1 and (target.parent / temps[0]).stat().st_size == len(NEW) // 2
    else:
        # Half the data is in an unnamed file nobody else can see.
        assert temps == []
        assert unnamed_file_size(pid, target.parent) == len(NEW) // 2
    return write, pid


@pytest.fixture
def target(layout: Any) -> Path:
    path: Path = layout.allowed / NAME
    path.write_bytes(OLD)
    return path


@pytest.mark.parametrize("named", [False, True], ids=["unnamed", "named"])
async def test_a_cancelled_write_is_finished_not_killed(
    no_leaks: None, layout: Any, ctx: Any, target: Path, named: bool, process_gone: Any
) -> None:
    """The audit's case: the caller goes away while the child writes. As on the
    direct route, the write is carried out; nothing is left beside it."""
    async with paused_service(layout, "write", named=named) as (sfs, pause):
        write, pid = await paused_mid_write(sfs, pause, target, ctx.ww(layout.allowed))
        await cancel(write)
        assert contents(target) == OLD  # the child is still paused
        pause.release()
        await asyncio.wait_for(sfs.zygote.drain(), TIMEOUT)
        await process_gone(pid)
        assert contents(target) == NEW
        assert temp_files(layout.allowed) == []


@pytest.mark.parametrize("named", [False, True], ids=["unnamed", "named"])
async def test_a_cancelled_write_that_then_hangs_is_killed_at_the_timeout(
    no_leaks: None, layout: Any, ctx: Any, target: Path, named: bool, process_gone: Any
) -> None:
    """A cancelled write's child finishes within the call's timeout or is killed;
    either way the temp file goes and the old file stays whole."""
    async with paused_service(layout, "write", named=named, timeout=SHORT) as (sfs, pause):
        write, pid = await paused_mid_write(sfs, pause, target, ctx.ww(layout.allowed))
        await cancel(write)
        # Never released: the background wait ends at the timeout with a kill.
        await asyncio.wait_for(sfs.zygote.drain(), TIMEOUT)
        await process_gone(pid)
        assert contents(target) == OLD
        assert temp_files(layout.allowed) == []


@pytest.mark.parametrize("how", ["timeout", "sigkill"])
@pytest.mark.parametrize(
    ("stage", "named"),
    [("write", False), ("write", True), ("linked", False), ("linked", True)],
    ids=["write-unnamed", "write-named", "linked-unnamed", "linked-named"],
)
async def test_a_killed_write_leaves_no_temp_file(
    no_leaks: None, layout: Any, ctx: Any, target: Path, stage: str, named: bool, how: str
) -> None:
    """Killed at the timeout, or by anyone else, while writing its data or while its
    finished file has the temp name: the old file stays, whole, and alone."""
    timeout = SHORT if how == "timeout" else TIMEOUT
    async with paused_service(layout, stage, named=named, timeout=timeout) as (sfs, pause):
        write, pid = await paused_mid_write(sfs, pause, target, ctx.ww(layout.allowed))
        if how == "sigkill":
            os.kill(pid, signal.SIGKILL)
            message = "fs sandbox helper failed with status signal: 9 (SIGKILL)"
        else:
            message = f"fs sandbox helper timed out after {SHORT:g}s and was killed"
        with pytest.raises(InternalError) as info:
            await asyncio.wait_for(write, TIMEOUT)
        assert info.value.message == message
        assert contents(target) == OLD
        assert temp_files(layout.allowed) == []


async def test_shutdown_while_a_cancelled_write_finishes(
    no_leaks: None, layout: Any, ctx: Any, target: Path, process_gone: Any
) -> None:
    """``aclose`` kills the child a cancelled write left running and waits for it:
    no process, no temp file, the old file whole."""
    async with paused_service(layout, "linked") as (sfs, pause):
        write, pid = await paused_mid_write(sfs, pause, target, ctx.ww(layout.allowed))
        await cancel(write)
        await asyncio.wait_for(sfs.aclose(), TIMEOUT)
        await process_gone(pid)
        assert contents(target) == OLD
        assert temp_files(layout.allowed) == []


async def test_a_killed_write_of_a_new_file_leaves_nothing(
    no_leaks: None, layout: Any, ctx: Any
) -> None:
    """A write that creates its file writes an unnamed file, linked at the target's
    own name once complete (there is no temp name): killed before, nothing is left."""
    async with paused_service(layout, "write") as (sfs, pause):
        path = layout.allowed / "fresh.bin"
        fs = LocalFileSystem(confined=sfs)
        write = asyncio.create_task(fs.write_file(path, NEW, sandbox=ctx.ww(layout.allowed)))
        pid = await pause.reached()
        assert unnamed_file_size(pid, layout.allowed) == len(NEW) // 2
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(InternalError):
            await asyncio.wait_for(write, TIMEOUT)
        assert os.listdir(layout.allowed) == ["link"]


@pytest.mark.parametrize("confinement", ["helper-bwrap", "helper-landlock"])
async def test_the_one_shot_helper_path_removes_its_temp_name(
    no_leaks: None,
    layout: Any,
    ctx: Any,
    target: Path,
    monkeypatch: pytest.MonkeyPatch,
    confinement: str,
) -> None:
    """The one-shot helper (``--codex-run-as-fs-helper``) is killed when its caller
    goes away or the timeout passes: had that happened while its finished file had
    the temp name the server gave it, the server removes that name. (The helper has
    no pause hook: ``_spawn`` stands in for one killed at that instant.)"""
    backend = confinement.removeprefix("helper-")
    if backend == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap not installed")
    if backend == "landlock" and landlock_abi() <= 0:
        pytest.skip("kernel without Landlock")
    config = ServerConfig(fs_helper_timeout=TIMEOUT, sandbox_backend=backend)  # type: ignore[arg-type]
    sfs = SandboxedFileSystem(config, SandboxManager(config), mode="helper")
    fs = LocalFileSystem(confined=sfs)
    spawned: list[str] = []

    async def killed_while_linked(
        self: SandboxedFileSystem, spec: LaunchSpec, message: bytes
    ) -> tuple[bytes, bytes, int]:
        for fd in spec.pass_fds:
            os.close(fd)
        token = json.loads(message)["x-exec-server"].get("tmp", "0123456789ab")
        name = temp_name(NAME, token)
        (layout.allowed / name).write_bytes(NEW)  # what the helper had put there
        spawned.append(name)
        return b"", b"", signal.SIGKILL  # wait status: killed by SIGKILL

    monkeypatch.setattr(SandboxedFileSystem, "_spawn", killed_while_linked)
    try:
        with pytest.raises(InternalError) as info:
            await fs.write_file(target, NEW, sandbox=ctx.ww(layout.allowed))
        assert "signal: 9 (SIGKILL)" in info.value.message
        assert len(spawned) == 1
        assert temp_files(layout.allowed) == []
        assert contents(target) == OLD
    finally:
        await sfs.aclose()


def test_temp_file_removal_touches_nothing_else(tmp_path: Path) -> None:
    """The server's removal follows no symlink, removes only a regular file, and only
    in the directory it names (not one swapped in through a symlink)."""
    root = Path(os.path.realpath(tmp_path))
    work, elsewhere = root / "work", root / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    name = temp_name(NAME, "0123456789ab")

    (elsewhere / name).write_text("keep")
    (work / name).symlink_to(elsewhere / name)
    remove_temp_file(str(work), name)  # a symlink at the name: not ours, not followed
    assert (work / name).is_symlink() and (elsewhere / name).read_text() == "keep"
    (work / name).unlink()

    (work / name).mkdir()
    remove_temp_file(str(work), name)  # a directory: left alone
    assert (work / name).is_dir()
    (work / name).rmdir()

    swapped = root / "swapped"
    swapped.symlink_to(elsewhere)
    remove_temp_file(str(swapped), name)  # the directory is not where it was checked
    assert (elsewhere / name).read_text() == "keep"

    (work / name).write_text("leftover")
    remove_temp_file(str(work), name)
    assert not (work / name).exists()
    remove_temp_file(str(root / "gone"), name)  # a vanished directory: nothing to do
