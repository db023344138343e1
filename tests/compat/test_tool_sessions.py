"""The recorded Codex tool sessions, driven through our own client library and CLI.

The replay test checks the wire; this checks that a user of
``exec_server.client`` and of ``exec-server exec`` sees what codex saw in the
recordings (CLIENT_COMPAT.md §7.2): shell output and exit code, PTY
write_stdin echo, apply_patch's effects, and a workspace-write sandbox that
really refuses an outside write.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from exec_server.client import ExecServerClient
from exec_server.client.fs import RemoteFileSystem
from exec_server.client.sandbox_contexts import workspace_write
from exec_server.patch.apply import apply_patch
from exec_server.patch.errors import ApplyError
from exec_server.protocol.types.process import EnvPolicy

TIMEOUT = 20.0

PATCH = """*** Begin Patch
*** Update File: edit_me.txt
@@
 alpha
-beta
+BETA-patched
 gamma
*** Add File: sub/dir/added.txt
+added by apply_patch
*** Delete File: delete_me.txt
*** End Patch
"""


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "workspace"
    ws.mkdir()
    (ws / "edit_me.txt").write_text("alpha\nbeta\ngamma\n")
    (ws / "delete_me.txt").write_text("bye\n")
    return ws


async def test_shell_session_through_the_library(
    server_factory: Callable[..., Any], workspace: Path
) -> None:
    env = dict(os.environ, HARNESS_EXEC_SERVER_MARKER="lib-marker")
    srv = server_factory(env=env)
    async with await ExecServerClient.connect(srv.url) as client:
        handle = await client.spawn(
            [
                "/bin/bash",
                "-lc",
                'echo remote-ok > proof.txt; cat proof.txt; echo "m=$HARNESS_EXEC_SERVER_MARKER"',
            ],
            cwd=str(workspace),
            env={"TERM": "dumb"},
            env_policy=EnvPolicy(
                inherit="all", ignore_default_excludes=True, exclude=[], set={}, include_only=[]
            ),
        )
        done = await asyncio.wait_for(handle.collect(), TIMEOUT)
    assert done.exit_code == 0
    assert done.stdout == b"remote-ok\nm=lib-marker\n"
    assert (workspace / "proof.txt").read_text() == "remote-ok\n"


async def test_tty_write_stdin_session_through_the_library(server: Any, workspace: Path) -> None:
    async with await ExecServerClient.connect(server.url) as client:
        handle = await client.spawn(
            ["/bin/bash", "-c", "read line; echo got:$line; echo late"],
            cwd=str(workspace),
            env={"PATH": "/usr/bin:/bin"},
            tty=True,
        )
        assert (await handle.write(b"hello\n")).value == "accepted"
        done = await asyncio.wait_for(handle.collect(), TIMEOUT)
    assert done.exit_code == 0
    assert done.stdout == b"hello\r\ngot:hello\r\nlate\r\n"


@pytest.mark.parametrize("sandboxed", [False, True], ids=["full-access", "workspace-write"])
async def test_apply_patch_session_through_the_library(
    server: Any, workspace: Path, sandboxed: bool
) -> None:
    sandbox = workspace_write(workspace) if sandboxed else None
    async with await ExecServerClient.connect(server.url) as client:
        affected = await apply_patch(PATCH, workspace, RemoteFileSystem(client), sandbox)
    assert affected.summary() == (
        "Success. Updated the following files:\n"
        "A sub/dir/added.txt\nM edit_me.txt\nD delete_me.txt\n"
    )
    assert (workspace / "edit_me.txt").read_text() == "alpha\nBETA-patched\ngamma\n"
    assert (workspace / "sub" / "dir" / "added.txt").read_text() == "added by apply_patch\n"
    assert not (workspace / "delete_me.txt").exists()


@pytest.fixture
def outside_dir() -> Iterator[Path]:
    """A directory outside /tmp (which workspace-write leaves writable)."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="exec-server-outside-", dir="/var/tmp"))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def test_sandboxed_apply_patch_refuses_outside_path(server: Any, outside_dir: Path) -> None:
    ws = outside_dir / "workspace"
    ws.mkdir()
    patch = "*** Begin Patch\n*** Add File: ../escaped.txt\n+nope\n*** End Patch\n"
    context = workspace_write(ws)
    async with await ExecServerClient.connect(server.url) as client:
        with pytest.raises(ApplyError, match=r"Failed to write file .*/escaped\.txt"):
            await apply_patch(patch, ws, RemoteFileSystem(client), context)
    assert not (outside_dir / "escaped.txt").exists()


def test_shell_session_through_exec_cli(server: Any, workspace: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "exec_server",
            "exec",
            "--url",
            server.url,
            "--cwd",
            str(workspace),
            "--env",
            "PATH=/usr/bin:/bin",
            "--",
            "/bin/bash",
            "-c",
            "echo remote-ok > proof.txt; cat proof.txt; echo to-stderr >&2; exit 3",
        ],
        capture_output=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert proc.returncode == 3
    assert proc.stdout == b"remote-ok\n"
    assert proc.stderr == b"to-stderr\n"
    assert (workspace / "proof.txt").read_text() == "remote-ok\n"
