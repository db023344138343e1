"""apply_patch under a workspace-write sandbox context (§14).

The context has the current client's ``permissions`` shape (as recorded in
codex-0.163-recordings/sandboxed_apply_patch.rpc.jsonl), minus the ``/tmp``
and ``$TMPDIR`` write grants so that a sibling of the workspace under the test's
tmp dir is outside every writable root. apply_patch passes the context through
unchanged; the file system (local sandboxed service, or a remote server) is
what refuses.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from exec_server.patch.apply import apply_patch
from exec_server.patch.errors import ApplyError
from exec_server.patch.invocation import VerifiedBody, maybe_parse_apply_patch_verified


def workspace_write(workspace: Path) -> dict[str, Any]:
    uri = f"file://{workspace}"

    def special(kind: str, access: str, subpath: str | None = None) -> dict[str, Any]:
        value: dict[str, Any] = {"kind": kind}
        entry: dict[str, Any] = {"path": {"type": "special", "value": value}, "access": access}
        if subpath is not None:
            value["subpath"] = subpath
            entry["missing_path_behavior"] = "skip"
        return entry

    return {
        "permissions": {
            "type": "managed",
            "file_system": {
                "type": "restricted",
                "entries": [
                    special("root", "read"),
                    special("project_roots", "write"),
                    special("project_roots", "read", ".git"),
                    special("project_roots", "read", ".agents"),
                    special("project_roots", "read", ".codex"),
                ],
            },
            "network": "restricted",
        },
        "cwd": uri,
        "policyContext": {"cwd": uri, "workspaceRoots": [uri]},
        "workspaceRoots": [uri],
        "userHomeDir": "file:///root",
        "windowsSandboxLevel": "disabled",
        "useLegacyLandlock": False,
    }


@pytest.fixture(params=["local", "remote"])
async def sandboxed(request: pytest.FixtureRequest, open_remote: Any) -> AsyncIterator[Any]:
    if request.param == "local":
        from exec_server.client.fs import LocalFileSystem

        async with LocalFileSystem.with_sandbox() as fs:
            yield fs
    else:
        async with open_remote(full_services=True) as fs:
            yield fs


@pytest.fixture
def base(tmp_path: Path) -> Path:
    path = Path(os.path.realpath(tmp_path))
    (path / "ws").mkdir()
    (path / "ws" / "edit_me.txt").write_text("alpha\nbeta\ngamma\n")
    (path / "outside.txt").write_text("keep\n")
    return path


async def test_workspace_write_refuses_outside_paths(sandboxed: Any, base: Path) -> None:
    ws = base / "ws"
    ctx = workspace_write(ws)

    # Inside the workspace everything works under the same context.
    inside = (
        "*** Begin Patch\n*** Add File: sub/dir/added.txt\n+added by apply_patch\n"
        "*** Update File: edit_me.txt\n@@\n-beta\n+BETA-patched\n*** End Patch"
    )
    result = await apply_patch(inside, ws, sandboxed, ctx)
    assert result.summary() == (
        "Success. Updated the following files:\nA sub/dir/added.txt\nM edit_me.txt\n"
    )
    assert (ws / "sub/dir/added.txt").read_text() == "added by apply_patch\n"
    assert (ws / "edit_me.txt").read_text() == "alpha\nBETA-patched\ngamma\n"

    # An Add outside the workspace is refused and the file is not created.
    escape = "*** Begin Patch\n*** Add File: ../escaped.txt\n+pwned\n*** End Patch"
    with pytest.raises(ApplyError) as add_err:
        await apply_patch(escape, ws, sandboxed, ctx)
    assert str(add_err.value) == f"Failed to write file {base}/escaped.txt"
    assert not (base / "escaped.txt").exists()

    # An absolute path into a new directory outside: neither directory nor file appear.
    nested = f"*** Begin Patch\n*** Add File: {base}/new/escaped.txt\n+pwned\n*** End Patch"
    with pytest.raises(ApplyError) as nested_err:
        await apply_patch(nested, ws, sandboxed, ctx)
    assert str(nested_err.value).startswith("Failed to ")
    assert not (base / "new").exists()

    # Updating, moving out, and deleting outside files are refused; the files survive.
    update = "*** Begin Patch\n*** Update File: ../outside.txt\n@@\n-keep\n+gone\n*** End Patch"
    with pytest.raises(ApplyError) as upd_err:
        await apply_patch(update, ws, sandboxed, ctx)
    assert str(upd_err.value) == f"Failed to write file {base}/outside.txt"
    move = (
        "*** Begin Patch\n*** Update File: edit_me.txt\n*** Move to: ../moved.txt\n@@\n"
        "-alpha\n+ALPHA\n*** End Patch"
    )
    with pytest.raises(ApplyError):
        await apply_patch(move, ws, sandboxed, ctx)
    delete = "*** Begin Patch\n*** Delete File: ../outside.txt\n*** End Patch"
    with pytest.raises(ApplyError) as del_err:
        await apply_patch(delete, ws, sandboxed, ctx)
    assert str(del_err.value) == f"Failed to delete file {base}/outside.txt"
    assert (base / "outside.txt").read_text() == "keep\n"
    assert not (base / "moved.txt").exists()
    assert (ws / "edit_me.txt").read_text() == "alpha\nBETA-patched\ngamma\n"


async def test_verified_parse_reads_through_the_sandbox(sandboxed: Any, base: Path) -> None:
    ws = base / "ws"
    patch = "*** Begin Patch\n*** Update File: edit_me.txt\n@@\n-beta\n+B\n*** End Patch"
    argv = ["bash", "-lc", f"apply_patch <<'EOF'\n{patch}\nEOF\n"]
    verified = await maybe_parse_apply_patch_verified(argv, ws, sandboxed, workspace_write(ws))
    assert isinstance(verified, VerifiedBody)
    assert verified.action.cwd == ws
    (change,) = verified.action.changes.values()
    assert change.unified_diff == "@@ -1,3 +1,3 @@\n alpha\n-beta\n+B\n gamma\n"  # type: ignore[union-attr]
