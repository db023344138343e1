"""``exec-server exec`` end to end against a real server."""

from __future__ import annotations

import asyncio
import os
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


# ---------------------------------------------------------------- stdin, sandbox


async def test_stdin_is_forwarded_and_its_end_closes_remote_stdin(server: Any) -> None:
    rc, out, _ = await _run("--url", server.url, "--", "cat", stdin=b"hi\n")
    assert (rc, out) == (0, b"hi\n")


async def test_no_stdin_flag_gives_the_command_an_empty_stdin(server: Any) -> None:
    rc, out, _ = await _run("--url", server.url, "-n", "--", "cat", stdin=b"hi\n")
    assert (rc, out) == (0, b"")


async def test_sandbox_read_only_refuses_writes(server: Any, tmp_path: Path) -> None:
    rc, _, err = await _run("--url", server.url, "--cwd", str(tmp_path), "--sandbox",
                            "read-only", "--", "touch", "x")
    assert rc != 0, err
    assert not (tmp_path / "x").exists()


async def test_sandbox_writable_root(server: Any, tmp_path: Path) -> None:
    work, extra = tmp_path / "work", tmp_path / "extra"
    work.mkdir()
    extra.mkdir()
    rc, _, err = await _run("--url", server.url, "--cwd", str(work), "--sandbox",
                            "workspace-write", "--writable-root", str(extra), "--", "sh", "-c",
                            f"touch in {extra}/granted")
    assert rc == 0, err
    assert (work / "in").exists() and (extra / "granted").exists()


async def test_missing_writable_root_is_refused(server: Any, tmp_path: Path) -> None:
    rc, _, err = await _run("--url", server.url, "--cwd", str(tmp_path), "--sandbox",
                            "workspace-write", "--writable-root", "/nonexistent-c30", "--",
                            "true")
    assert rc == 2
    assert err.startswith(b"exec-server exec: --writable-root /nonexistent-c30: ")
    assert b"on the server" in err


# ---------------------------------------------------------------- one-line errors


async def test_missing_cwd_blames_the_directory(server: Any) -> None:
    rc, _, err = await _run("--url", server.url, "--cwd", "/nonexistent-c30", "--", "pwd")
    assert rc == 255
    assert err == (b"exec-server exec: --cwd /nonexistent-c30: No such file or directory "
                   b"on the server\n")


async def test_empty_command_name(server: Any) -> None:
    rc, _, err = await _run("--url", server.url, "--", "")
    assert (rc, err) == (2, b"exec-server exec: empty command name\n")


async def test_non_utf8_argument_is_refused_clearly(server: Any) -> None:
    proc = await asyncio.create_subprocess_exec(
        *EXEC, "--url", server.url, "--", "ls", b"caf\xe9",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert err == (b"exec-server exec: argument 2 ('caf\\xe9') is not valid UTF-8; the "
                   b"protocol carries arguments as text\n")


async def test_bad_url_is_one_line() -> None:
    rc, _, err = await _run("--url", "ws://[::1", "--", "true")
    assert rc == 2
    assert err == b"exec-server exec: --url ws://[::1: Invalid IPv6 URL\n"


async def test_wss_against_a_plain_server_says_why(server: Any) -> None:
    rc, _, err = await _run("--url", server.url.replace("ws://", "wss://"), "--", "true")
    assert rc == 255
    assert b"TLS handshake" in err and err.count(b"\n") == 1


async def test_deleted_working_directory(server: Any, tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    exe = " ".join(EXEC)
    proc = await asyncio.create_subprocess_exec(
        "sh", "-c", f"cd {gone} && rmdir {gone} && exec {exe} --url {server.url} -- true",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert err.startswith(b"exec-server exec: the current directory is gone")
    assert b"--cwd" in err


def test_closed_stdout_ends_quietly(server: Any) -> None:
    import subprocess

    proc = subprocess.Popen([*EXEC, "--url", server.url, "--", "seq", "1", "10000000"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline() == b"1\n"
    proc.stdout.close()  # what `| head -1` does
    assert proc.wait(timeout=60) == 141
    assert proc.stderr.read() == b""
    proc.stderr.close()


# ---------------------------------------------------------------- on a terminal


def _on_terminal(argv: list[str], *, steps: list[tuple[bytes, Any]],
                 size: tuple[int, int] = (24, 80)) -> tuple[int, bytes]:
    """Run ``argv`` as a terminal's foreground job; for each (marker, action), once
    the output holds ``marker`` call ``action(master)``. Returns (status, output)."""
    import fcntl
    import select
    import struct
    import subprocess
    import termios

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", *size, 0, 0))
    try:
        proc = subprocess.Popen(["setsid", "--ctty", *argv], stdin=slave, stdout=slave,
                                stderr=slave)
    finally:
        os.close(slave)
    out = b""
    pending = list(steps)
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 60)
            assert ready, f"no output in time: {out!r}"
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
            while pending and pending[0][0] in out:
                pending.pop(0)[1](master)
        return proc.wait(timeout=60), out
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _type(data: bytes) -> Any:
    return lambda master: os.write(master, data)


def test_second_ctrl_c_ends_the_remote_group(server: Any, tmp_path: Path) -> None:
    """The child exits on the first ^C; its background job (which a non-interactive
    shell starts with SIGINT ignored) holds stdout; the second ^C ends it."""
    pidfile = tmp_path / "pid"
    script = (f'trap "echo trapped; exit 9" INT; sleep 300 & echo $! > {pidfile}; '
              "echo ready; wait")
    code, out = _on_terminal([*EXEC, "--url", server.url, "--", "sh", "-c", script],
                             steps=[(b"ready", _type(b"\x03")), (b"trapped", _type(b"\x03"))])
    assert code == 130, out
    assert b"trapped" in out
    pid = int(pidfile.read_text())
    import time

    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{pid}") and _state(pid) != "Z":
        assert time.monotonic() < deadline, "the background job survived"
        select_wait(0.05)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return "gone"
    return data[data.rindex(b")") + 2:].split()[0].decode()


def select_wait(seconds: float) -> None:
    import select

    select.select([], [], [], seconds)


def test_tty_follows_the_terminal_size(server: Any) -> None:
    import fcntl
    import struct
    import termios

    def resize(master: int) -> None:
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 132, 0, 0))

    # The size at start is sent right after process/start; typing a line after
    # "ready" orders the first `stty size` after it (same connection, in order).
    script = ("echo ready; read l; stty size; trap 'stty size; exit 0' WINCH; echo armed; "
              "while :; do read l; done")
    code, out = _on_terminal([*EXEC, "--url", server.url, "--tty", "--", "sh", "-c", script],
                             steps=[(b"ready", _type(b"\r")), (b"armed", resize)],
                             size=(33, 101))
    assert code == 0, out
    assert b"33 101" in out and b"50 132" in out


async def test_non_utf8_env_value_is_refused_clearly(server: Any) -> None:
    proc = await asyncio.create_subprocess_exec(
        *EXEC, "--url", server.url, "--env", b"NAME=caf\xe9", "--", "true",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert err == (b"exec-server exec: --env 'NAME': not valid UTF-8; the protocol carries "
                   b"the environment as text\n")
