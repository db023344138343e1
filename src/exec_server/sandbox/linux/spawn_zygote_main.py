"""The spawn zygote process: a warm, single-threaded Python forking one confined launch per request.

Started by ``spawn_zygote.SpawnZygote`` as
``python -I -S -B launcher.py --zygote <control fd> <server pid>`` (the
launcher script registers the bare ``exec_server.sandbox.linux`` package, so
nothing outside the stdlib and this directory is imported). It preloads the
launcher body (``_launch``: Landlock, seccomp, mount namespace, capability
drop) once; every forked child then runs ``_launch.main`` with the same
flags the launcher script would get, minus the interpreter start-up.

Control channel (``SOCK_SEQPACKET``, one message per datagram):

* server -> zygote ``S`` + JSON ``{"id", "tty", "stdin", "args", "env"}`` with
  ``SCM_RIGHTS`` fds: ``[stdin,] stdout, stderr, status`` (pipes; no stdin =
  ``/dev/null``) or ``slave, status`` (PTY). ``args`` are launcher flags ending
  in ``-- CMD...`` with ``--status-fd 3``.
* zygote -> server ``R`` + JSON ``{"pid"}`` once ready; ``P`` + id + pid
  (``!Qi``) once the child leads its own process group / session;
  ``E`` + id + errno (``!Qi``) when the fork failed; ``X`` + pid + raw wait
  status (``!ii``) after reaping a child.

EOF on the control socket means the server is going away: SIGKILL every
child's process group, reap, exit. ``PR_SET_PDEATHSIG`` makes the zygote die
with the server, and each child dies with the zygote until it execs.
"""

import contextlib
import gc
import json
import os
import select
import signal
import socket
import struct
import sys

from exec_server.sandbox.linux import _launch, landlock, seccomp
from exec_server.sandbox.linux._libc import call_prctl

__all__ = ["main"]

_PR_SET_PDEATHSIG = 1
_ID_PID = struct.Struct("!Qi")
_EXIT = struct.Struct("!ii")
#: largest request; the server falls back to the launcher script above it.
MAX_REQUEST = 1 << 20
#: the child's status pipe fd (``--status-fd``).
STATUS_FD = 3
_MAX_FDS = 4


class Zygote:
    """State of the zygote process; see the module docstring for the protocol."""

    def __init__(self, ctl_fd: int, server_pid: int) -> None:
        self.ctl = socket.socket(fileno=ctl_fd)
        self.server_pid = server_pid
        self.children: set[int] = set()
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.buf = bytearray(MAX_REQUEST)
        self.anc_size = socket.CMSG_SPACE(_MAX_FDS * 4)

    # ---------------------------------------------------------------- zygote side

    def run(self) -> int:
        call_prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != self.server_pid:
            return 1
        # Received fds must never land on 0-2 (the child dup2s onto them).
        while (fd := os.open("/dev/null", os.O_RDWR)) <= 2:
            pass
        os.close(fd)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGCHLD, lambda _s, _f: None)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        _warm_up()
        gc.collect()
        gc.freeze()  # forked children keep sharing these pages
        self._send(b"R" + json.dumps({"pid": os.getpid()}).encode())
        try:
            while True:
                try:
                    ready, _, _ = select.select([self.ctl.fileno(), self.wake_r], [], [])
                except InterruptedError:
                    continue
                if self.wake_r in ready:
                    self._drain_wakeups()
                    self._reap(block=False)
                if self.ctl.fileno() in ready and not self._on_control():
                    break
        except OSError:
            pass  # the server is gone (EPIPE/ECONNRESET): clean up below
        finally:
            for pid in list(self.children):
                for kill in (os.killpg, os.kill):
                    with contextlib.suppress(OSError):
                        kill(pid, signal.SIGKILL)
            self._reap(block=True, report=False)
        return 0

    def _send(self, msg: bytes) -> None:
        self.ctl.sendmsg([msg])

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
            if report:
                self._send(b"X" + _EXIT.pack(pid, status))

    def _on_control(self) -> bool:
        """Handle one control message; False on EOF (the server closed the socket)."""
        try:
            n, anc, _flags, _addr = self.ctl.recvmsg_into([self.buf], self.anc_size)
        except InterruptedError:
            return True
        fds: list[int] = []
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                usable = len(payload) - len(payload) % 4
                fds.extend(struct.unpack(f"{usable // 4}i", payload[:usable]))
        try:
            if n == 0:
                return False
            if self.buf[0:1] == b"S":
                self._spawn(bytes(self.buf[1:n]), fds)
            return True
        finally:
            for fd in fds:
                os.close(fd)

    def _spawn(self, raw: bytes, fds: list[int]) -> None:
        try:
            req = json.loads(raw)
            req_id = int(req["id"])
            tty = bool(req["tty"])
        except (ValueError, KeyError, TypeError):
            return  # not from our server: ignore
        expected = 2 if tty else (4 if req.get("stdin") else 3)
        if len(fds) != expected:
            self._send(b"E" + _ID_PID.pack(req_id, 9))  # EBADF
            return
        sync_r, sync_w = os.pipe2(os.O_CLOEXEC) if tty else (-1, -1)
        try:
            pid = os.fork()
        except OSError as exc:
            for fd in (sync_r, sync_w):
                if fd >= 0:
                    os.close(fd)
            self._send(b"E" + _ID_PID.pack(req_id, exc.errno or 11))
            return
        if pid == 0:
            _child(self, req, fds, tty, sync_w)  # never returns
        self.children.add(pid)
        if tty:
            # Report the pid only once the child leads its session, so a
            # killpg from the server can never miss it.
            os.close(sync_w)
            with contextlib.suppress(OSError):
                os.read(sync_r, 1)  # one byte, or EOF if the child died first
            os.close(sync_r)
        else:
            # Also done by the child, whichever runs first; EACCES: it already
            # exec'd (so its group exists), ESRCH: it died.
            with contextlib.suppress(OSError):
                os.setpgid(pid, pid)
        self._send(b"P" + _ID_PID.pack(req_id, pid))


