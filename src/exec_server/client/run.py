"""``run()``: ``subprocess.run`` for an exec backend (start, feed, collect, check),
shared by the client and both backends, which pass their own ``start``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Final, TypedDict, Unpack

import msgspec

from exec_server.client.errors import ClientError, ProcessError, ProcessTimeoutError
from exec_server.client.process import CompletedProcess, ProcessHandle, SpawnOptions
from exec_server.exceptions import ExecServerError
from exec_server.process.spec import ExitStatus
from exec_server.protocol.types.process import EnvPolicy, ProcessStream

__all__ = ["DEFAULT_SHELL", "TERMINATE_WAIT", "RunOptions", "inherit_server_env", "run_command"]

#: ``shell=True`` runs ``DEFAULT_SHELL -c CMD`` on the server.
DEFAULT_SHELL: Final = "/bin/sh"
#: After a timeout, how long to wait for the terminated group's last output and status.
TERMINATE_WAIT: Final = 10.0

Start = Callable[..., Awaitable[ProcessHandle]]


def inherit_server_env() -> EnvPolicy:
    """The server's environment minus ``*KEY*``/``*SECRET*``/``*TOKEN*`` names (as codex's
    shell tool gives it)."""
    return EnvPolicy(
        inherit="all", ignore_default_excludes=False, exclude=[], set={}, include_only=[]
    )


def _argv(cmd: str | Sequence[str], shell: bool) -> list[str]:
    if shell:
        if not isinstance(cmd, str):
            raise TypeError("shell=True takes the command as one string")
        return [DEFAULT_SHELL, "-c", cmd]
    if isinstance(cmd, str):
        raise TypeError("a command string needs shell=True; otherwise pass a list of arguments")
    argv = list(cmd)
    if not argv:
        raise ValueError("empty command")
    return argv


class RunOptions(TypedDict, total=False):
    """``run()``'s keyword arguments after ``cmd`` (docs/client.md, "One call: run");
    ``env_policy`` defaults to :func:`inherit_server_env`."""

    shell: bool
    timeout: float | None
    check: bool
    input: bytes | None
    env: Mapping[str, str] | None
    env_policy: EnvPolicy | None
    cwd: str | None
    tty: bool
    sandbox: msgspec.Struct | None


async def run_command(
    start: Start, cmd: str | Sequence[str], **options: Unpack[RunOptions]
) -> CompletedProcess:
    unknown = options.keys() - RunOptions.__optional_keys__
    if unknown:
        raise TypeError(f"run() got unexpected keyword arguments: {sorted(unknown)}")
    argv = _argv(cmd, options.get("shell", False))
    timeout = options.get("timeout")
    input = options.get("input")
    tty = options.get("tty", False)
    env_policy = options.get("env_policy")
    spawn: SpawnOptions = {
        "cwd": options.get("cwd"),
        "env": options.get("env"),
        "env_policy": inherit_server_env() if env_policy is None else env_policy,
        "tty": tty,
        "pipe_stdin": input is not None and not tty,
        "sandbox": options.get("sandbox"),
    }
    handle = await start(argv, **spawn)
    out, err = bytearray(), bytearray()

    async def drain() -> ExitStatus:
        async for chunk in handle:
            (err if chunk.stream is ProcessStream.STDERR else out).extend(chunk.chunk)
        return await handle.wait()

    async def feed() -> None:
        assert input is not None
        if input:
            await handle.write(input)
        if tty:
            await handle.write(b"\x04")
        else:
            await handle.close_stdin()

    try:
        async with asyncio.timeout(timeout):
            if input is not None:
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(feed())
                    status_task = tg.create_task(drain())
                status = status_task.result()
            else:
                status = await drain()
    except TimeoutError:
        code = await _terminate_and_settle(handle, drain)
        raise ProcessTimeoutError(
            argv, code, bytes(out), bytes(err),
            f"command {argv!r} timed out after {timeout} s; its process group was terminated",
        ) from None
    except BaseException:
        with contextlib.suppress(Exception):
            await handle.terminate()
        handle.release()
        raise
    result = CompletedProcess(bytes(out), bytes(err), status)
    if options.get("check", False) and result.exit_code != 0:
        raise ProcessError(argv, result.exit_code, result.stdout, result.stderr)
    return result


async def _terminate_and_settle(handle: ProcessHandle,
                                drain: Callable[[], Awaitable[ExitStatus]]) -> int:
    with contextlib.suppress(ExecServerError, ClientError):
        await handle.terminate()
    try:
        async with asyncio.timeout(TERMINATE_WAIT):
            return (await drain()).code
    except (TimeoutError, ExecServerError, ClientError):
        handle.release()
        return -1
