"""The spawn zygote process: a warm, single-threaded Python forking one confined launch per request.

Started by ``spawn_zygote.SpawnZygote`` as
``python -I -S -B launcher.py --zygote <control fd> <server pid>`` (the
launcher script registers the bare ``exec_server.sandbox.linux`` package, so
nothing outside the stdlib and this directory is imported). It preloads the
launcher body (``_launch``: Landlock, seccomp, mount namespace, capability
drop) once; every forked child then runs ``_launch.main`` with the same
flags the launcher script would get, minus the interpreter start-up.

Control channel (``SOCK_SEQPACKET``, one message per datagram):

* server -> zygote ``S`` + id, tty, stdin (``!QBB``) + JSON ``{"args", "env"}``
  with ``SCM_RIGHTS`` fds: ``[stdin,] stdout, stderr, status`` (pipes; no stdin
  = ``/dev/null``) or ``slave, status`` (PTY). ``args`` are launcher flags
  ending in ``-- CMD...`` with ``--status-fd 3``.
* zygote -> server ``R`` + JSON ``{"pid"}`` once ready; ``P`` + id + pid
  (``!Qi``) once the child leads its own process group / session;
  ``E`` + id + errno (``!Qi``) when the fork failed; ``X`` + pid + raw wait
  status (``!ii``) after reaping a child.

One child is kept pre-forked (the *spare*): it has reset its signals and
touched the pages a launch writes (copy-on-write faults) while waiting on a
private socketpair, so a request only costs the zygote a hand-off of the
message and fds; a new spare is forked once the zygote has been idle for
``SPARE_DELAY`` (never while a launch's child is still confining itself on a
small machine). Bursts that find no spare fork directly.

EOF on the control socket means the server is going away: SIGKILL every
child's process group, reap, exit. ``PR_SET_PDEATHSIG`` makes the zygote die
with the server, and each child dies with the zygote. A child becomes the
launch's monitor (``_launch._split_monitor``): the command runs two forks
below it, in its own PID namespace, and the child exits as the command did.
"""

import contextlib
import gc
import json
import os
import signal
import socket
import struct
import sys
import time

from exec_server.sandbox.linux import _launch, knobs, landlock, seccomp
from exec_server.sandbox.linux._libc import call_prctl
from exec_server.sandbox.linux.zygote_base import ZygoteBase, fds_from_anc

__all__ = ["main"]

_PR_SET_PDEATHSIG = 1
_ID_PID = struct.Struct("!Qi")
#: request header after ``S``: id, tty, stdin.
REQUEST_HEADER = struct.Struct("!QBB")
#: idle seconds after a launch before the next spare is forked.
SPARE_DELAY = 0.002
#: largest request; the server falls back to the launcher script above it.
MAX_REQUEST = 1 << 20
#: the child's status pipe fd (``--status-fd``).
STATUS_FD = 3
_MAX_FDS = 4


