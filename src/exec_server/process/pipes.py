"""Spawn a child on pipes (PROTOCOL.md §8.3, §8.8) and the fd helpers both modes share.

The child leads its own process group (so terminate can kill the whole
group), inherits only stdio plus ``LaunchSpec.pass_fds`` (``close_fds``), and
gets stdin from ``/dev/null`` unless ``pipe_stdin`` asks for a writable pipe.

Why ``subprocess.Popen`` with plain fds and no ``preexec_fn``: CPython then
spawns with ``vfork`` (~0.15 ms) instead of ``fork`` (~2 ms for a server-sized
process, which would dominate ``true`` start→closed). The price: no
``PR_SET_PDEATHSIG`` for pipe children (it needs child-side code); the manager
kills every group on shutdown instead (docs/processes.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
from dataclasses import dataclass, field

from exec_server.process.spec import LaunchSpec
from exec_server.protocol.process_types import ProcessStream

__all__ = ["PIPE_SIZE", "SpawnedChild", "close_quietly", "spawn_pipes"]

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
