"""Sandboxed ``process/start`` through a real server, per backend, pipes and PTY.

The wire request is what each client generation sends (current ``permissions``
shape from the 0.163 recording; legacy ``SandboxLaunchConfig``); the server's
manager turns it into a plan and our backend confines the child. Effects are
checked on disk after ``process/closed``.
"""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("exec_server.server.handlers.process")


def _special(kind: str, subpath: str | None = None) -> dict[str, Any]:
    value: dict[str, Any] = {"kind": kind}
    if subpath is not None:
        value["subpath"] = subpath
    return {"type": "special", "value": value}


def current_sandbox(workspace: str) -> dict[str, Any]:
    entries = [
        {"path": _special("root"), "access": "read"},
        {"path": _special("project_roots"), "access": "write"},
        {"path": _special("slash_tmp"), "access": "write"},
        {"path": _special("tmpdir"), "access": "write"},
    ] + [{"path": _special("project_roots", n), "access": "read",
          "missing_path_behavior": "skip"} for n in (".git", ".agents", ".codex", ".aws")]
    uri = "file://" + workspace
    return {"permissions": {"type": "managed",
                            "file_system": {"type": "restricted", "entries": entries},
                            "network": "restricted"},
            "cwd": uri, "workspaceRoots": [uri], "windowsSandboxLevel": "disabled",
            "windowsSandboxProxySettingsMode": "reconcile", "useLegacyLandlock": False}


def legacy_sandbox(workspace: str) -> dict[str, Any]:
    return {
        "sandboxPreference": "require",
        "policy": {"type": "workspace-write", "writable_roots": [], "network_access": False,
                   "exclude_tmpdir_env_var": True, "exclude_slash_tmp": True},
        "fileSystemPolicy": {"kind": "restricted", "entries": [
            {"path": _special("root"), "access": "read"},
            {"path": _special("current_working_directory"), "access": "write"}]},
        "networkPolicy": "restricted",
        "sandboxPolicyCwd": workspace,
        "additionalPermissions": None,
        "enforceManagedNetwork": False,
        "windowsSandboxLevel": "disabled",
        "windowsSandboxPrivateDesktop": False,
        "useLegacyLandlock": False,
    }


@pytest.fixture
def outside() -> Iterator[str]:
    """A directory outside every writable root (/tmp is writable under workspace-write)."""
    path = tempfile.mkdtemp(prefix="exec-server-e2e-", dir="/var/tmp")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def _run(client: Any, params: dict[str, Any]) -> tuple[dict[str, Any], int, bytes]:
    result = await client.call("process/start", params)
    out = bytearray()
    code = None
    while True:
        msg = await client.notification(timeout=30)
        p = msg.get("params") or {}
        if p.get("processId") != params["processId"]:
            continue
        if msg["method"] == "process/output":
            out += base64.b64decode(p.get("chunk") or "")
        elif msg["method"] == "process/exited":
            code = p.get("exitCode")
        elif msg["method"] == "process/closed":
            break
    assert code is not None
    return result, int(code), bytes(out)


async def _server_for(backend: Any, server_factory: Callable[..., Any], rpc: Any,
                      cwd: str, *extra: str) -> Any:
    """A server for this leg; on the zygote leg, returns once launches go through it."""
    zygote = getattr(backend, "via_zygote", False)
    args = ["--sandbox-backend", backend.name, *extra]
    if backend.name == "landlock" and not zygote:
        args.append("--no-launch-zygote")
    srv = server_factory(*args, cwd=cwd)
    client = await rpc(srv.url)
    await client.initialize()
    if zygote:
        # The first launch starts the zygote (and itself runs the launcher script);
        # launch until one reports the zygote as its parent.
        for i in range(200):
            if await _launched_by_zygote(client, cwd, f"warm-{i}"):
                break
        else:
            raise AssertionError("launches never went through the spawn zygote")
    return srv, client


def _pids_with(tag: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if tag.encode() in cmdline.split(b"\0") and _alive(int(entry)):
                found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:][:1] != b"Z"


def _ppid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[1])