class Zygote(ZygoteBase):
    """State of the zygote process; see the module docstring for the protocol."""

    def __init__(self, ctl_fd: int, server_pid: int, prefork: bool = True) -> None:
        super().__init__(ctl_fd, server_pid, prefork)
        self.buf = bytearray(MAX_REQUEST)
        self.anc_size = socket.CMSG_SPACE(_MAX_FDS * 4)
        #: monotonic time after which a new spare may be forked.
        self.spare_at = 0.0

    # ---------------------------------------------------------------- zygote side

    def run(self) -> int:
        call_prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != self.server_pid:
            return 1
        # Received fds must never land on 0-2 (the child dup2s onto them).
        while (fd := os.open("/dev/null", os.O_RDWR)) <= 2:
            pass
        os.close(fd)
        self._install_wakeup()
        _warm_up()
        gc.collect()
        gc.freeze()  # forked children keep sharing these pages
        self._send(b"R" + json.dumps({"pid": os.getpid()}).encode())
        self._loop()
        return 0

    def _idle_timeout(self) -> float | None:
        """Fork the next spare once idle for ``SPARE_DELAY``; until then wake up for it."""
        if self.prefork and self.spare is None:
            timeout = self.spare_at - time.monotonic()
            if timeout > 0:
                return timeout
            self._make_spare()
        return None

    def _kill_child(self, pid: int) -> None:
        for kill in (os.killpg, os.kill):  # a launch leads its own group
            with contextlib.suppress(OSError):
                kill(pid, signal.SIGKILL)

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
            if self.buf[0:1] == b"S" and n >= 1 + REQUEST_HEADER.size:
                self._spawn(n, fds)
            return True
        finally:
            for fd in fds:
                os.close(fd)

    def _spawn(self, n: int, fds: list[int]) -> None:
        req_id, tty, stdin = REQUEST_HEADER.unpack_from(self.buf, 1)
        expected = 2 if tty else (4 if stdin else 3)
        if len(fds) != expected:
            self._send(b"E" + _ID_PID.pack(req_id, 9))  # EBADF
            return
        self.spare_at = time.monotonic() + SPARE_DELAY
        pid = self._hand_off(n, fds, bool(tty))
        if pid < 0:
            pid = self._fork_for(req_id, n, fds, bool(tty))
            if pid < 0:
                return
        self._send(b"P" + _ID_PID.pack(req_id, pid))

    def _hand_off(self, n: int, fds: list[int], tty: bool) -> int:
        """Give the request to the spare; its pid, or -1 when there is no (live) spare.

        Returns only once the child leads its process group (pipes: we set it
        here too) or session (PTY: it says so), so a killpg from the server
        can never miss it.
        """
        spare, self.spare = self.spare, None
        if spare is None:
            return -1
        pid, handoff = spare
        try:
            handoff.sendmsg([memoryview(self.buf)[:n]],
                            [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                              struct.pack(f"{len(fds)}i", *fds))])
            if tty:
                handoff.recv(1)  # after its setsid (EOF: it died)
        except OSError:
            return -1  # it died before taking the request: fork one instead
        finally:
            handoff.close()
        if not tty:
            _set_group(pid)
        return pid

    def _fork_for(self, req_id: int, n: int, fds: list[int], tty: bool) -> int:
        sync_r, sync_w = os.pipe2(os.O_CLOEXEC) if tty else (-1, -1)
        try:
            pid = os.fork()
        except OSError as exc:
            for fd in (sync_r, sync_w):
                if fd >= 0:
                    os.close(fd)
            self._send(b"E" + _ID_PID.pack(req_id, exc.errno or 11))
            return -1
        if pid == 0:
            _child(self, bytes(self.buf[1:n]), fds, sync_w)  # never returns
        self.children.add(pid)
        if tty:
            os.close(sync_w)
            with contextlib.suppress(OSError):
                os.read(sync_r, 1)  # after its setsid (EOF: it died)
            os.close(sync_r)
        else:
            _set_group(pid)
        return pid

    def _make_spare(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with contextlib.suppress(OSError):  # room for the largest request
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 2 * MAX_REQUEST)
        try:
            pid = os.fork()
        except OSError:
            ours.close()
            theirs.close()
            self.spare_at = time.monotonic() + 1.0
            return
        if pid == 0:
            ours.close()
            _spare(self, theirs)  # never returns
        theirs.close()
        self.children.add(pid)
        self.spare = (pid, ours)


def _set_group(pid: int) -> None:
    """``setpgid(pid, pid)`` from the parent; the child does it too, whichever runs first.

    EACCES: it already exec'd (so its group exists); ESRCH: it died.
    """
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)


