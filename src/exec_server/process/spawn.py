"""Start a child on pipes or a PTY (PROTOCOL.md §8.3, §8.8), and reap it. A pipe child
leads its own process group, a PTY child its own session with the PTY as controlling
terminal; both inherit only stdio plus ``LaunchSpec.pass_fds``."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import os
import signal
import struct
import subprocess
import termios
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

from exec_server._os.linux import set_child_subreaper, set_parent_death_signal
from exec_server.process.spec import ExitStatus, LaunchServiceUnavailable, LaunchSpec
from exec_server.protocol.types.process import ProcessStream
from exec_server.sandbox.plan import SandboxType

__all__ = [
    "PIPE_SIZE",
    "SpawnedChild",
    "close_quietly",
    "exit_status_from_wait",
    "reap",
    "set_if_pending",
    "set_window_size",
    "spawn",
    "spawn_via_service",
]

#: Kernel pipe buffer for stdout/stderr: bigger bursts, fewer wake-ups.
PIPE_SIZE = 1 << 20
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
#: Ignored signals ``subprocess``'s ``restore_signals=True`` resets already.
_RESTORED_BY_SUBPROCESS = frozenset((int(signal.SIGPIPE), int(signal.SIGXFSZ)))

Stdio = tuple[int | None, int, int]
Outputs = list[tuple[ProcessStream, int]]


@dataclass(slots=True)
class SpawnedChild:
    """A spawned child (``pid`` is also its group id), our ends of its stdio, its raw wait
    status to await; ``popen`` (None from a launch service) keeps ``subprocess`` quiet."""

    pid: int
    outputs: Outputs
    stdin_fd: int | None
    exit_status: Callable[[], Awaitable[int]]
    popen: subprocess.Popen[bytes] | None = None


def close_quietly(fd: int | None) -> None:
    if fd is None or fd < 0:
        return
    with contextlib.suppress(OSError):
        os.close(fd)


def set_if_pending(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def set_window_size(fd: int, rows: int, columns: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))


def exit_status_from_wait(status: int) -> ExitStatus:
    """``waitpid`` status → exit code (``128 + signal`` for signal deaths, -1 for -1)."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return ExitStatus(128 + sig, sig)
    if os.WIFEXITED(status):
        return ExitStatus(os.WEXITSTATUS(status))
    return ExitStatus(-1)


def _waitpid(pid: int, flags: int) -> int:
    try:
        return os.waitpid(pid, flags)[1]
    except ChildProcessError:
        return -1