def _warm_up() -> None:
    """Import and exercise what a child needs, so forks start warm."""
    import _signal  # type: ignore[import-not-found]  # noqa: F401 - used by _launch
    import fcntl  # noqa: F401
    import resource  # noqa: F401
    import termios  # noqa: F401

    for mode in (seccomp.MODE_RESTRICTED, seccomp.MODE_VSOCK):
        seccomp.build_filter(mode)
    landlock.abi_version()
    _launch._parse(["--status-fd", "3", "--write", "/x", "--ro", "/x/.git", "--network",
                    "--command-cwd", "/", "--", "true"])
    _launch._json_str("warm \"up\"\n")


def _child(z: Zygote, req: dict[str, object], fds: list[int], tty: bool, sync_w: int) -> None:
    """Become the launch: own group/session, stdio, then the launcher body. Never returns."""
    code = _launch.EXIT_SETUP
    try:
        gc.disable()
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        if tty:
            os.setsid()
            os.write(sync_w, b"s")
        else:
            os.setpgid(0, 0)
        if tty:
            stdio = [fds[0], fds[0], fds[0]]
        elif len(fds) == 4:
            stdio = fds[:3]
        else:
            stdio = [os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC), fds[0], fds[1]]
        status = fds[-1]
        for target, src in enumerate(stdio):
            os.dup2(src, target)
        if tty:
            import fcntl
            import termios

            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        if status != STATUS_FD:
            os.dup2(status, STATUS_FD, inheritable=False)
        else:
            os.set_inheritable(STATUS_FD, False)
        os.closerange(STATUS_FD + 1, _max_fd())
        args = [str(a) for a in req["args"]]  # type: ignore[attr-defined]
        env = {str(k): str(v) for k, v in req["env"].items()}  # type: ignore[attr-defined]
        code = _launch.main(args, env=env)
    except BaseException as exc:  # report anything; never return into the zygote
        try:
            os.write(2, f"exec-server sandbox: spawn zygote child: {exc!r}\n".encode())
            _launch._report(STATUS_FD, "error", "zygote", repr(exc))
        except BaseException:
            pass
    finally:
        try:
            sys.stderr.flush()
        finally:
            os._exit(code)


def _max_fd() -> int:
    try:
        return int(os.sysconf("SC_OPEN_MAX"))
    except (ValueError, OSError):
        return 65536


def main(argv: list[str]) -> int:
    """``launcher.py --zygote <control fd> <server pid>``."""
    return Zygote(int(argv[0]), int(argv[1])).run()
