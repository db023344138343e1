"""The client also drives the upstream Rust server (skipped when it is not installed)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from exec_server.client import ExecServerClient
from exec_server.client.fs import RemoteFileSystem
from exec_server.exceptions import InvalidRequestError
from exec_server.protocol.types.process import StartParams, WriteStatus
from exec_server.protocol.types.sandbox import CurrentSandboxContext, decode_sandbox

pytestmark = pytest.mark.upstream

ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin"}


@pytest.fixture
async def upstream_url(codex_binary: str) -> AsyncIterator[str]:
    proc = await asyncio.create_subprocess_exec(
        codex_binary, "exec-server", "--listen", "ws://127.0.0.1:0",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        match = re.search(rb"ws://\S+", line)
        assert match, line
        yield match.group(0).decode()
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


async def test_spawn_collect_and_exit_code(upstream_url: str) -> None:
    async with await ExecServerClient.connect(upstream_url) as client:
        proc = await client.spawn(["sh", "-c", "echo out; echo err >&2; exit 3"], cwd="/",
                                  env=ENV)
        result = await proc.collect()
    assert (result.stdout, result.stderr, result.exit_code) == (b"out\n", b"err\n", 3)


async def test_tty_write_echo_and_terminate(upstream_url: str) -> None:
    async with await ExecServerClient.connect(upstream_url) as client:
        proc = await client.spawn(["cat"], cwd="/", env=ENV, tty=True)
        assert await proc.write(b"ping\n") is WriteStatus.ACCEPTED
        seen = b""
        while b"ping" not in seen:
            chunk = await proc.read_chunk()
            assert chunk is not None
            seen += chunk.chunk
        assert await proc.terminate() is True
        assert (await proc.wait()).code != 0


async def test_errors_map_the_same_way(upstream_url: str) -> None:
    async with await ExecServerClient.connect(upstream_url) as client:
        proc = await client.spawn(["sleep", "30"], cwd="/", env=ENV, process_id="same")
        duplicate = StartParams(
            process_id="same",
            argv=["true"],
            cwd="file:///",
            env=ENV,
            tty=False,
            sandbox=msgspec.Raw(b"null"),
        )
        with pytest.raises(InvalidRequestError, match="process same already exists"):
            await client.start_process(duplicate)
        assert await proc.terminate() is True
        await proc.wait()


async def test_big_files_round_trip_through_upstream(upstream_url: str, tmp_path: Any) -> None:
    """A 20 MiB write is 27 MiB of text: upstream refuses single frames over 16 MiB,
    so the client sends big messages as fragments (before, this write failed)."""
    data = os.urandom(20 << 20)
    target = tmp_path / "big.bin"
    async with await ExecServerClient.connect(upstream_url) as client:
        fs = RemoteFileSystem(client)
        await fs.write_file(target, data)
        assert await fs.read_file(target) == data
    assert target.read_bytes() == data


async def test_a_current_context_struct_is_taken_by_upstream(
    upstream_url: str, tmp_path: Any
) -> None:
    """The client sends a context struct as upstream reads it: no ``null`` defaults
    (``sandboxOverride: null`` was refused with -32602), paths as ``file://`` URIs."""
    workspace = str(tmp_path)  # pytest's tmp_path is already resolved
    ctx = decode_sandbox(
        json.dumps({
            "permissions": {"type": "disabled"},
            "windowsSandboxLevel": "disabled",
            "cwd": f"file://{workspace}",
            "workspaceRoots": [f"file://{workspace}"],
        }),
        CurrentSandboxContext,
    )
    async with await ExecServerClient.connect(upstream_url) as client:
        fs = RemoteFileSystem(client)
        await fs.write_file(os.path.join(workspace, "f.txt"), b"hi", ctx)
        assert await fs.read_file(os.path.join(workspace, "f.txt"), ctx) == b"hi"


async def test_extensions_are_detected_as_missing(upstream_url: str) -> None:
    from exec_server.client import NotSupportedError
    from exec_server.protocol.types.process import METHOD_CLOSE_STDIN, METHOD_RESIZE_PTY

    async with await ExecServerClient.connect(upstream_url) as client:
        assert not await client.supports(METHOD_RESIZE_PTY)
        assert not await client.supports(METHOD_CLOSE_STDIN)
        proc = await client.spawn(["cat"], cwd="/", env=ENV, tty=True)
        with pytest.raises(NotSupportedError):
            await proc.resize(30, 100)
        await proc.terminate()
        await proc.wait()


async def test_exec_cli_against_upstream_says_stdin_is_not_forwarded(upstream_url: str) -> None:
    import sys

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "exec_server", "exec", "--url", upstream_url, "--cwd", "/",
        "--", "cat", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(b"hi\n"), 60)
    assert (proc.returncode, out) == (0, b"")
    assert err == (b"exec-server exec: this server cannot end a command's input "
                   b"(no process/closeStdin): stdin is not forwarded\n")
