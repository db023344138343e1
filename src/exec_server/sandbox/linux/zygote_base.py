"""Main-loop plumbing shared by the two fork-per-request zygotes.

Used by ``fs/zygote_main.py`` (sandboxed fs calls) and
``sandbox/linux/spawn_zygote_main.py`` (Landlock launches), both running under
``python -I -S``: stdlib-only on purpose, like the rest of this directory.

What is shared: the SIGCHLD wake pipe, the select loop over the control
socket and that pipe, reaping (``X`` + pid + wait status to the server), the
pre-forked spare's bookkeeping and the kill-and-reap shutdown on EOF. What a
request means, what a child does and how the spare is re-forked stay in the
specific zygotes (hooks below).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import struct

__all__ = ["ZygoteBase", "fds_from_anc"]

_EXIT = struct.Struct("!ii")


def fds_from_anc(anc: list[tuple[int, int, bytes]]) -> list[int]:
    """The fds of every ``SCM_RIGHTS`` item of a ``recvmsg`` ancillary list."""
    fds: list[int] = []
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % 4
            fds.extend(struct.unpack(f"{usable // 4}i", payload[:usable]))
    return fds


class ZygoteBase:
    """A single-threaded zygote: control socket, children, wake pipe, spare child."""

    #: whether the death of an unused spare is reported (``X``) to the server.
    report_spare_exit = False
    #: errors on the control socket that mean the server is gone.
    server_gone: tuple[type[BaseException], ...] = (OSError,)

    def __init__(self, ctl_fd: int, server_pid: int, prefork: bool) -> None:
        self.ctl = socket.socket(fileno=ctl_fd)
        self.server_pid = server_pid
        self.prefork = prefork
        self.children: set[int] = set()
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        #: (pid, hand-off socket) of the pre-forked child, if any.
        self.spare: tuple[int, socket.socket] | None = None

    # ------------------------------------------------------------------ hooks

    def _on_control(self) -> bool:
        """Handle one control message; False on EOF (the server closed the socket)."""
        raise NotImplementedError

    def _idle_timeout(self) -> float | None:
        """Seconds the select may block (None: until something happens)."""
        return None

    def _all_reaped(self, report: bool) -> None:
        """Called once a reap found no child left."""

    def _kill_child(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    # ------------------------------------------------------------------ shared

    def _install_wakeup(self) -> None:
        """SIGCHLD (and only it) wakes the select loop through the wake pipe."""
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGCHLD, lambda _s, _f: None)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)

    def _send(self, msg: bytes, fds: tuple[int, ...] = ()) -> None:
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))]
        self.ctl.sendmsg([msg], anc if fds else [])

    def _loop(self) -> None:
        """Serve until EOF on the control socket, then kill and reap every child."""
        try:
            while True:
                timeout = self._idle_timeout()
                try:
                    ready, _, _ = select.select([self.ctl.fileno(), self.wake_r], [], [],
                                                timeout)
                except InterruptedError:
                    continue
                if self.wake_r in ready:
                    self._drain_wakeups()
                    self._reap(block=False)
                if self.ctl.fileno() in ready and not self._on_control():
                    break
        except self.server_gone:
            pass  # the server is gone: clean up below
        finally:
            if self.spare is not None:
                self.spare[1].close()
            for pid in list(self.children):
                self._kill_child(pid)
            self._reap(block=True, report=False)

    def _close_zygote_fds(self) -> None:
        """In a forked child: drop the zygote's control socket, wake pipe and spare socket."""
        self.ctl.close()
        os.close(self.wake_r)
        os.close(self.wake_w)
        if self.spare is not None:
            self.spare[1].close()

    def _drain_wakeups(self) -> None:
        try:
            while os.read(self.wake_r, 256):
                pass
        except BlockingIOError:
            pass

    def _reap(self, *, block: bool, report: bool = True) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                return
            except InterruptedError:
                continue
            if pid == 0:
                return
            self.children.discard(pid)
            if self.spare is not None and self.spare[0] == pid:
                self.spare[1].close()
                self.spare = None
                if not self.report_spare_exit:
                    continue  # an unused spare died: nobody to tell
            if report:
                self._send(b"X" + _EXIT.pack(pid, status))
        self._all_reaped(report)
