"""The client's sandbox-context builders (:mod:`exec_server.client.sandbox_contexts`):
the same contexts codex 0.163 sends (compared with its recordings), and what they
allow, enforced by the kernel through both sandboxing backends."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from exec_server.client import sandbox_contexts as sc
from exec_server.client.fs import ExecutorFileSystem
from exec_server.exceptions import InvalidRequestError
from exec_server.protocol.types import sandbox as st

WAIT = 30.0
#: codex 0.163's traffic (a copy of shared/spec/codex-0.163-recordings kept with the tests).
RECORDINGS = Path(__file__).resolve().parents[1] / "compat" / "codex-0.163-recordings"


def _recorded_fs_context(recording: str) -> tuple[dict[str, Any], str]:
    """The ``sandbox`` of the first ``fs/*`` call in a recording, and its workspace."""
    for line in (RECORDINGS / recording).read_text().splitlines():
        msg = json.loads(line).get("msg") or {}
        if str(msg.get("method", "")).startswith("fs/") and msg["params"].get("sandbox"):
            sandbox: dict[str, Any] = msg["params"]["sandbox"]
            workspace = sandbox["policyContext"]["cwd"].removeprefix("file://")
            return sandbox, workspace
    raise AssertionError(f"no fs call with a sandbox in {recording}")


def _decoded(wire: dict[str, Any]) -> st.CurrentSandboxContext:
    ctx: st.CurrentSandboxContext = st.decode_sandbox(json.dumps(wire), st.CurrentSandboxContext)
    return ctx


def test_workspace_write_is_what_codex_sends_on_fs_calls() -> None:
    recorded, workspace = _recorded_fs_context("sandboxed_apply_patch.rpc.jsonl")
    built = sc.workspace_write(workspace, home="/home/user")
    assert _decoded(sc.to_wire(built)) == _decoded(recorded)
    # Entry for entry, in the same order and spelling.
    assert (
        sc.to_wire(built)["permissions"]["file_system"]
        == recorded["permissions"]["file_system"]
    )


def test_full_access_is_what_codex_sends_on_fs_calls() -> None:
    recorded, workspace = _recorded_fs_context("apply_patch.rpc.jsonl")
    assert recorded["permissions"] == {"type": "disabled"}
    built = sc.full_access(workspace, home="/home/user")
    assert _decoded(sc.to_wire(built)) == _decoded(recorded)


def test_wire_form_uses_uris_and_leaves_defaults_out(tdir: Path) -> None:
    wire = sc.to_wire(sc.read_only(tdir, home=tdir / "home", network=True))
    assert wire["cwd"] == tdir.as_uri()
    assert wire["workspaceRoots"] == [tdir.as_uri()]
    assert wire["policyContext"] == {"cwd": tdir.as_uri(), "workspaceRoots": [tdir.as_uri()]}
    assert wire["userHomeDir"] == (tdir / "home").as_uri()
    assert wire["permissions"]["network"] == "enabled"
    assert "useLegacyLandlock" not in wire and "sandboxOverride" not in wire
    entries = wire["permissions"]["file_system"]["entries"]
    assert {e["access"] for e in entries} == {"read"}
    minimal = sc.to_wire(sc.read_only(tdir, full_read=False))["permissions"]["file_system"]
    assert [e["path"]["value"]["kind"] for e in minimal["entries"]] == [
        "minimal",
        "project_roots",
    ]


def test_relative_paths_are_refused() -> None:
    with pytest.raises(ValueError, match="must be absolute"):
        sc.workspace_write("workspace")
    with pytest.raises(ValueError, match="must be absolute"):
        sc.full_access("/w", home="home")


async def test_workspace_write_confines_writes_to_the_workspace(
    sandboxed_fs: ExecutorFileSystem, tdir: Path
) -> None:
    ws = tdir / "ws"
    (ws / ".git").mkdir(parents=True)
    outside = tdir / "outside"
    outside.mkdir()
    ctx = sc.workspace_write(ws, tmp=False)  # tdir is under /tmp: keep it unwritable
    await asyncio.wait_for(sandboxed_fs.write_file(ws / "a.txt", b"in", ctx), WAIT)
    assert (ws / "a.txt").read_bytes() == b"in"
    for denied in (outside / "b.txt", ws / ".git" / "config", ws / ".codex" / "x"):
        with pytest.raises(InvalidRequestError):
            await asyncio.wait_for(sandboxed_fs.write_file(denied, b"no", ctx), WAIT)
        assert not denied.exists()
    (outside / "r.txt").write_bytes(b"readable")
    assert await asyncio.wait_for(sandboxed_fs.read_file(outside / "r.txt", ctx), WAIT) == (
        b"readable"
    )


async def test_read_only_refuses_every_write_and_full_access_allows_them(
    sandboxed_fs: ExecutorFileSystem, tdir: Path
) -> None:
    ws = tdir / "ws"
    ws.mkdir()
    (ws / "keep.txt").write_bytes(b"old")
    ro = sc.read_only(ws)
    with pytest.raises(InvalidRequestError):
        await asyncio.wait_for(sandboxed_fs.write_file(ws / "keep.txt", b"new", ro), WAIT)
    with pytest.raises(InvalidRequestError):
        await asyncio.wait_for(sandboxed_fs.create_directory(ws / "d", sandbox=ro), WAIT)
    assert (ws / "keep.txt").read_bytes() == b"old"
    assert not (ws / "d").exists()
    assert await asyncio.wait_for(sandboxed_fs.read_file(ws / "keep.txt", ro), WAIT) == b"old"
    full = sc.full_access(ws)
    elsewhere = tdir / "elsewhere.txt"
    await asyncio.wait_for(sandboxed_fs.write_file(elsewhere, b"free", full), WAIT)
    assert elsewhere.read_bytes() == b"free"
