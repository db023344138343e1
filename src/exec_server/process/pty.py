"""Spawn a child on a pseudo-terminal (PROTOCOL.md §8.3, §8.8).

The child calls ``setsid()`` (new session and process group) and takes the
PTY slave as its controlling terminal (``TIOCSCTTY``), so job control, ``^C``
via the terminal and ``/dev/tty`` work. It also sets ``PR_SET_PDEATHSIG`` so
it dies with the server. Both need code in the child, hence ``preexec_fn``
(a plain ``fork``): it only runs two syscalls, never Python-level locks.

Output is the master side: one ``pty`` stream; ``EIO`` on read means every
slave holder is gone, i.e. end of file. Writes go to a dup of the master so
the reader may close its fd independently.
"""

from __future__ import annotations

import fcntl
import os
import signal
import struct
import subprocess
import termios

from exec_server._os.linux import set_parent_death_signal
from exec_server.process.child_signals import reset_in_child
from exec_server.process.pipes import SpawnedChild, child_args, close_quietly
from exec_server.process.spec import LaunchSpec
from exec_server.process.tree import become_subreaper
from exec_server.protocol.types.process import ProcessStream
from exec_server.sandbox.plan import SandboxType

__all__ = ["set_window_size", "spawn_pty"]

_SIGKILL = int(signal.SIGKILL)
_TIOCSCTTY = termios.TIOCSCTTY


def _child_setup() -> None:
    """Runs in the forked child after setsid() and the stdio dup2s."""
    reset_in_child()
    set_parent_death_signal(_SIGKILL)
    fcntl.ioctl(0, _TIOCSCTTY, 0)


def _unsandboxed_child_setup() -> None:
    """``_child_setup``, and adopt orphaned descendants (``process.tree``)."""
    _child_setup()
    become_subreaper()


def set_window_size(fd: int, rows: int, columns: int) -> None:
    """Set the terminal size (``TIOCSWINSZ``) on a PTY fd."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))


def spawn_pty(spec: LaunchSpec) -> SpawnedChild:
    """Spawn ``spec`` on a new PTY; the caller owns the returned fds.

    Raises:
        OSError: exec or cwd failure (``errno`` set).
    """
    argv, program = child_args(spec)
    master, slave = os.openpty()
    writer: int | None = None
    try:
        set_window_size(slave, spec.rows, spec.columns)
        writer = os.dup(master)
        popen = subprocess.Popen(
            argv,
            executable=program,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=spec.cwd,
            env=spec.env,
            close_fds=True,
            pass_fds=spec.pass_fds,
            start_new_session=True,
            restore_signals=True,
            preexec_fn=(_unsandboxed_child_setup if spec.sandbox_type is SandboxType.NONE
                        else _child_setup),
        )
    except BaseException:
        close_quietly(master)
        close_quietly(writer)
        raise
    finally:
        close_quietly(slave)
    _prepare_master(master, writer)
    return SpawnedChild(
        pid=popen.pid,
        outputs=[(ProcessStream.PTY, master)],
        stdin_fd=writer,
        popen=popen,
    )


def _prepare_master(master: int, writer: int) -> None:
    for fd in (master, writer):
        os.set_blocking(fd, False)
        os.set_inheritable(fd, False)