async def _launched_by_zygote(client: Any, cwd: str, process_id: str) -> bool:
    """Start a sleeper, find it from out here (it runs in a PID namespace) and walk up
    through its pid 1 and monitor to whoever spawned it; then terminate it."""
    tag = f"60.{os.getpid()}{uuid.uuid4().int % 10**9}"
    params = {"processId": process_id, "argv": ["sh", "-c", f"exec sleep {tag}"],
              "cwd": cwd, "env": {"PATH": "/usr/bin:/bin"}, "tty": False,
              "arg0": None, "sandbox": legacy_sandbox(cwd)}
    await client.call("process/start", params)
    async with asyncio.timeout(30):
        while not _pids_with(tag):  # noqa: ASYNC110 - no event for its exec
            await asyncio.sleep(0.01)
    (child,) = _pids_with(tag)
    spawner = _ppid(_ppid(_ppid(child)))
    via = b"--zygote" in Path(f"/proc/{spawner}/cmdline").read_bytes()  # noqa: ASYNC240
    await client.call("process/terminate", {"processId": process_id})
    while True:
        msg = await client.notification(timeout=30)
        p = msg.get("params") or {}
        if p.get("processId") == process_id and msg["method"] == "process/closed":
            return via


def _check_effects(root: str, escaped: str, out: bytes) -> None:
    assert Path(root, "inside").read_text() == "in\n"
    assert not os.path.exists(escaped), out
    assert not os.path.exists(os.path.join(root, ".git", "config")), out
    # placeholder mountpoints for missing protected names are gone by process/exited
    for name in (".codex", ".agents", ".aws"):
        assert not os.path.lexists(os.path.join(root, name))


@pytest.mark.parametrize("generation", ["current", "legacy"])
@pytest.mark.parametrize("tty", [False, True], ids=["pipes", "pty"])
async def test_sandboxed_process_start(backend: Any, server_factory: Callable[..., Any],
                                       rpc: Any, ws: Any, outside: str, generation: str,
                                       tty: bool) -> None:
    os.mkdir(os.path.join(ws.root, ".git"))
    _, client = await _server_for(backend, server_factory, rpc, ws.root)
    escaped = os.path.join(outside, "escaped")
    script = (f"echo in > inside; echo x > {escaped}; echo y > .git/config; "
              "echo marker-$CODEX_SANDBOX_NETWORK_DISABLED")
    current = generation == "current"
    params: dict[str, Any] = {
        "processId": f"sb-{uuid.uuid4().hex[:8]}",
        "argv": ["sh", "-c", script],
        "cwd": ("file://" + ws.root) if current else ws.root,
        "env": {"PATH": "/usr/bin:/bin"},
        "tty": tty,
        "arg0": None,
        "sandbox": current_sandbox(ws.root) if current else legacy_sandbox(ws.root),
    }
    if current:
        params["pipeStdin"] = False
    result, code, out = await _run(client, params)
    if current:
        assert result["sandboxType"] == "linuxSeccomp"
    else:
        assert result["sandbox"] == "linux-seccomp"
    assert code != 0 or b"marker" in out
    _check_effects(ws.root, escaped, out)
    if not current:
        assert b"marker-1" in out


@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandboxed", "unsandboxed"])
async def test_daemons_die_when_the_session_expires(backend: Any,
                                                    server_factory: Callable[..., Any],
                                                    rpc: Any, ws: Any, sandboxed: bool) -> None:
    """A detached session's processes, daemonised descendants included, die at expiry."""
    if not sandboxed and backend.name != "bwrap":
        pytest.skip("the unsandboxed case does not depend on the backend")
    _, client = await _server_for(backend, server_factory, rpc, ws.root, "--detach-ttl", "0.5")
    tag = f"300.{os.getpid()}{uuid.uuid4().int % 10**9}"
    quiet = ">/dev/null 2>&1 </dev/null"
    # unsandboxed pipes: no subreaper (see process.tree), so no double fork there
    double_fork = f"(setsid sleep {tag}2 {quiet} &); " if sandboxed else f"sleep {tag}2 & "
    await client.call("process/start", {
        "processId": "d", "argv": ["sh", "-c", f"setsid sleep {tag}1 {quiet} & "
                                   f"{double_fork}sleep 300"],
        "cwd": ws.root, "env": {"PATH": "/usr/bin:/bin"}, "tty": False, "arg0": None,
        "sandbox": legacy_sandbox(ws.root) if sandboxed else None})
    async with asyncio.timeout(30):
        while not (_pids_with(tag + "1") and _pids_with(tag + "2")):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    await client.aclose()  # detach; the session expires 0.5 s later
    try:
        async with asyncio.timeout(30):
            while _pids_with(tag + "1") or _pids_with(tag + "2"):  # noqa: ASYNC110
                await asyncio.sleep(0.02)
    finally:
        for pid in _pids_with(tag + "1") + _pids_with(tag + "2"):
            os.kill(pid, 9)
