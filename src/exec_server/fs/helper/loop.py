"""The fork-per-request loop of the helper zygote (``fs/helper/main.py``).

Runs under ``python -I -S``: stdlib-only on purpose, like the rest of this
directory. The server never forks itself (it is multi-threaded); this small
single-threaded process forks one child per request instead.

Control channel (``SOCK_SEQPACKET``, one message per datagram):

* server -> zygote: kind (one byte) + request id (``!Q``) + the kind's bytes,
  with the request's fds (``SCM_RIGHTS``).
* zygote -> server: ``R`` + JSON once ready; ``P`` + id + pid (``!Qi``) with
  a pidfd of the child once it has the request (and, when its kind asks,
  leads its own process group or session); ``E`` + id + errno (``!Qi``) when
  no child could take it; ``X`` + pid + raw wait status (``!ii``) after
  reaping a child.

Every child starts as a *spare*: forked ahead of time, it resets what the
zygote changed (signals, gc), prepares for its kind (copy-on-write faults,
restrictions that need no request) and waits on a private socketpair. A
request is handed to the spare of its kind as the whole control message plus
its fds; without one, a spare is forked on demand and handed the request at
once. When a kind's next spare is forked is the subclass's rule
(``_spare_at``). EOF on the control socket means the server is going away:
SIGKILL every child (and its group), reap, exit.
"""

from __future__ import annotations

import contextlib
import gc
import os
import select
import signal
import socket
import struct
import time

from exec_server._os.linux import call_prctl

__all__ = ["EXIT", "ID", "ID_PID", "MAX_REQUEST", "ZygoteBase", "fds_from_anc", "reset_signals"]

#: ``X`` payload: pid, raw wait status.
EXIT = struct.Struct("!ii")
#: ``P`` and ``E`` payloads: request id, then pid or errno.
ID_PID = struct.Struct("!Qi")
ID = struct.Struct("!Q")
#: largest control message (a launch's args and env); the server falls back above it.
MAX_REQUEST = 1 << 20
_MAX_FDS = 4
_EBADF = 9
_PR_SET_PDEATHSIG = 1


def fds_from_anc(anc: list[tuple[int, int, bytes]]) -> list[int]:
    """The fds of every ``SCM_RIGHTS`` item of a ``recvmsg`` ancillary list."""
    fds: list[int] = []
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % 4
            fds.extend(struct.unpack(f"{usable // 4}i", payload[:usable]))
    return fds


#: signals the zygote leaves at other than their default (set by ``ZygoteBase.run``).
_NOT_DEFAULT: list[int] = []


def _not_default() -> list[int]:
    """Ours (SIGCHLD, SIGINT, ...) and whatever the server inherited ignored (``nohup``)."""
    out = []
    for n in range(1, signal.NSIG):
        if n in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError):
            if signal.getsignal(n) is not signal.SIG_DFL:
                out.append(n)
    return out


