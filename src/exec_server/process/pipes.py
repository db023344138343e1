"""Spawn a child on pipes (PROTOCOL.md §8.3, §8.8) and the fd helpers both modes share.

The child leads its own process group (so terminate can kill the whole
group), inherits only stdio plus ``LaunchSpec.pass_fds`` (``close_fds``), and
gets stdin from ``/dev/null`` unless ``pipe_stdin`` asks for a writable pipe.

Why ``subprocess.Popen`` with plain fds and no ``preexec_fn``: CPython then
spawns with ``vfork`` (~0.15 ms) instead of ``fork`` (~2 ms for a server-sized
process, which would dominate ``true`` start→closed). ``PR_SET_PDEATHSIG``
needs child-side code, so death-of-server cleanup is :class:`ProcessGuard`'s
job instead (it kills whole groups, which PDEATHSIG would not).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
from dataclasses import dataclass, field

from exec_server.process.spec import LaunchSpec
from exec_server.protocol.process_types import ProcessStream

__all__ = ["PIPE_SIZE", "ProcessGuard", "SpawnedChild", "close_quietly", "spawn_pipes"]

#: Kernel pipe buffer for stdout/stderr: bigger bursts, fewer wake-ups.
PIPE_SIZE = 1 << 20
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


@dataclass(slots=True)
class SpawnedChild:
    """A freshly spawned child and the parent's ends of its stdio.

    Attributes:
        pid: the child (also its process-group id).
        outputs: ``(stream, fd)`` pairs to read, non-blocking.
        stdin_fd: non-blocking writable fd (pipe or PTY master dup), or None.
        popen: kept so ``subprocess`` never warns about an unreaped child;
            the manager reaps it and sets ``returncode``.
    """

    pid: int
    outputs: list[tuple[ProcessStream, int]]
    stdin_fd: int | None
    popen: subprocess.Popen[bytes] | None = None
    extra_fds: list[int] = field(default_factory=list)


def close_quietly(fd: int | None) -> None:
    """Close ``fd`` ignoring errors (it may already be gone)."""
    if fd is None or fd < 0:
        return
    with contextlib.suppress(OSError):
        os.close(fd)


def _grow_pipe(fd: int) -> None:
    with contextlib.suppress(OSError):  # pipe-max-size below ours: keep the default
        fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_SIZE)


def child_args(spec: LaunchSpec) -> tuple[list[str], str]:
    """``(argv as the child sees it, program to execute)`` honouring ``arg0``."""
    argv = list(spec.argv)
    program = argv[0]
    if spec.arg0 is not None:
        argv[0] = spec.arg0
    return argv, program


def spawn_pipes(spec: LaunchSpec) -> SpawnedChild:
    """Spawn ``spec`` on pipes; the caller owns the returned fds.

    Raises:
        OSError: exec or cwd failure (``errno`` set, e.g. ENOENT).
    """
    argv, program = child_args(spec)
    to_close: list[int] = []
    parent_fds: list[int] = []
    try:
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        parent_fds.append(out_r)
        to_close.append(out_w)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        parent_fds.append(err_r)
        to_close.append(err_w)
        stdin_w: int | None = None
        if spec.pipe_stdin:
            in_r, stdin_w = os.pipe2(os.O_CLOEXEC)
            parent_fds.append(stdin_w)
            to_close.append(in_r)
            stdin_arg: int = in_r
        else:
            stdin_arg = subprocess.DEVNULL
        _grow_pipe(out_w)
        _grow_pipe(err_w)
        popen = subprocess.Popen(
            argv,
            executable=program,
            stdin=stdin_arg,
            stdout=out_w,
            stderr=err_w,
            cwd=spec.cwd,
            env=spec.env,
            close_fds=True,
            pass_fds=spec.pass_fds,
            process_group=0,
            restore_signals=True,
        )
    except BaseException:
        for fd in parent_fds:
            close_quietly(fd)
        raise
    finally:
        for fd in to_close:
            close_quietly(fd)
    os.set_blocking(out_r, False)
    os.set_blocking(err_r, False)
    if stdin_w is not None:
        os.set_blocking(stdin_w, False)
    return SpawnedChild(
        pid=popen.pid,
        outputs=[(ProcessStream.STDOUT, out_r), (ProcessStream.STDERR, err_r)],
        stdin_fd=stdin_w,
        popen=popen,
    )


_GUARD_CODE = """
import os, signal
groups = set()
buf = b""
while True:
    try:
        data = os.read(0, 65536)
    except InterruptedError:
        continue
    if not data:
        break
    buf += data
    *lines, buf = buf.split(b"\\n")
    for line in lines:
        if line[:1] == b"+":
            groups.add(int(line[1:]))
        elif line[:1] == b"-":
            groups.discard(int(line[1:]))
for group in groups:
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass
"""


class ProcessGuard:
    """Kills registered process groups when the server dies, however it dies.

    ``PR_SET_PDEATHSIG`` would need code in every child (a ``fork`` instead
    of ``vfork``: ~2 ms per spawn) and only kills the group leader. Instead a
    tiny helper (own session, stdin = a pipe from us) learns each group id
    and, on EOF of that pipe (our exit, crash or SIGKILL), SIGKILLs every
    group still registered. Started lazily on the first spawn; the manager
    closes it (it exits cleanly) once no group has been registered
    for a while, so an idle server keeps no extra child or fd.
    """

    def __init__(self) -> None:
        self._fd: int | None = None
        self._popen: subprocess.Popen[bytes] | None = None
        self._failed = False
        self._groups: set[int] = set()

    def _start(self) -> None:
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        try:
            self._popen = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _GUARD_CODE],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd="/",
                close_fds=True,
                start_new_session=True,
            )
        except OSError:
            close_quietly(write_end)
            self._failed = True
            return
        finally:
            close_quietly(read_end)
        os.set_blocking(write_end, False)
        self._fd = write_end

    def _send(self, line: bytes) -> None:
        if self._fd is None:
            if self._failed:
                return
            self._start()
            if self._fd is None:
                return
        # Guard gone or pipe full: best effort; the manager still kills on shutdown.
        with contextlib.suppress(OSError):
            os.write(self._fd, line)

    def add(self, pgid: int) -> None:
        self._groups.add(pgid)
        self._send(b"+%d\n" % pgid)

    def discard(self, pgid: int) -> None:
        self._groups.discard(pgid)
        if self._fd is not None:
            self._send(b"-%d\n" % pgid)

    @property
    def idle(self) -> bool:
        """No group registered: the guard may be closed until the next spawn."""
        return not self._groups

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    def close(self) -> subprocess.Popen[bytes] | None:
        """Close our end (the guard exits after killing what is still registered).

        Returns the guard's ``Popen`` for the caller to reap, or None.
        """
        close_quietly(self._fd)
        self._fd = None
        popen, self._popen = self._popen, None
        return popen
