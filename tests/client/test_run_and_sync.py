"""The one-call ``run``, ``list_processes``, ``spawn(sandbox=...)``, the
``async with connect(...)`` form and the blocking facade ``exec_server.sync``."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from exec_server.client import (
    ExecServerClient,
    ProcessError,
    ProcessTimeoutError,
)
from exec_server.client.sandbox_contexts import read_only, workspace_write


async def test_run_returns_code_and_output(backend: Any, tmp_path: Path) -> None:
    done = await backend.run(["sh", "-c", "echo out; echo err >&2; exit 3"], cwd=str(tmp_path))
    assert (done.exit_code, done.stdout, done.stderr) == (3, b"out\n", b"err\n")


async def test_run_shell_string_and_server_env(backend: Any) -> None:
    done = await backend.run("echo $((6 * 7)) | tr 4 x; command -v sh >/dev/null && echo p",
                             shell=True)
    assert done.stdout == b"x2\np\n"  # PATH came from the server's environment


async def test_run_refuses_a_string_without_shell(backend: Any) -> None:
    with pytest.raises(TypeError, match="shell=True"):
        await backend.run("ls -la")


async def test_run_check_raises_with_the_output(backend: Any) -> None:
    with pytest.raises(ProcessError) as info:
        await backend.run(["sh", "-c", "echo partial; echo bad >&2; exit 5"], check=True)
    err = info.value
    assert (err.exit_code, err.stdout, err.stderr) == (5, b"partial\n", b"bad\n")
    assert err.argv == ("sh", "-c", "echo partial; echo bad >&2; exit 5")
    assert not isinstance(err, TimeoutError)


async def test_run_input(backend: Any) -> None:
    done = await backend.run(["tr", "a-z", "A-Z"], input=b"hello\n")
    assert (done.exit_code, done.stdout) == (0, b"HELLO\n")


async def test_run_timeout_terminates_the_group(backend: Any, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    script = f"sleep 300 & echo $! > {pidfile}; echo started; wait"
    with pytest.raises(ProcessTimeoutError) as info:
        await backend.run(["sh", "-c", script], timeout=1.0)
    err = info.value
    assert isinstance(err, TimeoutError) and isinstance(err, ProcessError)
    assert err.stdout == b"started\n"
    assert err.exit_code == 128 + 15  # SIGTERM to the group
    # the background sleep was in the group too: it is gone (or a zombie being reaped)
    assert _state(int(pidfile.read_text())) in ("gone", "Z")
    assert backend.list_processes() == []


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except FileNotFoundError:
        return "gone"


async def test_list_processes(backend: Any) -> None:
    proc = await backend.start(["sleep", "300"], env={"PATH": "/usr/bin:/bin"})
    listed = backend.list_processes()
    assert [(p.process_id, p.argv) for p in listed] == [(proc.process_id, ("sleep", "300"))]
    await proc.terminate()
    await proc.wait()
    assert backend.list_processes() == []


async def test_spawn_sandbox_context(backend: Any, tmp_path: Path) -> None:
    from exec_server.sandbox.select import SandboxUnavailableError, select_backend

    try:
        select_backend("auto")
    except SandboxUnavailableError as exc:
        pytest.skip(str(exc))
    env = {"PATH": "/usr/bin:/bin"}
    denied = await backend.start(["touch", "ro"], cwd=str(tmp_path), env=env,
                                 sandbox=read_only(tmp_path))
    assert (await denied.wait()).code != 0
    assert not (tmp_path / "ro").exists()
    (tmp_path / ".git").mkdir()
    done = await backend.run(["sh", "-c", "touch rw; touch .git/hook"], cwd=str(tmp_path),
                             sandbox=workspace_write(tmp_path))
    assert done.exit_code != 0  # .git stays read-only
    assert (tmp_path / "rw").exists() and not (tmp_path / ".git" / "hook").exists()


async def test_connect_as_async_context_manager(server: Any) -> None:
    async with ExecServerClient.connect(server.url) as client:
        assert client.connected
        done = await client.run(["true"])
        assert done.exit_code == 0
    assert not client.connected
    # the awaited form still works
    client = await ExecServerClient.connect(server.url)
    await client.aclose()


def test_sync_facade(no_leaks: None, server: Any, tmp_path: Path) -> None:
    from exec_server.sync import ExecServerClient as SyncClient

    threads_before = threading.active_count()
    with SyncClient.connect(server.url) as client:
        done = client.run(["sh", "-c", "echo hi; exit 4"], cwd=str(tmp_path))
        assert (done.exit_code, done.stdout) == (4, b"hi\n")
        with pytest.raises(ProcessTimeoutError):
            client.run(["sleep", "300"], timeout=0.5)
        proc = client.spawn(["cat"], env={"PATH": "/usr/bin:/bin"}, pipe_stdin=True)
        assert [p.process_id for p in client.list_processes()] == [proc.process_id]
        proc.write(b"abc")
        proc.close_stdin()
        assert proc.collect(timeout=30).stdout == b"abc"
        client.fs.write_file(str(tmp_path / "f"), b"data")
        assert client.fs.read_file(str(tmp_path / "f")) == b"data"
        slow = client.spawn(["sleep", "300"], env={"PATH": "/usr/bin:/bin"})
        with pytest.raises(TimeoutError):
            slow.wait(timeout=0.2)
        assert slow.terminate()
        assert slow.wait(timeout=30).code == 128 + 15
    assert threading.active_count() == threads_before
    assert os.path.exists(tmp_path / "f")


def test_sync_fs_has_the_async_calls_and_their_arguments(
    no_leaks: None, server: Any, tmp_path: Path
) -> None:
    from exec_server.exceptions import ExecServerError
    from exec_server.sync import ExecServerClient as SyncClient

    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "d" / "f").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "d" / "f")
    with SyncClient.connect(server.url) as client:
        walked = client.fs.walk(str(tmp_path / "d"), max_depth=5)
        assert sorted((e.path, e.is_directory) for e in walked.entries) == [
            (str(tmp_path / "d" / "e"), True), (str(tmp_path / "d" / "f"), False)
        ]
        assert client.fs.read_file(str(tmp_path / "link")) == b"x"
        with pytest.raises(ExecServerError) as refused:
            client.fs.read_file(str(tmp_path / "link"), follow_symlinks=False)
        assert refused.value.path == str(tmp_path / "link")
        assert client.fs.get_metadata(str(tmp_path / "d"), follow_symlinks=False).is_directory
