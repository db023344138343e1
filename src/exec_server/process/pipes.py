"""Spawn a child on pipes (PROTOCOL.md §8.3, §8.8) and the fd helpers both modes share.

The child leads its own process group (so terminate can kill the whole
group), inherits only stdio plus ``LaunchSpec.pass_fds`` (``close_fds``), and
gets stdin from ``/dev/null`` unless ``pipe_stdin`` asks for a writable pipe.

Why ``subprocess.Popen`` with plain fds and no ``preexec_fn``: CPython then
spawns with ``vfork`` (~0.15 ms) instead of ``fork`` plus Python code in the
child (measured +1 to +4 ms per launch of a server-sized process, which would
dominate ``true`` start→closed). So a pipe launch does not become a child
subreaper (``process.tree``: a PTY launch, which forks anyway, does), and
``PR_SET_PDEATHSIG`` is not set: death-of-server cleanup is
:class:`ProcessGuard`'s job instead (it kills whole groups, which PDEATHSIG
would not). The one exception: a server that inherited ignored or blocked
signals resets them in the child (``child_signals``), which needs a ``preexec_fn``.

A launch a sandbox backend marked with ``LaunchSpec.zygote`` may instead be
started by that launch service (the helper zygote's Landlock launches,
:func:`spawn_via_service`): same stdio, but the child is the service's, so
``SpawnedChild.exit_status`` replaces reaping it here.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from exec_server.process.child_signals import child_preexec
from exec_server.process.spec import LaunchServiceUnavailable, LaunchSpec
from exec_server.protocol.types.process import ProcessStream

__all__ = [
    "PIPE_SIZE",
    "ProcessGuard",
    "SpawnedChild",
    "close_quietly",
    "spawn_pipes",
    "spawn_via_service",
]

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
        exit_status: set when the child is not ours (started by a launch
            service such as the helper zygote): resolves to the raw wait status
            its real parent reported; the manager awaits it instead of reaping.
    """

    pid: int
    outputs: list[tuple[ProcessStream, int]]
    stdin_fd: int | None
    popen: subprocess.Popen[bytes] | None = None
    extra_fds: list[int] = field(default_factory=list)
    exit_status: Callable[[], Awaitable[int]] | None = None


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


async def spawn_via_service(spec: LaunchSpec, owner: object | None) -> SpawnedChild | None:
    """Start ``spec`` through ``spec.zygote``'s launch service, awaited (the loop never
    blocks on it); same stdio as :func:`spawn_pipes` or ``spawn_pty`` would give.

    ``owner`` must release the service later. None: spawn it the plain way (no
    owner or service, or the service cannot take the launch now).

    Raises:
        OSError: the launch itself failed (e.g. its cwd is missing).
    """
    if owner is None or spec.zygote is None:
        return None
    parent_fds: list[int] = []
    to_close: list[int] = []
    try:
        if spec.tty:
            from exec_server.process.pty import set_window_size

            master, slave = os.openpty()
            parent_fds.append(master)
            to_close.append(slave)
            set_window_size(slave, spec.rows, spec.columns)
            parent_fds.append(os.dup(master))
            stdio: tuple[int | None, int, int] = (slave, slave, slave)
        else:
            stdio = _pipes(spec, parent_fds, to_close)
        serviced = await spec.zygote.service.spawn(
            spec.zygote.request, stdio, tty=spec.tty, owner=owner
        )
    except LaunchServiceUnavailable:
        serviced = None
    except BaseException:
        for fd in parent_fds:
            close_quietly(fd)
        raise
    finally:
        for fd in to_close:
            close_quietly(fd)
    if serviced is None:
        for fd in parent_fds:
            close_quietly(fd)
        return None
    _nonblocking(*parent_fds)
    if spec.tty:
        outputs = [(ProcessStream.PTY, parent_fds[0])]
    else:
        outputs = [(ProcessStream.STDOUT, parent_fds[0]), (ProcessStream.STDERR, parent_fds[1])]
    return SpawnedChild(pid=serviced.pid, outputs=outputs,
                        stdin_fd=parent_fds[-1] if spec.tty or spec.pipe_stdin else None,
                        exit_status=serviced.wait)


def _pipes(spec: LaunchSpec, parent_fds: list[int],
           to_close: list[int]) -> tuple[int | None, int, int]:
    """The child's (stdin or None, stdout, stderr) pipe ends; the parent's ends (stdout,
    stderr[, stdin]) go to ``parent_fds``, the child's to ``to_close``."""
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    parent_fds.append(out_r)
    to_close.append(out_w)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    parent_fds.append(err_r)
    to_close.append(err_w)
    in_r: int | None = None
    if spec.pipe_stdin:
        in_r, stdin_w = os.pipe2(os.O_CLOEXEC)
        parent_fds.append(stdin_w)
        to_close.append(in_r)
    _grow_pipe(out_w)
    _grow_pipe(err_w)
    return in_r, out_w, err_w