def _warm_up() -> None:
    """Import and exercise what a child needs, so forks start warm.

    Runs after the zygote installed its own handlers, so ``_NOT_DEFAULT`` is
    the list its children reset.
    """
    global _NOT_DEFAULT
    _NOT_DEFAULT = _not_default()
    import _signal  # type: ignore[import-not-found]  # noqa: F401 - used by _launch
    import fcntl  # noqa: F401
    import resource  # noqa: F401
    import termios  # noqa: F401

    for mode in (seccomp.MODE_RESTRICTED, seccomp.MODE_VSOCK):
        seccomp.build_filter(mode)
    landlock.abi_version()
    knobs.read_only_knobs(full_write=False, writable_roots=())  # imported by root launches
    _launch._parse(["--status-fd", "3", "--write", "/x", "--ro", "/x/.git", "--network",
                    "--command-cwd", "/", "--", "true"])
    _launch._json_str("warm \"up\"\n")


#: signals the zygote does not leave at their default (set by ``_warm_up``).
_NOT_DEFAULT: list[int] | None = None


def _not_default() -> list[int]:
    """Ours (SIGCHLD, SIGINT, SIGPIPE, SIGXFSZ) and whatever the server inherited
    ignored (``nohup``: SIGHUP). A scan costs ~80 us: done once in the zygote."""
    out = []
    for n in range(1, signal.NSIG):
        if n in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError):
            if signal.getsignal(n) is not signal.SIG_DFL:
                out.append(n)
    return out


def _reset_signals() -> None:
    """Every signal to its default, none blocked, as exec'd commands expect."""
    signal.set_wakeup_fd(-1)
    for n in _NOT_DEFAULT if _NOT_DEFAULT is not None else _not_default():
        with contextlib.suppress(OSError, ValueError):
            signal.signal(n, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


def _spare(z: Zygote, handoff: socket.socket) -> None:
    """A pre-forked child: warm up, wait for a request, then become it. Never returns."""
    try:
        gc.disable()
        _reset_signals()
        z._close_zygote_fds()
        _prefault()
        while True:
            try:
                n, anc, _flags, _addr = handoff.recvmsg_into([z.buf], z.anc_size)
                break
            except InterruptedError:
                continue
        fds = fds_from_anc(anc)
    except BaseException:
        os._exit(_launch.EXIT_SETUP)
    if n == 0:
        os._exit(0)  # the zygote is closing
    _child(z, bytes(z.buf[1:n]), fds, -1, handoff)


def _prefault() -> None:
    """Write what a launch writes, before it arrives: pure computation, no path touched."""
    raw = json.dumps({"args": ["--status-fd", "3", "--full-read", "--write", "/x/y", "--ro",
                               "/x/y/.git", "--command-cwd", "/x/y", "--", "true"],
                      "env": {"PATH": "/usr/bin:/bin", "HOME": "/x"}}).encode()
    req = json.loads(raw)
    _launch._parse(req["args"])
    landlock._RulesetAttr(0, 0, 0)
    landlock._PathBeneathAttr(0, -1)
    for mode in (seccomp.MODE_RESTRICTED, seccomp.MODE_VSOCK):
        seccomp.build_filter(mode)


def _child(z: Zygote, raw: bytes, fds: list[int], sync_w: int,
           handoff: socket.socket | None = None) -> None:
    """Become the launch: own group/session, stdio, then the launcher body. Never returns.

    ``raw`` is the request after ``S``; ``sync_w`` (a fork's pipe) or
    ``handoff`` (a spare's socket) tells the zygote a PTY child's ``setsid`` is done.
    """
    code = _launch.EXIT_SETUP
    try:
        _req_id, tty, stdin = REQUEST_HEADER.unpack_from(raw)
        if tty:
            os.setsid()
            if handoff is not None:
                handoff.send(b"s")
            else:
                os.write(sync_w, b"s")
        else:
            os.setpgid(0, 0)
        if handoff is None:
            gc.disable()
            _reset_signals()
        req = json.loads(raw[REQUEST_HEADER.size:])
        if tty:
            stdio = [fds[0], fds[0], fds[0]]
        elif stdin:
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
        args = [str(a) for a in req["args"]]
        env = {str(k): str(v) for k, v in req["env"].items()}
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
    """``launcher.py --zygote <control fd> <server pid> [--no-prefork]``."""
    return Zygote(int(argv[0]), int(argv[1]), prefork="--no-prefork" not in argv[2:]).run()
