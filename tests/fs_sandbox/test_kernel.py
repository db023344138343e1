"""The kernel, not our path check, confines a zygote child.

These tests talk to the zygote directly (``Zygote.run``), bypassing the
server-side policy check: whatever is refused here is refused by Landlock
(or by the child's fd-verified guard for read-only holes), and the file
system shows nothing was written.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from exec_server.fs.confined import SandboxedFileSystem


def plan(readable: list[Path] | None = None, writable: list[Path] | None = None) -> dict[str, Any]:
    return {
        "full_read": readable is None,
        "full_write": False,
        "network": False,
        "readable_roots": [str(p) for p in readable or []],
        "writable_roots": [str(p) for p in writable or []],
    }


async def run(sfs: SandboxedFileSystem, header: dict[str, Any], data: bytes = b"") -> Any:
    reply, payload = await sfs.zygote.run(header, data, timeout=10)
    return reply, payload


async def test_landlock_refuses_a_write_the_server_never_checked(
    zygote_sfs: SandboxedFileSystem, layout: Any
) -> None:
    target = layout.outside / "written.txt"
    header = {
        "op": "fs/writeFile",
        "path": str(target),
        "expect": str(layout.outside),
        "plan": plan(writable=[layout.allowed]),
    }
    reply, _ = await run(zygote_sfs, header, b"escaped")
    assert reply == {
        "status": "error",
        "code": -32600,
        "message": "Permission denied (os error 13)",
    }
    assert not target.exists()
    # Same request, a plan that grants the directory: the write happens, so
    # the refusal above came from the plan the kernel enforced.
    reply, _ = await run(zygote_sfs, {**header, "plan": plan(writable=[layout.outside])}, b"ok")
    assert reply["status"] == "ok"
    assert target.read_bytes() == b"ok"


async def test_landlock_refuses_a_read_outside_readable_roots(
    zygote_sfs: SandboxedFileSystem, layout: Any
) -> None:
    (layout.outside / "secret.txt").write_text("secret")
    header = {
        "op": "fs/readFile",
        "path": str(layout.outside / "secret.txt"),
        "expect": str(layout.outside),
        "plan": plan(readable=[layout.allowed]),
    }
    reply, payload = await run(zygote_sfs, header)
    assert reply["status"] == "error" and reply["code"] == -32600
    assert "Permission denied" in reply["message"]
    assert payload == b""


async def test_child_runs_with_nnp_seccomp_and_no_network(
    zygote_sfs: SandboxedFileSystem, layout: Any
) -> None:
    header = {
        "op": "fs/getMetadata",
        "path": str(layout.allowed),
        "expect": str(layout.root),
        "plan": plan(readable=[layout.allowed]),
        "test_hook": "probe",
    }
    reply, _ = await run(zygote_sfs, header)
    result = reply["result"]
    assert result["NoNewPrivs"] == "1"
    assert result["Seccomp"] == "2"
    # No capabilities, even for a root server (as bwrap --cap-drop ALL): none to
    # use, none to regain.
    for cap_set in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(result[cap_set], 16) == 0, cap_set
    assert result["inet_socket"] == errno.EPERM
    # Platform defaults are not in this plan: even /etc is out of reach.
    assert result["etc_hostname"] == errno.EACCES


async def test_each_request_gets_its_own_policy(
    zygote_sfs: SandboxedFileSystem, layout: Any
) -> None:
    """A child confined for one request leaves the next one unaffected (fresh fork each time)."""
    (layout.outside / "f.txt").write_text("outside")
    read = {
        "op": "fs/readFile",
        "path": str(layout.outside / "f.txt"),
        "expect": str(layout.outside),
    }
    denied, _ = await run(zygote_sfs, {**read, "plan": plan(readable=[layout.allowed])})
    allowed, payload = await run(zygote_sfs, {**read, "plan": plan(readable=[layout.outside])})
    assert denied["status"] == "error"
    assert allowed["status"] == "ok" and payload == b"outside"


# ----------------------------------------------------------- read-only holes


@pytest.fixture
def workspace(layout: Any) -> Path:
    ws: Path = layout.allowed / "ws"
    (ws / ".git").mkdir(parents=True)
    (ws / ".git" / "config").write_text("[core]\n")
    (ws / "src").mkdir()
    return ws


def guarded(ws: Path, op: str, path: Path, expect: Path, **extra: Any) -> dict[str, Any]:
    return {
        "op": op,
        "path": str(path),
        "expect": str(expect),
        "plan": plan(writable=[ws]),
        "writable": [str(ws)],
        "read_only": [str(ws / ".git"), str(ws / ".codex")],
        **extra,
    }


async def test_protected_git_stays_read_only_inside_a_writable_root(
    zygote_sfs: SandboxedFileSystem, workspace: Path
) -> None:
    git = workspace / ".git"
    reply, _ = await run(
        zygote_sfs, guarded(workspace, "fs/writeFile", git / "config", git), b"pwned"
    )
    assert reply["status"] == "error"
    assert reply["message"] == "Read-only file system (os error 30)"
    assert (git / "config").read_text() == "[core]\n"
    # A missing protected path cannot be created either.
    reply, _ = await run(
        zygote_sfs,
        guarded(workspace, "fs/createDirectory", workspace / ".codex", workspace, recursive=False),
    )
    assert reply["status"] == "error"
    assert not (workspace / ".codex").exists()
    # Removing a tree that contains it is refused as a whole.
    reply, _ = await run(
        zygote_sfs, guarded(workspace, "fs/remove", workspace, workspace.parent, recursive=True)
    )
    assert reply["status"] == "error"
    assert (git / "config").exists()
    # Reading it is fine; writing next to it is fine.
    reply, payload = await run(zygote_sfs, guarded(workspace, "fs/readFile", git / "config", git))
    assert reply["status"] == "ok" and payload == b"[core]\n"
    reply, _ = await run(
        zygote_sfs,
        guarded(workspace, "fs/writeFile", workspace / "src" / "a.py", workspace / "src"),
        b"x = 1\n",
    )
    assert reply["status"] == "ok"


async def test_symlink_into_protected_path_is_caught_on_the_real_location(
    zygote_sfs: SandboxedFileSystem, workspace: Path
) -> None:
    """A path component swapped for a symlink to ``.git`` after the check is refused."""
    sneaky = workspace / "sneaky"
    sneaky.symlink_to(workspace / ".git")
    # The server checked ``sneaky`` as a plain directory (expect == its lexical
    # path); at use time it resolves elsewhere, so the child refuses.
    reply, _ = await run(
        zygote_sfs, guarded(workspace, "fs/writeFile", sneaky / "config", sneaky), b"pwned"
    )
    assert reply["status"] == "error"
    assert "changed while the sandboxed operation was running" in reply["message"]
    # Even if the expectation matched the real location, the guard refuses.
    reply, _ = await run(
        zygote_sfs,
        guarded(workspace, "fs/writeFile", sneaky / "config", workspace / ".git"),
        b"pwned",
    )
    assert reply["status"] == "error"
    assert reply["message"] == "Read-only file system (os error 30)"
    assert (workspace / ".git" / "config").read_text() == "[core]\n"


async def test_copy_into_workspace_cannot_write_into_git(
    zygote_sfs: SandboxedFileSystem, workspace: Path, layout: Any
) -> None:
    src = layout.allowed / "payload"
    (src / ".git").mkdir(parents=True)
    (src / ".git" / "config").write_text("evil")
    (src / "ok.txt").write_text("ok")
    header = guarded(
        workspace,
        "fs/copy",
        src,
        src.parent,
        dest=str(workspace),
        dest_expect=str(workspace.parent),
        recursive=True,
    )
    header["plan"] = plan(writable=[workspace])
    reply, _ = await run(zygote_sfs, header)
    assert reply["status"] == "error"
    assert (workspace / ".git" / "config").read_text() == "[core]\n"


async def test_denied_carve_out_is_not_readable(
    zygote_sfs: SandboxedFileSystem, layout: Any
) -> None:
    secret = layout.allowed / "private"
    secret.mkdir()
    (secret / "key").write_text("k")
    (layout.allowed / "pub.txt").write_text("p")
    base = {"plan": plan(readable=[layout.allowed]), "denied": [str(secret)]}
    reply, _ = await run(
        zygote_sfs,
        {"op": "fs/readFile", "path": str(secret / "key"), "expect": str(secret), **base},
    )
    assert reply["status"] == "error" and "Permission denied" in reply["message"]
    reply, _ = await run(
        zygote_sfs,
        {"op": "fs/readDirectory", "path": str(layout.allowed), "expect": str(layout.root), **base},
    )
    names = {e["fileName"] for e in reply["result"]["entries"]}
    assert "pub.txt" in names and "private" not in names
    assert (secret / "key").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="a root server's child is the case at issue")
async def test_child_obeys_file_permissions_like_upstreams_helper(
    zygote_sfs: SandboxedFileSystem, layout: Any
) -> None:
    """Landlock allows the path, but the child has no CAP_DAC_OVERRIDE: another
    user's private file is refused (EACCES), not read and not overwritten."""
    secret = layout.allowed / "secret.txt"
    secret.write_text("private")
    os.chown(secret, 1234, 5678)
    os.chmod(secret, 0o600)
    base = {"expect": str(layout.allowed), "plan": plan(writable=[layout.allowed])}
    reply, payload = await run(zygote_sfs, {"op": "fs/readFile", "path": str(secret), **base})
    assert reply["status"] == "error", reply
    assert payload == b""
    assert "Permission denied" in reply["message"]
    reply, _ = await run(
        zygote_sfs, {"op": "fs/writeFile", "path": str(secret), **base}, b"overwritten"
    )
    assert reply["status"] == "error", reply
    assert "Permission denied" in reply["message"]
    assert secret.read_text() == "private"
    assert sorted(p.name for p in layout.allowed.iterdir()) == ["link", "secret.txt"]
    assert (secret.stat().st_uid, secret.stat().st_gid) == (1234, 5678)
