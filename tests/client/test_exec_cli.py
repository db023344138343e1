"""``exec-server exec`` end to end against a real server."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

EXEC = [sys.executable, "-m", "exec_server", "exec"]


async def _run(*args: str, stdin: bytes | None = None) -> tuple[int, bytes, bytes]:
    proc = await asyncio.create_subprocess_exec(
        *EXEC,
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out, err


async def test_output_streams_and_exit_code_propagate(server: Any) -> None:
    rc, out, err = await _run(
        "--url", server.url, "--", "sh", "-c", "echo out; echo err >&2; exit 7"
    )
    assert (rc, out, err) == (7, b"out\n", b"err\n")


async def test_env_and_cwd(server: Any, tmp_path: Path) -> None:
    rc, out, _ = await _run(
        "--url", server.url, "--cwd", str(tmp_path), "--env", "FOO=bar=baz",
        "--", "sh", "-c", 'echo "$FOO $(pwd)"',
    )
    assert rc == 0
    assert out == f"bar=baz {tmp_path}\n".encode()


async def test_remote_env_inherits_server_environment(server: Any) -> None:
    # No --env: PATH comes from the server's environment, so a bare name resolves.
    rc, out, _ = await _run("--url", server.url, "--", "printf", "ok")
    assert (rc, out) == (0, b"ok")


async def test_tty_forwards_stdin_and_exits_with_remote_code(server: Any) -> None:
    rc, out, _ = await _run(
        "--url", server.url, "--tty", "--", "sh", "-c", "read l; echo got:$l; exit 5",
        stdin=b"hello\n",
    )
    assert rc == 5
    assert b"got:hello" in out


async def test_tty_stdin_eof_ends_cat(server: Any) -> None:
    rc, out, _ = await _run("--url", server.url, "--tty", "--", "cat", stdin=b"abc\n")
    assert rc == 0
    assert b"abc" in out


async def test_unreachable_server_exits_255() -> None:
    rc, _, err = await _run("--url", "ws://127.0.0.1:1", "--", "true")
    assert rc == 255
    assert b"exec-server exec:" in err


async def test_missing_command_is_a_usage_error(server: Any) -> None:
    rc, _, err = await _run("--url", server.url)
    assert rc == 2
    assert b"missing command" in err


async def test_tty_on_a_terminal_uses_raw_mode_and_restores_it(server: Any) -> None:
    import os
    import termios

    master, slave = os.openpty()
    try:
        before = termios.tcgetattr(slave)
        proc = await asyncio.create_subprocess_exec(
            *EXEC, "--url", server.url, "--tty", "--", "sh", "-c", "read l; echo got:$l",
            stdin=slave, stdout=slave, stderr=slave,
        )
        loop = asyncio.get_running_loop()
        seen = bytearray()
        got = asyncio.Event()

        def on_output() -> None:
            try:
                seen.extend(os.read(master, 4096))
            except OSError:
                loop.remove_reader(master)
                return
            if b"got:hi" in seen:
                got.set()

        os.set_blocking(master, False)
        loop.add_reader(master, on_output)
        try:
            # Raw mode: our terminal neither echoes nor line-buffers; the remote PTY does.
            os.write(master, b"hi\r")
            await asyncio.wait_for(got.wait(), 30)
            assert await asyncio.wait_for(proc.wait(), 30) == 0
        finally:
            loop.remove_reader(master)
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert termios.tcgetattr(slave) == before
    finally:
        os.close(master)
        os.close(slave)