def spawn_pipes(spec: LaunchSpec) -> SpawnedChild:
    """Spawn ``spec.argv`` on pipes; the caller owns the returned fds.

    Raises:
        OSError: exec or cwd failure (``errno`` set, e.g. ENOENT).
    """
    argv, program = child_args(spec)
    to_close: list[int] = []
    parent_fds: list[int] = []
    try:
        in_r, out_w, err_w = _pipes(spec, parent_fds, to_close)
        popen = subprocess.Popen(
            argv,
            executable=program,
            stdin=in_r if in_r is not None else subprocess.DEVNULL,
            stdout=out_w,
            stderr=err_w,
            cwd=spec.cwd,
            env=spec.env,
            close_fds=True,
            pass_fds=spec.pass_fds,
            process_group=0,
            restore_signals=True,
            preexec_fn=child_preexec(),
        )
    except BaseException:
        for fd in parent_fds:
            close_quietly(fd)
        raise
    finally:
        for fd in to_close:
            close_quietly(fd)
    _nonblocking(*parent_fds)
    return SpawnedChild(
        pid=popen.pid,
        outputs=[(ProcessStream.STDOUT, parent_fds[0]), (ProcessStream.STDERR, parent_fds[1])],
        stdin_fd=parent_fds[2] if spec.pipe_stdin else None,
        popen=popen,
    )


def _nonblocking(*fds: int | None) -> None:
    for fd in fds:
        if fd is not None:
            os.set_blocking(fd, False)


_GUARD_CODE = """
import os, signal, struct
while True:
    try:
        if not os.read(0, 4096):
            break
    except InterruptedError:
        continue
data = os.pread(MEMFD, os.fstat(MEMFD).st_size, 0)
for (group,) in struct.iter_unpack("q", data[: len(data) // 8 * 8]):
    if group > 0:
        try:
            os.killpg(group, signal.SIGKILL)
        except OSError:
            pass
"""

_SLOT = struct.Struct("q")
_EMPTY_SLOT = _SLOT.pack(0)


class ProcessGuard:
    """Kills registered process groups when the server dies, however it dies.

    ``PR_SET_PDEATHSIG`` would need code in every child (a ``fork`` instead
    of ``vfork``: ~2 ms per spawn) and only kills the group leader. Instead a
    tiny helper (own session) holds the read end of a pipe from us and a
    shared memfd in which we keep the live process-group ids (one 8-byte
    slot each, updated with ``pwrite``: no wake-up of the helper per spawn).
    When the pipe reaches EOF (our exit, crash or SIGKILL) it SIGKILLs every
    group still listed. Started lazily on the first spawn; the manager closes
    it (it exits cleanly) once no group has been registered for a while, so
    an idle server keeps no extra child or fd.
    """

    def __init__(self) -> None:
        self._fd: int | None = None
        self._memfd: int | None = None
        self._popen: subprocess.Popen[bytes] | None = None
        self._failed = False
        self._slots: dict[int, int] = {}
        self._free: list[int] = []
        self._next_slot = 0

    def _start(self) -> bool:
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        memfd = -1
        try:
            memfd = os.memfd_create("exec-server-guard", os.MFD_CLOEXEC)
            # pass_fds keeps the fd number in the helper.
            code = _GUARD_CODE.replace("MEMFD", str(memfd))
            self._popen = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", code],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd="/",
                close_fds=True,
                pass_fds=(memfd,),
                start_new_session=True,
            )
        except OSError:
            close_quietly(write_end)
            close_quietly(memfd)
            self._failed = True
            return False
        finally:
            close_quietly(read_end)
        self._fd = write_end
        self._memfd = memfd
        self._slots.clear()
        self._free.clear()
        self._next_slot = 0
        return True

    def add(self, pgid: int) -> None:
        if self._memfd is None and (self._failed or not self._start()):
            return
        assert self._memfd is not None
        slot = self._free.pop() if self._free else self._next_slot
        if slot == self._next_slot:
            self._next_slot += 1
        self._slots[pgid] = slot
        with contextlib.suppress(OSError):
            os.pwrite(self._memfd, _SLOT.pack(pgid), slot * _SLOT.size)

    def discard(self, pgid: int) -> None:
        slot = self._slots.pop(pgid, None)
        if slot is None or self._memfd is None:
            return
        self._free.append(slot)
        with contextlib.suppress(OSError):
            os.pwrite(self._memfd, _EMPTY_SLOT, slot * _SLOT.size)

    @property
    def idle(self) -> bool:
        """No group registered: the guard may be closed until the next spawn."""
        return not self._slots

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    def close(self) -> subprocess.Popen[bytes] | None:
        """Close our ends (the guard exits after killing what is still listed).

        Returns the guard's ``Popen`` for the caller to reap, or None.
        """
        close_quietly(self._fd)
        close_quietly(self._memfd)
        self._fd = None
        self._memfd = None
        self._slots.clear()
        popen, self._popen = self._popen, None
        return popen
