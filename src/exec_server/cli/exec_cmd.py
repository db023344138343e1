"""``exec-server exec``: run one command on a remote exec-server and mirror it locally.

Streams the remote output to our stdout/stderr, forwards stdin in ``--tty`` mode
(raw terminal while it runs, restored afterwards) and exits with the remote exit
code. Our own failures (cannot connect, spawn refused, connection lost) print one
line to stderr and exit 255, like ``ssh``.

The remote child's environment is the *server's* environment (``envPolicy``
inherit ``all`` with the default secret-name excludes) plus ``--env`` pairs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import termios
import tty as tty_mod
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Final, NamedTuple

if TYPE_CHECKING:
    import ssl

    from exec_server.client import ProcessHandle

__all__ = ["register"]

#: Exit status for failures of ``exec`` itself rather than of the remote command.
EXIT_CLIENT_FAILURE: Final = 255
#: Sent to the PTY when our stdin ends (the terminal's EOF character).
_EOT: Final = b"\x04"
_STDIN_READ_SIZE: Final = 65536


class ConnectionOptions(NamedTuple):
    token: str | None
    ssl: ssl.SSLContext | None


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``exec`` subcommand."""
    p = subparsers.add_parser(
        "exec",
        help="run a command on a remote exec-server",
        description="Run CMD on the exec-server at --url, stream its output, exit with its code.",
    )
    p.add_argument("--url", required=True, help="ws://HOST:PORT (or wss://) of the exec-server")
    p.add_argument(
        "--token-file",
        metavar="PATH",
        help="file holding the server's --ws-auth token (default: $EXEC_SERVER_TOKEN)",
    )
    p.add_argument(
        "--ca-file", metavar="PATH", help="CA certificate(s) for a wss:// server"
    )
    p.add_argument("--tty", action="store_true", help="run on a PTY and forward stdin")
    p.add_argument("--cwd", default=None, help="remote working directory (default: ours)")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="K=V",
        help="set a variable in the remote environment (repeatable)",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ARGS...")
    p.set_defaults(func=_run)


def _run(ns: argparse.Namespace) -> int:
    argv: list[str] = list(ns.command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print("exec-server exec: missing command (use: -- CMD ARGS...)", file=sys.stderr)
        return 2
    env: dict[str, str] = {}
    for item in ns.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            print(f"exec-server exec: --env expects K=V, got {item!r}", file=sys.stderr)
            return 2
        env[key] = value
    cwd = os.path.abspath(ns.cwd) if ns.cwd else os.getcwd()
    try:
        connection = _connection_options(ns)
    except ValueError as exc:
        print(f"exec-server exec: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_exec(ns.url, argv, cwd=cwd, env=env, tty=ns.tty, connection=connection))


def _connection_options(ns: argparse.Namespace) -> ConnectionOptions:
    """The token (``--token-file``, else ``$EXEC_SERVER_TOKEN``) and TLS trust (``--ca-file``).

    Raises:
        ValueError: a file cannot be read, or the token file is empty.
    """
    import ssl

    from exec_server.client.environment import TOKEN_ENV_VAR

    token: str | None
    if ns.token_file is not None:
        try:
            with open(ns.token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read --token-file {ns.token_file}: {exc}") from None
        if not token:
            raise ValueError(f"--token-file {ns.token_file} is empty")
    else:
        token = os.environ.get(TOKEN_ENV_VAR, "").strip() or None
    context = None
    if ns.ca_file is not None:
        try:
            context = ssl.create_default_context(cafile=ns.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"cannot load --ca-file {ns.ca_file}: {exc}") from None
    return ConnectionOptions(token=token, ssl=context)


async def _exec(
    url: str,
    argv: Sequence[str],
    *,
    cwd: str,
    env: dict[str, str],
    tty: bool,
    connection: ConnectionOptions,
) -> int:
    from exec_server.client import ClientError, ExecServerClient
    from exec_server.exceptions import ExecServerError
    from exec_server.protocol.process_types import EnvPolicy, ProcessStream

    try:
        client = await ExecServerClient.connect(
            url, client_name="exec-server-exec", token=connection.token, ssl=connection.ssl
        )
    except ClientError as exc:
        print(f"exec-server exec: {exc}", file=sys.stderr)
        return EXIT_CLIENT_FAILURE
    async with client:
        policy = EnvPolicy(
            inherit="all", ignore_default_excludes=False, exclude=[], set={}, include_only=[]
        )
        try:
            handle = await client.spawn(
                argv, cwd=cwd, env=env, env_policy=policy, tty=tty
            )
        except (ExecServerError, ClientError) as exc:
            print(f"exec-server exec: {argv[0]}: {exc}", file=sys.stderr)
            return EXIT_CLIENT_FAILURE
        loop = asyncio.get_running_loop()
        interrupts: asyncio.Queue[None] = asyncio.Queue()
        try:
            with _sigint_forwarded(loop, interrupts, enabled=not tty), _raw_stdin(tty):
                async with asyncio.TaskGroup() as tg:
                    if tty:
                        stdin_task = tg.create_task(_pump_stdin(handle))
                    interrupt_task = tg.create_task(_forward_interrupts(handle, interrupts))
                    async for chunk in handle:
                        fd = 2 if chunk.stream is ProcessStream.STDERR else 1
                        _write_all(fd, chunk.chunk)
                    if tty:
                        stdin_task.cancel()
                    interrupt_task.cancel()
                status = await handle.wait()
        except* (ExecServerError, ClientError) as group:
            print(f"exec-server exec: {group.exceptions[0]}", file=sys.stderr)
            code = EXIT_CLIENT_FAILURE
        else:
            code = status.code if 0 <= status.code <= 255 else 1
    return code


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


async def _pump_stdin(handle: ProcessHandle) -> None:
    """Forward our stdin to the remote PTY; at EOF send the terminal EOF character."""
    loop = asyncio.get_running_loop()
    fd = sys.stdin.fileno()
    queue: asyncio.Queue[bytes] = asyncio.Queue()

    def on_readable() -> None:
        try:
            data = os.read(fd, _STDIN_READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            loop.remove_reader(fd)
        queue.put_nowait(data)

    try:
        loop.add_reader(fd, on_readable)
    except (PermissionError, ValueError):
        # Regular files cannot be polled: read them in a thread.
        while data := await asyncio.to_thread(os.read, fd, _STDIN_READ_SIZE):
            await handle.write(data)
        await handle.write(_EOT)
        return
    try:
        while data := await queue.get():
            await handle.write(data)
        await handle.write(_EOT)
    finally:
        loop.remove_reader(fd)


async def _forward_interrupts(handle: ProcessHandle, interrupts: asyncio.Queue[None]) -> None:
    """Ctrl-C in pipe mode: interrupt the remote process (terminate if unsupported)."""
    from exec_server.exceptions import ExecServerError

    while True:
        await interrupts.get()
        try:
            await handle.signal()
        except ExecServerError:
            await handle.terminate()


@contextlib.contextmanager
def _sigint_forwarded(
    loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[None], *, enabled: bool
) -> Iterator[None]:
    if not enabled:
        yield
        return
    loop.add_signal_handler(signal.SIGINT, queue.put_nowait, None)
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGINT)


@contextlib.contextmanager
def _raw_stdin(enabled: bool) -> Iterator[None]:
    """Raw mode on a terminal stdin for the duration; restored even on errors."""
    if not enabled or not sys.stdin.isatty():
        yield
        return
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    # TCSANOW, not setraw's default TCSAFLUSH: keep what the user typed ahead.
    tty_mod.setraw(fd, termios.TCSANOW)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
