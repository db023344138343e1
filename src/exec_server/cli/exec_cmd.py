"""``exec-server exec``: run one command on a remote exec-server and mirror it locally:
output, stdin and ^C (pipe mode) or a raw terminal (``--tty``), the exit code (behaviour
and exit codes: docs/client.md)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import os
import signal
import ssl
import sys
import termios
import tty as tty_mod
from collections.abc import Iterator, Sequence
from typing import Any, Final
from urllib.parse import urlsplit

from exec_server.cli.args import add_sandbox_flags, command_words, is_utf8
from exec_server.client import ClientError, ExecServerClient, NotSupportedError, ProcessHandle
from exec_server.client.environment import TOKEN_ENV_VAR
from exec_server.client.fs import RemoteFileSystem
from exec_server.client.run import inherit_server_env
from exec_server.client.sandbox_contexts import full_access, read_only, workspace_write
from exec_server.exceptions import ExecServerError
from exec_server.protocol.types.process import (
    METHOD_CLOSE_STDIN,
    METHOD_RESIZE_PTY,
    ProcessStream,
    WriteStatus,
)

__all__ = ["register"]

#: ``exec`` itself failed rather than the remote command (as ``ssh`` does).
EXIT_CLIENT_FAILURE: Final = 255
EXIT_USAGE: Final = 2
#: After a second ^C we stop waiting (the shell's code for death by SIGINT).
EXIT_INTERRUPTED: Final = 130
#: Our stdout's reader went away (``| head``): as if SIGPIPE had killed us.
EXIT_BROKEN_PIPE: Final = 128 + signal.SIGPIPE
#: Sent to the PTY when our stdin ends (the terminal's EOF character).
_EOT: Final = b"\x04"
_STDIN_READ_SIZE: Final = 65536


class _Abandoned(Exception):
    """Second ^C: the remote group was told to terminate; stop mirroring."""


class _OutputClosed(Exception):
    """Our stdout or stderr is a pipe whose reader is gone."""


def register(p: argparse.ArgumentParser) -> None:
    p.description = "Run CMD on the exec-server at --url, stream its output, exit with its code."
    p.add_argument("--url", required=True, help="ws://HOST:PORT (or wss://) of the exec-server")
    p.add_argument("--token-file", metavar="PATH",
                   help="file holding the server's --ws-auth token (default: $EXEC_SERVER_TOKEN)")
    p.add_argument("--ca-file", metavar="PATH", help="CA certificate(s) for a wss:// server")
    p.add_argument("--tty", action="store_true", help="run on a PTY and forward stdin")
    p.add_argument("--cwd", default=None, help="remote working directory (default: ours)")
    p.add_argument("--env", action="append", default=[], metavar="K=V",
                   help="set a variable in the remote environment (repeatable)")
    p.add_argument("-n", "--no-stdin", action="store_true",
                   help="do not forward stdin (pipe mode; the command reads /dev/null)")
    add_sandbox_flags(p, default=None,
                      sandbox_help="confine the command on the server (default: unconfined)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ARGS...")
    p.set_defaults(func=_run)


def _fail(message: str, code: int = EXIT_USAGE) -> int:
    print(f"exec-server exec: {message}", file=sys.stderr)
    return code


def _shown(text: str) -> str:
    return ascii(os.fsencode(text))[1:]


def _check_url(url: str) -> None:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError as exc:
        raise ValueError(f"--url {url}: {exc}") from None
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise ValueError(f"--url {url}: expected ws://HOST:PORT")


def _run(ns: argparse.Namespace) -> int:
    argv = command_words(ns)
    try:
        env = _checked_command(ns, argv)
        _check_url(ns.url)
        cwd = os.path.abspath(ns.cwd) if ns.cwd else _our_cwd()
        _check_sandbox_flags(ns)
        token, context = _connection_options(ns)
    except ValueError as exc:
        return _fail(str(exc))
    # ^C before the command started: main() returns 130 (EXIT_INTERRUPTED).
    return asyncio.run(_exec(ns, argv, cwd=cwd, env=env, token=token, tls=context))


def _checked_command(ns: argparse.Namespace, argv: Sequence[str]) -> dict[str, str]:
    """Check the command and ``--env`` pairs; return the environment to send."""
    if not argv:
        raise ValueError("missing command (use: -- CMD ARGS...)")
    if not argv[0]:
        raise ValueError("empty command name")
    env: dict[str, str] = {}
    for item in ns.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--env expects K=V, got {item!r}")
        env[key] = value
    for n, arg in enumerate(argv):
        if not is_utf8(arg):
            raise ValueError(f"argument {n + 1} ({_shown(arg)}) is not valid UTF-8; the "
                             "protocol carries arguments as text")
    for key, value in env.items():
        if not (is_utf8(key) and is_utf8(value)):
            raise ValueError(f"--env {_shown(key)}: not valid UTF-8; the protocol carries the "
                             "environment as text")
    return env


def _our_cwd() -> str:
    try:
        return os.getcwd()
    except OSError as exc:
        raise ValueError(
            f"the current directory is gone ({exc.strerror}); pass --cwd DIR"
        ) from None


def _check_sandbox_flags(ns: argparse.Namespace) -> None:
    if ns.writable_root and ns.sandbox != "workspace-write":
        raise ValueError("--writable-root needs --sandbox workspace-write")
    if ns.network and ns.sandbox not in ("read-only", "workspace-write"):
        raise ValueError("--network needs --sandbox read-only or workspace-write")
    for root in ns.writable_root:
        if not os.path.isabs(root):
            raise ValueError(f"--writable-root {root}: must be an absolute path")


def _connection_options(ns: argparse.Namespace) -> tuple[str | None, ssl.SSLContext | None]:
    """The token (``--token-file``, else ``$EXEC_SERVER_TOKEN``) and TLS trust (``--ca-file``)."""
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
    return token, context


async def _sandbox_context(client: ExecServerClient, ns: argparse.Namespace, cwd: str) -> Any:
    """The context for ``--sandbox`` (None without it); ValueError for a bad writable root."""
    if ns.sandbox is None:
        return None
    fs = RemoteFileSystem(client)
    for root in ns.writable_root:
        try:
            meta = await fs.get_metadata(root)
        except ExecServerError as exc:
            raise ValueError(f"--writable-root {root}: {exc.message} (on the server)") from None
        if not meta.is_directory:
            raise ValueError(f"--writable-root {root}: not a directory (on the server)")
    if ns.sandbox == "read-only":
        return read_only(cwd, network=ns.network)
    if ns.sandbox == "workspace-write":
        return workspace_write(cwd, network=ns.network, writable_roots=ns.writable_root)
    return full_access(cwd)


async def _diagnose_start(client: ExecServerClient, cwd: str, explicit: bool,
                          argv: Sequence[str], exc: Exception) -> str:
    """A missing working directory fails the spawn with ENOENT, which the server
    words like a missing program: blame what really failed."""
    try:
        meta = await RemoteFileSystem(client).get_metadata(cwd)
        problem = None if meta.is_directory else os.strerror(errno.ENOTDIR)
    except ExecServerError:
        problem = os.strerror(errno.ENOENT)
    if problem is not None:
        where = f"--cwd {cwd}" if explicit else f"working directory {cwd}"
        hint = "" if explicit else " (pass --cwd)"
        return f"{where}: {problem} on the server{hint}"
    return f"{argv[0]}: {exc}"


async def _exec(ns: argparse.Namespace, argv: Sequence[str], *, cwd: str, env: dict[str, str],
                token: str | None, tls: ssl.SSLContext | None) -> int:
    tty: bool = ns.tty
    try:
        client = await ExecServerClient.connect(
            ns.url, client_name="exec-server-exec", token=token, ssl=tls
        )
    except ClientError as exc:
        return _fail(str(exc), EXIT_CLIENT_FAILURE)
    async with client:
        try:
            sandbox = await _sandbox_context(client, ns, cwd)
            has_stdin = sys.stdin is not None and not ns.no_stdin
            forward_stdin = (not tty and has_stdin
                             and await client.supports(METHOD_CLOSE_STDIN))
            if not tty and has_stdin and not forward_stdin and not sys.stdin.isatty():
                print("exec-server exec: this server cannot end a command's input "
                      "(no process/closeStdin): stdin is not forwarded", file=sys.stderr)
            resizable = (tty and sys.stdin is not None and sys.stdin.isatty()
                         and await client.supports(METHOD_RESIZE_PTY))
        except ValueError as exc:
            return _fail(str(exc))
        except (ExecServerError, ClientError) as exc:
            return _fail(str(exc), EXIT_CLIENT_FAILURE)
        try:
            handle = await client.spawn(argv, cwd=cwd, env=env, env_policy=inherit_server_env(),
                                        tty=tty, pipe_stdin=forward_stdin, sandbox=sandbox)
        except ExecServerError as exc:
            message = await _diagnose_start(client, cwd, ns.cwd is not None, argv, exc)
            return _fail(message, EXIT_CLIENT_FAILURE)
        except ClientError as exc:
            return _fail(f"{argv[0]}: {exc}", EXIT_CLIENT_FAILURE)
        try:
            with (
                _signal_queue(signal.SIGINT, enabled=not tty) as interrupts,
                _signal_queue(signal.SIGWINCH, enabled=resizable) as resizes,
                _raw_stdin(tty),
            ):
                async with asyncio.TaskGroup() as tg:
                    helpers = [tg.create_task(_forward_interrupts(handle, interrupts))]
                    if forward_stdin or (tty and sys.stdin is not None):
                        helpers.append(tg.create_task(_pump_stdin(handle, tty=tty)))
                    if resizable:
                        resizes.put_nowait(None)  # the size at start
                        helpers.append(tg.create_task(_follow_size(handle, resizes)))
                    async for chunk in handle:
                        fd = 2 if chunk.stream is ProcessStream.STDERR else 1
                        _write_all(fd, chunk.chunk)
                    for task in helpers:
                        task.cancel()
                status = await handle.wait()
        except* _Abandoned:
            code = EXIT_INTERRUPTED
        except* _OutputClosed:
            with contextlib.suppress(ExecServerError, ClientError):
                await handle.terminate()
            code = EXIT_BROKEN_PIPE
        except* (ExecServerError, ClientError) as group:
            code = _fail(str(group.exceptions[0]), EXIT_CLIENT_FAILURE)
        else:
            code = status.code if 0 <= status.code <= 255 else 1
    return code


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    try:
        while view:
            n = os.write(fd, view)
            view = view[n:]
    except BrokenPipeError:
        # Nothing more can be shown; keep the interpreter's final flush quiet too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
        raise _OutputClosed from None


async def _pump_stdin(handle: ProcessHandle, *, tty: bool) -> None:
    """Forward our stdin; at its end send the terminal's EOF character (PTY) or close
    the remote stdin (pipes)."""
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
        polled = True
    except (ValueError, OSError):
        polled = False  # regular files cannot be polled: read them in a thread
    try:
        while data := await (queue.get() if polled
                             else asyncio.to_thread(os.read, fd, _STDIN_READ_SIZE)):
            if await handle.write(data) is not WriteStatus.ACCEPTED:
                return
        if tty:
            await handle.write(_EOT)
        else:
            await handle.close_stdin()
    finally:
        if polled:
            loop.remove_reader(fd)


async def _forward_interrupts(handle: ProcessHandle, interrupts: asyncio.Queue[None]) -> None:
    """Pipe mode ^C: the first interrupts the remote group (terminates it where
    ``process/signal`` is unknown); the second terminates it and gives up waiting."""
    await interrupts.get()
    try:
        await handle.signal()
    except ExecServerError:
        await handle.terminate()
    await interrupts.get()
    await handle.terminate()
    raise _Abandoned


async def _follow_size(handle: ProcessHandle, resizes: asyncio.Queue[None]) -> None:
    """Keep the remote PTY as big as our terminal (at start, then per SIGWINCH)."""
    while True:
        await resizes.get()
        try:
            size = os.get_terminal_size(sys.stdin.fileno())
        except OSError:
            continue
        if size.lines <= 0 or size.columns <= 0:  # a terminal that never got a size
            continue
        try:
            await handle.resize(size.lines, size.columns)
        except NotSupportedError:
            return


@contextlib.contextmanager
def _signal_queue(sig: int, *, enabled: bool) -> Iterator[asyncio.Queue[None]]:
    """A queue that gets an item per ``sig`` while in the block (when ``enabled``)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[None] = asyncio.Queue()
    if enabled:
        loop.add_signal_handler(sig, queue.put_nowait, None)
    try:
        yield queue
    finally:
        if enabled:
            loop.remove_signal_handler(sig)


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
