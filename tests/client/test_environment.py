"""EnvironmentManager / Environment selection (PROTOCOL.md §13, §15.7 items 46-52)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest

from exec_server.client import (
    Environment,
    EnvironmentManager,
    LocalExecBackend,
    RemoteExecBackend,
    RuntimePaths,
    normalize_exec_server_url,
)
from exec_server.fs.helper.confine import landlock_abi

_HAS_CONFINEMENT = landlock_abi() > 0 or shutil.which("bwrap") is not None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, (None, False)),
        ("", (None, False)),
        ("   ", (None, False)),
        ("none", (None, True)),
        (" NoNe ", (None, True)),
        (" ws://127.0.0.1:8765 ", ("ws://127.0.0.1:8765", False)),
    ],
)
def test_normalisation(value: str | None, expected: tuple[str | None, bool]) -> None:
    assert normalize_exec_server_url(value) == expected


def test_from_env_unset_is_local() -> None:
    manager = EnvironmentManager.from_env({})
    assert (manager.url, manager.disabled, manager.is_remote) == (None, False, False)


def test_from_env_empty_is_local_not_disabled() -> None:
    manager = EnvironmentManager.from_env({"EXEC_SERVER_URL": ""})
    assert (manager.url, manager.disabled, manager.is_remote) == (None, False, False)


async def test_from_env_none_disables() -> None:
    manager = EnvironmentManager.from_env({"EXEC_SERVER_URL": "none"})
    assert (manager.url, manager.disabled, manager.is_remote) == (None, True, False)
    assert await manager.current() is None


def test_from_env_reports_remote_url_unchanged() -> None:
    manager = EnvironmentManager.from_env({"EXEC_SERVER_URL": "ws://127.0.0.1:8765"})
    assert manager.is_remote and manager.url == "ws://127.0.0.1:8765"


def test_codex_variable_is_accepted_and_ours_wins() -> None:
    codex_only = EnvironmentManager.from_env({"CODEX_EXEC_SERVER_URL": "ws://h:1"})
    assert codex_only.url == "ws://h:1"
    codex_none = EnvironmentManager.from_env({"CODEX_EXEC_SERVER_URL": "None"})
    assert codex_none.disabled
    both = EnvironmentManager.from_env(
        {"EXEC_SERVER_URL": "ws://ours:2", "CODEX_EXEC_SERVER_URL": "ws://codex:1"}
    )
    assert both.url == "ws://ours:2"


async def test_create_disabled_fails() -> None:
    with pytest.raises(ValueError, match="disabled mode does not create an Environment"):
        await Environment.create("none")


async def test_local_environment_does_not_connect() -> None:
    env = await Environment.create(None)
    try:
        assert env.url is None and not env.is_remote
        assert env.remote_client is None
        assert isinstance(env.exec_backend, LocalExecBackend)
    finally:
        await env.aclose()


async def test_manager_caches_one_environment() -> None:
    manager = EnvironmentManager(None)
    try:
        first, second = await asyncio.gather(manager.current(), manager.current())
        assert first is not None and first is second
        assert await manager.current() is first
    finally:
        await manager.aclose()


async def test_runtime_paths_are_carried() -> None:
    paths = RuntimePaths("/usr/bin/exec-server")
    manager = EnvironmentManager(None, runtime_paths=paths)
    try:
        env = await manager.current()
        assert env is not None and env.runtime_paths == paths
        rebuilt = EnvironmentManager.from_environment(env)
        assert rebuilt.runtime_paths == paths and not rebuilt.disabled
    finally:
        await manager.aclose()
    assert EnvironmentManager.from_environment(None).disabled


def test_runtime_paths_must_be_absolute() -> None:
    with pytest.raises(ValueError, match="path must be absolute"):
        RuntimePaths("relative/exe")


async def test_default_local_environment_runs_true() -> None:
    manager = EnvironmentManager.from_env({})
    try:
        env = await manager.current()
        assert env is not None
        proc = await env.exec_backend.start(["true"], cwd="/", env={}, process_id="p-true")
        assert proc.process_id == "p-true"
        assert (await proc.wait()).code == 0
        from exec_server.client.fs import LocalFileSystem

        assert isinstance(env.get_filesystem(), LocalFileSystem)
    finally:
        await manager.aclose()


async def test_remote_environment_from_env(server: Any) -> None:
    manager = EnvironmentManager.from_env({"EXEC_SERVER_URL": f" {server.url} "})
    try:
        env = await manager.current()
        assert env is not None and env.is_remote and env.url == server.url
        assert isinstance(env.exec_backend, RemoteExecBackend)
        assert env.remote_client is not None and env.remote_client.connected
        proc = await env.exec_backend.start(["sh", "-c", "echo remote"], cwd="/", env={})
        assert (await proc.collect()).stdout == b"remote\n"
        from exec_server.client.fs import RemoteFileSystem

        assert isinstance(env.get_filesystem(), RemoteFileSystem)
    finally:
        await manager.aclose()


def _workspace_write(root: str) -> dict[str, Any]:
    """A legacy workspace-write context writable only under ``root`` (PROTOCOL.md §15.6 WW)."""
    return {
        "sandboxPolicy": {
            "type": "workspace-write",
            "writable_roots": [root],
            "read_only_access": {"type": "restricted", "include_platform_defaults": False},
            "network_access": False,
            "exclude_tmpdir_env_var": True,
            "exclude_slash_tmp": True,
        },
        "windowsSandboxLevel": "disabled",
    }


@pytest.mark.skipif(not _HAS_CONFINEMENT, reason="neither Landlock nor bwrap available")
async def test_local_environment_filesystem_confines_sandboxed_calls(tmp_path: Path) -> None:
    from exec_server.client import ClientClosedError
    from exec_server.exceptions import ExecServerError

    allowed = tmp_path / "allowed"
    allowed.mkdir()
    context = _workspace_write(str(allowed))
    env = await Environment.create(None)
    try:
        fs = env.get_filesystem()
        assert env.get_filesystem() is fs  # one instance, owned by the environment
        await fs.write_file(str(allowed / "in.txt"), b"inside", sandbox=context)
        assert (allowed / "in.txt").read_bytes() == b"inside"
        with pytest.raises(ExecServerError) as denied:
            await fs.write_file(str(tmp_path / "out.txt"), b"x", sandbox=context)
        assert denied.value.code == -32600
        assert not (tmp_path / "out.txt").exists()
    finally:
        await env.aclose()
    # Closing the environment closed the sandboxed-filesystem service with it.
    with pytest.raises(ExecServerError, match="shut down"):
        await fs.write_file(str(allowed / "late.txt"), b"x", sandbox=context)
    with pytest.raises(ClientClosedError):
        env.get_filesystem()
