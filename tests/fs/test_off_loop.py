"""No ``fs/*`` call touches the filesystem on the event loop: every look-up, open,
read and write of a direct call runs in a worker thread (a cold disk or a hung
network mount never stalls the other connections). Nor does a sandboxed
``process/start`` through the helper zygote wait on the loop."""

from __future__ import annotations

import asyncio
import os
import select
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from exec_server.client.fs import RemoteFileSystem
from exec_server.client.sandbox_contexts import workspace_write
from exec_server.config import ServerConfig
from exec_server.fs.service import FileSystemService
from exec_server.sandbox.select import SandboxUnavailableError, select_backend
from exec_server.server.app import ExecServer
from exec_server.server.services import ServerServices
from exec_server.transport.listen import ListenAddress

from .conftest import LiveServer, open_live_server

WAIT = 30.0

#: the os calls a filesystem operation starts with (any of them can wait on a mount)
_CALLS = ("open", "stat", "lstat", "mkdir", "scandir", "listdir", "unlink", "rename", "rmdir")


def _spy(monkeypatch: pytest.MonkeyPatch, root: Path) -> list[tuple[str, int]]:
    """Note ``(call, thread)`` for every os call above on a path under ``root``."""
    seen: list[tuple[str, int]] = []
    prefix = str(root)

    def wrap(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def spy(path: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(path, (str, bytes, os.PathLike)) and os.fsdecode(path).startswith(
                prefix
            ):
                seen.append((name, threading.get_ident()))
            return real(path, *args, **kwargs)

        return spy

    for name in _CALLS:
        monkeypatch.setattr(os, name, wrap(name, getattr(os, name)))
    return seen


async def _every_operation(fs: Any, tdir: Path, sandbox: Any = None) -> None:
    """One of each ``fs/*`` operation, each checked through ``fs`` (the test's own
    checks of the disk would be on the loop thread: :func:`_check_effects`)."""
    small, big = b"s" * 1024, os.urandom(512 * 1024)
    await fs.write_file(tdir / "small", small, sandbox)
    await fs.write_file(tdir / "big", big, sandbox)
    assert await fs.read_file(tdir / "small", sandbox) == small
    assert await fs.read_file(tdir / "big", sandbox) == big
    meta = await fs.get_metadata(tdir / "small", sandbox)
    assert meta.is_file and not meta.is_directory
    await fs.create_directory(tdir / "d" / "e", sandbox=sandbox)
    await fs.create_directory(tdir / "d" / "e", sandbox=sandbox)  # exists already
    names = sorted(e.file_name for e in await fs.read_directory(tdir, sandbox))
    assert names == ["big", "d", "small"]
    await fs.copy(tdir / "small", tdir / "copy", recursive=False, sandbox=sandbox)
    await fs.remove(tdir / "d", sandbox=sandbox)
    await fs.remove(tdir / "d", sandbox=sandbox)  # gone already (force)
    assert await fs.canonicalize(tdir / "small", sandbox) == str(tdir / "small")


def _check_effects(tdir: Path) -> None:
    assert (tdir / "copy").read_bytes() == b"s" * 1024
    assert not (tdir / "d").exists()


async def test_direct_service_calls_run_in_workers(
    tdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = FileSystemService()
    seen = _spy(monkeypatch, tdir)
    loop = threading.get_ident()
    await asyncio.wait_for(service.write_file(str(tdir / "f"), b"x"), WAIT)
    assert await asyncio.wait_for(service.read_file(str(tdir / "f")), WAIT) == b"x"
    assert (await asyncio.wait_for(service.get_metadata(str(tdir / "f")), WAIT)).is_file
    mapped = await asyncio.wait_for(
        service.read_file_mapped(str(tdir / "f"), lambda b: ("big", b), 0), WAIT
    )
    assert mapped == ("big", b"x")
    monkeypatch.undo()
    assert seen, "the spy saw nothing: it no longer watches the calls made"
    assert all(thread != loop for _, thread in seen), seen


@pytest.mark.parametrize(
    "sandbox",
    [None, {"sandboxPolicy": {"type": "danger-full-access"}, "windowsSandboxLevel": "disabled"}],
    ids=["no-context", "full-access"],
)
async def test_no_fs_call_over_a_connection_touches_the_loop(
    live_server: Any, tdir: Path, monkeypatch: pytest.MonkeyPatch, sandbox: Any
) -> None:
    """Over a real connection (the server's loop is this test's loop): every
    operation, small and big, direct or under a context that reads everything."""
    fs = RemoteFileSystem(await live_server.client())
    await fs.get_metadata(tdir, sandbox)  # the context is decoded once, in a worker
    seen = _spy(monkeypatch, tdir)
    loop = threading.get_ident()
    await asyncio.wait_for(_every_operation(fs, tdir, sandbox), WAIT)
    monkeypatch.undo()
    _check_effects(tdir)
    assert {name for name, _ in seen} >= {"open", "lstat", "mkdir"}
    on_loop = [name for name, thread in seen if thread == loop]
    assert on_loop == []


@pytest.mark.parametrize("full_read", [True, False], ids=["root-read", "restricted"])
async def test_no_confined_fs_call_touches_the_loop(
    tdir: Path, monkeypatch: pytest.MonkeyPatch, full_read: bool
) -> None:
    """The same under a workspace-write context: the policy's checks and the
    server's own reads (a context that reads everything) run in workers too."""
    async with open_live_server(full_services=True) as live:
        fs = RemoteFileSystem(await live.client())
        sandbox = workspace_write(tdir, full_read=full_read, tmp=False)
        await fs.get_metadata(tdir, sandbox)  # the context is decoded once, in a worker
        seen = _spy(monkeypatch, tdir)
        loop = threading.get_ident()
        await asyncio.wait_for(_every_operation(fs, tdir, sandbox), WAIT)
        monkeypatch.undo()
    _check_effects(tdir)
    assert seen, "the spy saw nothing"
    on_loop = [name for name, thread in seen if thread == loop]
    assert on_loop == []


async def test_no_landlock_launch_waits_on_the_loop(
    no_leaks: None, tdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sandboxed ``process/start`` the helper zygote starts (Landlock backend): the
    check of its cwd runs in a worker and the zygote's report is awaited, never a
    blocking ``select`` on the loop thread. (The sandbox policy's own look-ups of the
    protected names are the sandbox manager's, not checked here.)"""
    try:
        zygote = getattr(select_backend("landlock"), "spawn_zygote", None)
    except SandboxUnavailableError as exc:
        pytest.skip(f"landlock backend unusable: {exc}")
    if zygote is None:
        pytest.skip("no helper zygote for launches")
    config = ServerConfig(sandbox_backend="landlock")
    server = ExecServer(config, services=ServerServices.create(config))
    ws_server = await server.listen_websocket(ListenAddress("127.0.0.1", 0))
    host, port = next(iter(ws_server.sockets)).getsockname()[:2]
    live = LiveServer(server, ws_server, f"ws://{host}:{port}")
    owner = object()
    try:
        client = await live.client()
        sandbox = workspace_write(tdir, tmp=False)
        await zygote.ensure_started(owner)  # else the first launch runs the launcher script
        before = zygote.spawned
        cwd_stats: list[int] = []
        selects: list[int] = []
        real_stat, real_select = os.stat, select.select

        def spy_stat(path: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(path, str) and path == str(tdir):
                cwd_stats.append(threading.get_ident())
            return real_stat(path, *args, **kwargs)

        def spy_select(*args: Any) -> Any:
            selects.append(threading.get_ident())
            return real_select(*args)

        monkeypatch.setattr(os, "stat", spy_stat)
        monkeypatch.setattr(select, "select", spy_select)
        loop = threading.get_ident()
        done = await asyncio.wait_for(
            client.run(["sh", "-c", "echo ok > out"], cwd=str(tdir), sandbox=sandbox), WAIT
        )
        monkeypatch.undo()
        assert done.exit_code == 0, done
        assert zygote.spawned == before + 1  # started by the zygote, not the launcher
        assert cwd_stats and loop not in cwd_stats
        assert loop not in selects
        assert (tdir / "out").read_text() == "ok\n"
    finally:
        await zygote.release(owner)
        await live.aclose()