async def reap(pid: int) -> int:
    """Wait for our child ``pid`` to exit and reap it: the raw wait status (-1: unknown)."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:  # no pidfd: a worker thread blocks in waitpid instead
        return await asyncio.to_thread(_waitpid, pid, 0)
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()
    loop.add_reader(pidfd, set_if_pending, fut)
    try:
        await fut
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)
    return _waitpid(pid, os.WNOHANG)  # the pidfd is readable: a zombie, reaped at once


# Ignored signals stay ignored across execve and the mask is inherited, so a server
# started under nohup or as a shell's `&` job would pass them on to every command;
# upstream resets both in the child, so do we. That needs a preexec_fn, which makes
# CPython fork (~2 ms) instead of vfork (~0.15 ms): a pipe child gets one only when
# there is something to reset.


def _ignored() -> list[int]:
    return [n for n in range(1, signal.NSIG) if signal.getsignal(n) is signal.SIG_IGN]


@functools.cache
def _inherited_ignored() -> bool:
    """Asked once: ignored dispositions come from whatever started us."""
    return any(n not in _RESTORED_BY_SUBPROCESS for n in _ignored())


def _reset_signals() -> None:
    """In a forked child before exec: nothing ignored, nothing blocked."""
    for n in _ignored():
        with contextlib.suppress(OSError, ValueError):
            signal.signal(n, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


def _pipe_preexec() -> Callable[[], None] | None:
    """None keeps the ``vfork`` path; so no PDEATHSIG here (``ProcessGuard`` covers it)."""
    if signal.pthread_sigmask(signal.SIG_BLOCK, ()) or _inherited_ignored():
        return _reset_signals
    return None


def _pty_setup(subreaper: bool) -> None:
    """In the forked child after setsid(): die with the server, take the controlling tty;
    unsandboxed, also adopt orphaned descendants so a double fork stays in its tree."""
    _reset_signals()
    set_parent_death_signal(int(signal.SIGKILL))
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    if subreaper:
        with contextlib.suppress(OSError):
            set_child_subreaper()


@contextlib.contextmanager
def _stdio(spec: LaunchSpec) -> Iterator[tuple[Stdio, Outputs, int | None]]:
    """The child's (stdin or None for /dev/null, stdout, stderr), our non-blocking output
    ends and stdin end. The child's ends close on leaving; ours too on an error."""
    ours: list[int] = []
    theirs: list[int] = []
    try:
        if spec.tty:
            master, slave = os.openpty()
            ours.append(master)
            theirs.append(slave)
            set_window_size(slave, 24, 80)  # upstream's; process/resizePty changes it
            ours.append(os.dup(master))  # stdin, so the reader may close the master alone
            stdio: Stdio = (slave, slave, slave)
            streams = [ProcessStream.PTY]
        else:
            for _ in range(2):
                read_end, write_end = os.pipe2(os.O_CLOEXEC)
                ours.append(read_end)
                theirs.append(write_end)
                with contextlib.suppress(OSError):  # pipe-max-size below ours: keep the default
                    fcntl.fcntl(write_end, _F_SETPIPE_SZ, PIPE_SIZE)
            stdin_end = None
            if spec.pipe_stdin:
                stdin_end, write_end = os.pipe2(os.O_CLOEXEC)
                ours.append(write_end)
                theirs.append(stdin_end)
            stdio = (stdin_end, theirs[0], theirs[1])
            streams = [ProcessStream.STDOUT, ProcessStream.STDERR]
        for fd in ours:
            os.set_blocking(fd, False)
        stdin = ours[len(streams)] if len(ours) > len(streams) else None
        yield stdio, list(zip(streams, ours, strict=False)), stdin
    except BaseException:
        for fd in ours:
            close_quietly(fd)
        raise
    finally:
        for fd in theirs:
            close_quietly(fd)


def spawn(spec: LaunchSpec) -> SpawnedChild:
    """The caller owns the returned fds; OSError on an exec or cwd failure."""
    argv = spec.argv if spec.arg0 is None else [spec.arg0, *spec.argv[1:]]
    preexec: Callable[[], None] | None
    if spec.tty:
        preexec = functools.partial(_pty_setup, spec.sandbox_type is SandboxType.NONE)
    else:
        preexec = _pipe_preexec()
    with _stdio(spec) as ((stdin, stdout, stderr), outputs, stdin_fd):
        popen = subprocess.Popen(
            argv,
            executable=spec.argv[0],
            stdin=subprocess.DEVNULL if stdin is None else stdin,
            stdout=stdout,
            stderr=stderr,
            cwd=spec.cwd,
            env=spec.env,
            close_fds=True,
            pass_fds=spec.pass_fds,
            start_new_session=spec.tty,
            process_group=None if spec.tty else 0,
            restore_signals=True,
            preexec_fn=preexec,
        )
    return SpawnedChild(popen.pid, outputs, stdin_fd, functools.partial(reap, popen.pid), popen)


async def spawn_via_service(spec: LaunchSpec, owner: object) -> SpawnedChild | None:
    """Start ``spec`` through ``spec.zygote``'s launch service (``owner`` must release it);
    None when it cannot take it now, OSError when the launch failed (e.g. no cwd)."""
    assert spec.zygote is not None
    try:
        with _stdio(spec) as (stdio, outputs, stdin_fd):
            serviced = await spec.zygote.service.spawn(
                spec.zygote.request, stdio, tty=spec.tty, owner=owner
            )
    except LaunchServiceUnavailable:
        return None
    return SpawnedChild(serviced.pid, outputs, stdin_fd, serviced.wait)
