"""One behaviour suite, run against the local and the remote backend."""

from __future__ import annotations

from typing import Any

import pytest

from exec_server.client import ExecBackend, Signal
from exec_server.exceptions import InternalError, InvalidParamsError
from exec_server.protocol.types.process import ProcessStream, WriteStatus

TIMEOUT = 15


async def test_backend_satisfies_protocol(backend: Any) -> None:
    assert isinstance(backend, ExecBackend)


async def test_pipes_stdout_stderr_and_exit_code(backend: Any, sh_env: dict[str, str]) -> None:
    proc = await backend.start(
        ["sh", "-c", "echo out; echo err >&2; exit 3"], cwd="/", env=sh_env
    )
    result = await proc.collect()
    assert result.stdout == b"out\n"
    assert result.stderr == b"err\n"
    assert result.exit_code == 3
    assert proc.closed and proc.exit_code == 3


async def test_iteration_yields_labelled_chunks_in_seq_order(
    backend: Any, sh_env: dict[str, str]
) -> None:
    proc = await backend.start(["sh", "-c", "printf a; printf b >&2"], cwd="/", env=sh_env)
    chunks = [c async for c in proc]
    seqs = [c.seq for c in chunks]
    assert seqs == sorted(seqs)
    by_stream = {c.stream: c.chunk for c in chunks}
    assert by_stream == {ProcessStream.STDOUT: b"a", ProcessStream.STDERR: b"b"}
    assert (await proc.wait()).code == 0


async def test_bare_program_name_and_exact_env(backend: Any, tmp_path: Any) -> None:
    proc = await backend.start(
        ["sh", "-c", 'echo "$FOO:$(pwd)"'], cwd=str(tmp_path), env={"FOO": "bar"}
    )
    result = await proc.collect()
    assert result.stdout == f"bar:{tmp_path}\n".encode()


async def test_large_output_is_complete(backend: Any, sh_env: dict[str, str]) -> None:
    size = 3 * 1024 * 1024
    proc = await backend.start(["head", "-c", str(size), "/dev/zero"], cwd="/", env=sh_env)
    total = 0
    async for chunk in proc:
        total += len(chunk.chunk)
    assert total == size
    assert (await proc.wait()).code == 0


async def test_tty_write_is_echoed(backend: Any, sh_env: dict[str, str]) -> None:
    proc = await backend.start(
        ["sh", "-c", "read line; echo got:$line"], cwd="/", env=sh_env, tty=True
    )
    assert await proc.write(b"hello\n") is WriteStatus.ACCEPTED
    result = await proc.collect()
    assert b"hello" in result.stdout
    assert b"got:hello" in result.stdout
    assert result.stderr == b""
    assert result.exit_code == 0


async def test_pty_chunks_are_labelled_pty(backend: Any, sh_env: dict[str, str]) -> None:
    proc = await backend.start(["echo", "x"], cwd="/", env=sh_env, tty=True)
    streams = {c.stream async for c in proc}
    assert streams == {ProcessStream.PTY}


async def test_write_to_pipe_process_without_stdin_is_refused(
    backend: Any, sh_env: dict[str, str]
) -> None:
    proc = await backend.start(["sh", "-c", "exit 0"], cwd="/", env=sh_env)
    assert await proc.write(b"x") is WriteStatus.STDIN_CLOSED
    await proc.wait()


async def test_pipe_stdin_write(backend: Any, sh_env: dict[str, str]) -> None:
    proc = await backend.start(
        ["sh", "-c", "read line; echo got:$line"], cwd="/", env=sh_env, pipe_stdin=True
    )
    assert await proc.write(b"abc\n") is WriteStatus.ACCEPTED
    result = await proc.collect()
    assert result.stdout == b"got:abc\n"


async def test_terminate_kills_and_reports_signal_exit(
    backend: Any, sh_env: dict[str, str]
) -> None:
    proc = await backend.start(["sleep", "60"], cwd="/", env=sh_env)
    assert await proc.terminate() is True
    status = await proc.wait()
    assert status.code != 0
    assert await proc.terminate() is False


async def test_signal_interrupt(backend: Any, sh_env: dict[str, str]) -> None:
    proc = await backend.start(["sh", "-c", "echo ready; exec sleep 60"], cwd="/", env=sh_env)
    first = await proc.read_chunk()
    assert first is not None and first.chunk == b"ready\n"
    await proc.signal(Signal.INTERRUPT)
    status = await proc.wait()
    assert status.code == 130


async def test_spawn_failure_maps_to_internal_error(backend: Any) -> None:
    with pytest.raises(InternalError, match="No such file or directory"):
        await backend.start(["/nonexistent/program"], cwd="/", env={})


async def test_resizing_a_pipe_process_is_invalid_params(
    backend: Any, sh_env: dict[str, str]
) -> None:
    proc = await backend.start(["sleep", "30"], cwd="/", env=sh_env)
    with pytest.raises(InvalidParamsError, match=rf"^process {proc.process_id} has no PTY$"):
        await proc.resize(24, 80)
    assert await proc.terminate() is True
    await proc.wait()


async def test_empty_argv_is_rejected(backend: Any) -> None:
    with pytest.raises(InvalidParamsError, match="argv must not be empty"):
        await backend.start([], cwd="/", env={})


async def test_relative_cwd_is_rejected(backend: Any) -> None:
    with pytest.raises(InvalidParamsError, match="cwd must be absolute"):
        await backend.start(["true"], cwd="relative/dir", env={})
