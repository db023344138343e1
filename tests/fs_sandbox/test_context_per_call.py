"""A context carries no filesystem state between calls.

Codex sends the identical ``permissions`` context on every fs call;
protected subpaths (``.git``…) must be detected per request. The contexts
here have no explicit ``.git`` carve-out, so only the per-request detection
(PROTOCOL.md §6.10) protects it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from exec_server.client.fs import RemoteFileSystem
from exec_server.exceptions import ExecServerError
from exec_server.fs.confined import SandboxedFileSystem
from exec_server.protocol.types.sandbox import decode_fs_sandbox
from exec_server.sandbox.convert import fs_context
from exec_server.sandbox.policy import Access

#: the ``workspace_write_context`` fixture (tests/conftest.py).
Context = Callable[[Path], dict[str, Any]]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path.resolve() / "ws"
    ws.mkdir()
    return ws


def test_repeated_context_is_resolved_fresh_for_protected_paths(
    workspace: Path, workspace_write_context: Context
) -> None:
    # What depends on the filesystem is a `gitdir:` pointer's target (a missing
    # `.git` itself is read-only in a current context from the start).
    raw = msgspec.Raw(json.dumps(workspace_write_context(workspace)).encode())
    (workspace / "store").mkdir()
    first = fs_context(decode_fs_sandbox(raw))
    assert first is not None
    assert first.can_write(str(workspace / "store" / "config"))
    assert not first.can_write(str(workspace / ".git" / "config"))
    hit = fs_context(decode_fs_sandbox(raw))  # resolved before the pointer exists
    assert hit is not None and hit.can_write(str(workspace / "store" / "config"))
    (workspace / ".git").write_text("gitdir: store\n")
    second = fs_context(decode_fs_sandbox(raw))
    assert second is not None
    assert second == first  # the same policy, resolved again
    assert not second.can_write(str(workspace / "store" / "config"))
    assert second.resolve_access(str(workspace / "store")) is Access.READ
    assert str(workspace / "store") in second.helper_plan().read_only_subpaths
    # The first object keeps its own (older) resolution: nothing shared.
    assert first.can_write(str(workspace / "a.txt"))


def test_context_takes_server_cwd_and_tmpdir(
    workspace: Path, tmp_path: Path, workspace_write_context: Context
) -> None:
    full = workspace_write_context(workspace)
    ctx = {k: full[k] for k in ("permissions", "windowsSandboxLevel")}  # no cwd: the server's
    raw = msgspec.Raw(json.dumps(ctx).encode())
    a = fs_context(decode_fs_sandbox(raw), server_cwd=str(workspace), tmpdir="/t1")
    b = fs_context(decode_fs_sandbox(raw), server_cwd=str(tmp_path), tmpdir="/t1")
    c = fs_context(decode_fs_sandbox(raw), server_cwd=str(workspace), tmpdir="/t2")
    assert a is not None and b is not None and c is not None
    assert (a.cwd, a.tmpdir) == (str(workspace), "/t1")
    assert (b.cwd, b.tmpdir) == (str(tmp_path), "/t1")
    assert (c.cwd, c.tmpdir) == (str(workspace), "/t2")


async def test_git_created_between_two_calls_is_not_writable(
    zygote_sfs: SandboxedFileSystem,
    make_caller: Any,
    workspace: Path,
    workspace_write_context: Context,
) -> None:
    fs = RemoteFileSystem(make_caller(zygote_sfs))
    sandbox = workspace_write_context(workspace)
    target = workspace / ".git" / "HEAD"
    (workspace / "probe").mkdir()
    await fs.write_file(str(workspace / "probe" / "HEAD"), b"x", sandbox=sandbox)
    (workspace / ".git").mkdir()
    with pytest.raises(ExecServerError, match="not permitted by filesystem sandbox"):
        await fs.write_file(str(target), b"evil", sandbox=sandbox)
    assert not target.exists()
    assert (workspace / "probe" / "HEAD").read_bytes() == b"x"