def reset_signals() -> None:
    """In a child: every signal to its default, none blocked, as exec'd commands expect."""
    signal.set_wakeup_fd(-1)
    for n in _NOT_DEFAULT:
        with contextlib.suppress(OSError, ValueError):
            signal.signal(n, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


class ZygoteBase:
    """A single-threaded zygote: control socket, children, wake pipe, one spare per kind."""

    #: the request kinds served (first byte of a control message).
    kinds: tuple[bytes, ...] = ()

    def __init__(self, ctl_fd: int, server_pid: int, prefork: bool) -> None:
        self.ctl = socket.socket(fileno=ctl_fd)
        self.server_pid = server_pid
        self.prefork = prefork
        #: pid -> kind of every child (spares included).
        self.children: dict[int, bytes] = {}
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        #: kind -> (pid, hand-off socket) of its pre-forked child.
        self.spares: dict[bytes, tuple[int, socket.socket]] = {}
        self.buf = bytearray(MAX_REQUEST)
        self.anc_size = socket.CMSG_SPACE(_MAX_FDS * 4)

    # ------------------------------------------------------------------ hooks

    def _ready_message(self) -> bytes:
        """The ``R`` payload (JSON), sent once warmed up."""
        raise NotImplementedError

    def _warm_up(self) -> None:
        """Run what children run once, so forks start warm."""

    def _accepts(self, kind: bytes, n: int, fds: list[int]) -> bool:
        """Whether a request of ``n`` bytes (in ``buf``) with ``fds`` is well formed."""
        raise NotImplementedError

    def _spare_at(self, kind: bytes) -> float:
        """Monotonic time from which a new spare of ``kind`` may be forked (inf: not now)."""
        return 0.0

    def _prepare(self, kind: bytes, ahead: bool) -> None:
        """In a spare, before its request: ``ahead`` when forked ahead of time."""

    def _serve(self, kind: bytes, raw: bytes, fds: list[int], handoff: socket.socket) -> int:
        """In the child: serve the request (``raw`` is the control message); the exit code."""
        raise NotImplementedError

    def _handed_off(self, kind: bytes, raw: memoryview, pid: int,
                    handoff: socket.socket) -> None:
        """In the zygote, once child ``pid`` has the request (e.g. wait for its setsid)."""

    # ------------------------------------------------------------------ zygote side

    def run(self) -> int:
        """Warm up, report ready, serve until EOF; the exit code."""
        global _NOT_DEFAULT
        call_prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # die with the server
        if os.getppid() != self.server_pid:
            return 1
        # Received fds must never land on 0-2 (children dup2 onto them).
        while (fd := os.open("/dev/null", os.O_RDWR)) <= 2:
            pass
        os.close(fd)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGCHLD, lambda _s, _f: None)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        _NOT_DEFAULT = _not_default()
        self._warm_up()
        gc.collect()
        gc.freeze()  # forked children keep sharing these pages
        self._send(b"R" + self._ready_message())
        self._loop()
        return 0

    def _send(self, msg: bytes, fds: tuple[int, ...] = ()) -> None:
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))]
        self.ctl.sendmsg([msg], anc if fds else [])

    def _loop(self) -> None:
        """Serve until EOF on the control socket, then kill and reap every child."""
        try:
            while True:
                try:
                    ready, _, _ = select.select([self.ctl.fileno(), self.wake_r], [], [],
                                                self._fork_spares())
                except InterruptedError:
                    continue
                if self.wake_r in ready:
                    self._drain_wakeups()
                    self._reap(block=False)
                if self.ctl.fileno() in ready and not self._on_control():
                    break
        except OSError:
            pass  # the server is gone: clean up below
        finally:
            for _, sock in self.spares.values():
                sock.close()
            for pid in list(self.children):
                for kill in (os.killpg, os.kill):  # a launch leads its own group
                    with contextlib.suppress(OSError):
                        kill(pid, signal.SIGKILL)
            self._reap(block=True, report=False)

    def _fork_spares(self) -> float | None:
        """Fork the spares that are due; seconds until the next one is (None: none pending)."""
        if not self.prefork:
            return None
        timeout: float | None = None
        for kind in self.kinds:
            if kind in self.spares:
                continue
            wait = self._spare_at(kind) - time.monotonic()
            if wait <= 0:
                self._make_spare(kind, ahead=True)
            elif wait != float("inf"):
                timeout = wait if timeout is None else min(timeout, wait)
        return timeout

    def _on_control(self) -> bool:
        """Handle one control message; False on EOF (the server closed the socket)."""
        try:
            n, anc, _flags, _addr = self.ctl.recvmsg_into([self.buf], self.anc_size)
        except InterruptedError:
            return True
        fds = fds_from_anc(anc)
        try:
            if n == 0:
                return False
            if n < 1 + ID.size:
                return True
            kind = bytes(self.buf[:1])
            (req_id,) = ID.unpack_from(self.buf, 1)
            if kind not in self.kinds or not self._accepts(kind, n, fds):
                self._send(b"E" + ID_PID.pack(req_id, _EBADF))
                return True
            self._start(kind, req_id, n, fds)
            return True
        finally:
            for fd in fds:
                os.close(fd)

    def _start(self, kind: bytes, req_id: int, n: int, fds: list[int]) -> None:
        """Hand the request to the kind's spare (one forked now if there is none or it died)."""
        msg = memoryview(self.buf)[:n]
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))]
        for ahead in (True, False):
            spare = self.spares.pop(kind, None) if ahead else self._make_spare(kind, ahead=False)
            if spare is None:
                if not ahead:
                    return  # fork failed (reported)
                continue
            pid, handoff = spare
            try:
                try:
                    handoff.sendmsg([msg], anc)
                except OSError:
                    continue  # it died before taking the request
                self._handed_off(kind, msg, pid, handoff)
            finally:
                handoff.close()
            try:
                pidfd = os.pidfd_open(pid)
            except OSError as exc:  # it is already gone: its X follows
                self._send(b"E" + ID_PID.pack(req_id, exc.errno or _EBADF))
                return
            try:
                self._send(b"P" + ID_PID.pack(req_id, pid), (pidfd,))
            finally:
                os.close(pidfd)
            return

    def _make_spare(self, kind: bytes, *, ahead: bool) -> tuple[int, socket.socket] | None:
        """Fork a child of ``kind`` waiting for its request; None (reported) if fork fails."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with contextlib.suppress(OSError):  # room for the largest request
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 2 * MAX_REQUEST)
        try:
            pid = os.fork()
        except OSError as exc:
            ours.close()
            theirs.close()
            if not ahead:
                (req_id,) = ID.unpack_from(self.buf, 1)
                self._send(b"E" + ID_PID.pack(req_id, exc.errno or 11))
            return None
        if pid == 0:
            ours.close()
            self._spare(kind, theirs, ahead)  # never returns
        theirs.close()
        self.children[pid] = kind
        if ahead:
            self.spares[kind] = (pid, ours)
        return pid, ours

    # ------------------------------------------------------------------ child side

    def _spare(self, kind: bytes, handoff: socket.socket, ahead: bool) -> None:
        """A forked child: get ready, wait for the request, serve it. Never returns."""
        code = 125
        try:
            gc.disable()  # short-lived or about to exec: a collection would copy every page
            reset_signals()
            self.ctl.close()
            os.close(self.wake_r)
            os.close(self.wake_w)
            for _, sock in self.spares.values():
                sock.close()
            self._prepare(kind, ahead)
            while True:
                try:
                    n, anc, _flags, _addr = handoff.recvmsg_into([self.buf], self.anc_size)
                    break
                except InterruptedError:
                    continue
            fds = fds_from_anc(anc)
            # EOF: the zygote is closing.
            code = 0 if n == 0 else self._serve(kind, bytes(self.buf[:n]), fds, handoff)
        except BaseException:
            pass
        finally:
            os._exit(code)

    # ------------------------------------------------------------------ reaping

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
            kind = self.children.pop(pid, None)
            spare = self.spares.get(kind) if kind is not None else None
            if spare is not None and spare[0] == pid:
                del self.spares[kind]  # type: ignore[arg-type]
                spare[1].close()
            if report:
                self._send(b"X" + EXIT.pack(pid, status))
