"""The helper zygote: one small single-threaded Python forking a child per request.

The server never forks itself (it is multi-threaded, SANDBOX.md §0.3). Started by
``fs.helper.client.Zygote`` as ``python -I -S -B main.py --zygote <control fd> <server pid>
[--test-hooks] [--no-prefork]``: stdlib and this source tree only. Requests ``F`` (one
confined fs operation) and ``S`` (a Landlock launch) go to pre-forked spare children;
``R``/``P``/``E``/``X`` report back (docs/sandbox-linux.md, docs/sandboxed-fs.md).
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import os
import select
import signal
import socket
import struct
import sys
import time

if __name__ == "__main__":
    # Import the stdlib-only modules from the source tree, without site-packages.
    _src = os.path.abspath(__file__)
    for _ in range(4):  # src/exec_server/fs/helper/main.py -> src
        _src = os.path.dirname(_src)
    sys.path.insert(0, _src)

from exec_server._os.linux import call_prctl
from exec_server.fs.fdops import write_all
from exec_server.fs.helper import confine, ops
from exec_server.sandbox.linux import landlock, seccomp
from exec_server.sandbox.linux import spawn_zygote_main as spawn

__all__ = ["EXIT", "ID", "ID_PID", "MAX_REQUEST", "Zygote", "fds_from_anc", "main",
           "reset_signals", "rights"]

#: ``X`` payload: pid, raw wait status.
EXIT = struct.Struct("!ii")
#: ``P`` and ``E`` payloads: request id, then pid or errno.
ID_PID = struct.Struct("!Qi")
ID = struct.Struct("!Q")
#: largest control message (a launch's args and env); the server falls back above it.
MAX_REQUEST = 1 << 20
_MAX_FDS = 4
_PR_SET_PDEATHSIG = 1
_FS = b"F"
_SPAWN = b"S"
#: idle seconds after a launch before the next launch spare is forked.
SPARE_DELAY = 0.002


def fds_from_anc(anc: list[tuple[int, int, bytes]]) -> list[int]:
    """The fds of every ``SCM_RIGHTS`` item of a ``recvmsg`` ancillary list."""
    fds: list[int] = []
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % 4
            fds.extend(struct.unpack(f"{usable // 4}i", payload[:usable]))
    return fds


def rights(fds: tuple[int, ...] | list[int]) -> list[tuple[int, int, bytes]]:
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))]


#: signals the zygote leaves at other than their default (set by ``Zygote.run``).
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


class Zygote:
    """The zygote process: control socket, children, wake pipe, one spare per kind."""

    kinds = (_FS, _SPAWN)

    def __init__(self, ctl_fd: int, server_pid: int, test_hooks: bool,
                 prefork: bool = True) -> None:
        self.abi: int = confine.landlock_abi()
        self.ctl = socket.socket(fileno=ctl_fd)
        self.server_pid = server_pid
        self.test_hooks = test_hooks
        self.prefork = prefork
        #: pid -> kind of every child (spares included).
        self.children: dict[int, bytes] = {}
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        #: kind -> (pid, hand-off socket) of its pre-forked child.
        self.spares: dict[bytes, tuple[int, socket.socket]] = {}
        self.buf = bytearray(MAX_REQUEST)
        self.anc_size = socket.CMSG_SPACE(_MAX_FDS * 4)
        #: monotonic time after which a new launch spare may be forked.
        self.spawn_at = 0.0

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
        # What children run, run once so that forks start warm.
        confine.warm_up(self.abi)
        req = ops.OpRequest.from_header({"op": "fs/getMetadata", "path": "/", "expect": "/"})
        for _ in range(3):
            ops.execute(req, b"")
            json.loads(json.dumps({"status": "ok", "result": {"a": [1, "b"]}}))
        spawn.warm_up()
        gc.collect()
        gc.freeze()  # forked children keep sharing these pages
        self._send(b"R" + json.dumps({"abi": self.abi, "pid": os.getpid()}).encode())
        self._loop()
        return 0

    def _send(self, msg: bytes, fds: tuple[int, ...] = ()) -> None:
        self.ctl.sendmsg([msg], rights(fds) if fds else [])

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
                    with contextlib.suppress(BlockingIOError):
                        while os.read(self.wake_r, 256):
                            pass
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
            if kind == _SPAWN:
                wait = self.spawn_at - time.monotonic()
            else:  # no fs child running: the fork and its page faults never compete with one
                wait = float("inf") if _FS in self.children.values() else 0.0
            if wait <= 0:
                self._make_spare(kind, ahead=True)
            elif wait != float("inf"):
                timeout = wait if timeout is None else min(timeout, wait)
        return timeout

    def _accepts(self, kind: bytes, n: int, fds: list[int]) -> bool:
        """Whether a request of ``n`` bytes (in ``buf``) with ``fds`` is well formed."""
        if kind == _FS:
            return n == 1 + ID.size and len(fds) == 1
        self.spawn_at = time.monotonic() + SPARE_DELAY
        return spawn.accepts(self.buf, n, fds)

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
                self._send(b"E" + ID_PID.pack(req_id, errno.EBADF))
            else:
                self._start(kind, req_id, n, fds)
            return True
        finally:
            for fd in fds:
                os.close(fd)

    def _start(self, kind: bytes, req_id: int, n: int, fds: list[int]) -> None:
        """Hand the request to the kind's spare (one forked now if there is none or it died)."""
        msg = memoryview(self.buf)[:n]
        for ahead in (True, False):
            spare = self.spares.pop(kind, None) if ahead else self._make_spare(kind, ahead=False)
            if spare is None:
                if not ahead:
                    return  # fork failed (reported)
                continue
            pid, handoff = spare
            try:
                try:
                    handoff.sendmsg([msg], rights(fds))
                except OSError:
                    continue  # it died before taking the request
                if kind == _SPAWN:
                    spawn.handed_off(msg, pid, handoff)
            finally:
                handoff.close()
            try:
                pidfd = os.pidfd_open(pid)
            except OSError as exc:  # it is already gone: its X follows
                self._send(b"E" + ID_PID.pack(req_id, exc.errno or errno.EBADF))
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
                self._send(b"E" + ID_PID.pack(req_id, exc.errno or errno.EAGAIN))
            return None
        if pid == 0:
            ours.close()
            self._spare(kind, theirs, ahead)  # never returns
        theirs.close()
        self.children[pid] = kind
        if ahead:
            self.spares[kind] = (pid, ours)
        return pid, ours

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
            if n == 0:  # EOF: the zygote is closing
                code = 0
            elif kind == _SPAWN:
                code = spawn.serve(bytes(self.buf[:n]), fds, handoff)
            else:
                handoff.close()
                self._serve_fs(fds[0])
                code = 0
        except BaseException:
            pass
        finally:
            os._exit(code)

    def _prepare(self, kind: bytes, ahead: bool) -> None:
        """In a spare, before its request (``ahead``: forked ahead of time)."""
        if kind == _SPAWN:
            if ahead:
                spawn.prefault()
            return
        zygote_pid = os.getppid()
        call_prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != zygote_pid:
            os._exit(1)
        if ahead:
            # Touch (copy-on-write) what serving a request touches; no path is looked at.
            sample = {"op": "fs/readFile", "path": "/x/y", "expect": "/x", "plan": {
                "full_read": True, "full_write": False, "writable_roots": ["/x"]}}
            ops.prefault(ops.OpRequest.from_header(json.loads(json.dumps(sample))))
            ops.encode_frame(json.dumps({"status": "ok", "result": {}}).encode(), 0)
            err = ops.error_from_os(FileNotFoundError(errno.ENOENT, "x"))
            json.dumps({"status": "error", "code": err.code, "message": err.message})
            landlock.prefault()  # a ruleset's structures; no syscalls, no paths
        # Network is always off for the helper (PROTOCOL.md §10.1); from here
        # on only sendmsg/recvmsg are used (the filter denies sendto).
        seccomp.install_network_filter()
        if os.getuid() == 0:
            # As the one-shot helper (bwrap --cap-drop ALL, the launcher) and
            # upstream's: a confined operation obeys file permissions too, and
            # has no mount or chown powers.
            from exec_server.sandbox.linux._launch import drop_capabilities

            drop_capabilities(now=True)

    def _reply(self, fd: int, header: dict[str, object], payload: bytes = b"") -> None:
        frame = ops.encode_frame(json.dumps(header).encode(), len(payload))
        if len(payload) <= 256 * 1024:
            write_all(fd, frame + payload)  # one wake-up for the server
        else:
            write_all(fd, frame)
            write_all(fd, payload)

    def _serve_fs(self, fd: int) -> None:
        try:
            raw, data = ops.read_frame(fd)
            header = json.loads(raw)
            if not isinstance(header, dict):
                raise ops.OpError(-32600, "fs sandbox request is not an object")
            hook = header.get("test_hook") if self.test_hooks else None
            if self.test_hooks:
                self._test_hook(fd, hook)
                self._arm_pause(header.get("test_pause"))
            req = ops.OpRequest.from_header(header)
            plan = header.get("plan")
            if not isinstance(plan, dict):
                raise ops.OpError(-32600, "fs sandbox request has no plan")
            probe = None
            if hook == "probe":
                probe = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
            try:
                confine.confine(plan, abi=self.abi)
            except OSError as exc:
                raise ops.OpError(-32603, f"failed to confine fs sandbox helper: {exc}") from exc
            result, payload = (_probe(probe), b"") if probe is not None else ops.execute(req, data)
        except ops.OpError as exc:
            return self._reply(fd, {"status": "error", "code": exc.code, "message": exc.message})
        except (ValueError, EOFError) as exc:
            message = f"failed to decode fs sandbox request: {exc}"
            return self._reply(fd, {"status": "error", "code": -32603, "message": message})
        passed = result.pop("passed_fd", None)
        if passed is None:
            self._reply(fd, {"status": "ok", "result": result}, payload)
            return
        # fs/open: the reply, then one byte carrying the descriptor (SCM_RIGHTS).
        self._reply(fd, {"status": "ok", "result": {"passed_fd": True}})
        assert isinstance(passed, int)  # our own fs/open's
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fileno=fd)
        try:
            sock.sendmsg([b"F"], rights([passed]))
        finally:
            sock.detach()

    def _test_hook(self, fd: int, hook: object) -> None:
        """Failure injection for the test suite (only with ``--test-hooks``)."""
        if hook == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        elif hook == "garbage":
            write_all(fd, b"\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00\x00{{{{{")
            os._exit(0)
        elif hook == "hang":
            while True:
                time.sleep(3600)
        elif hook == "exit":
            os._exit(3)
        elif hook == "short":  # an ok reply that announces 1 MiB and sends 10 bytes
            ok = json.dumps({"status": "ok", "result": {}}).encode()
            write_all(fd, ops.encode_frame(ok, 1 << 20) + b"0123456789")
            os._exit(0)

    def _arm_pause(self, spec: object) -> None:
        """Tests: ``{"stage", "paused", "resume", "named"}`` stops a write at ``stage``
        (``helper.ops.test_pause``): the child writes ``<stage> <pid>\\n`` to the FIFO
        ``paused`` and goes on once it reads a byte (or EOF) from the FIFO ``resume``,
        both opened before Landlock. ``named``: a named temp file, not an unnamed one."""
        if not isinstance(spec, dict):
            return
        ops.test_named_temp = bool(spec.get("named"))
        stage = spec.get("stage")
        if not isinstance(stage, str):
            return
        paused = os.open(str(spec["paused"]), os.O_WRONLY | os.O_CLOEXEC)
        resume = os.open(str(spec["resume"]), os.O_RDONLY | os.O_CLOEXEC)

        def pause(at: str) -> None:
            if at == stage:
                os.write(paused, f"{at} {os.getpid()}\n".encode())
                os.read(resume, 1)

        ops.test_pause = pause


def _probe(status_fd: int) -> dict[str, object]:
    """What the confined child can do (tests): its status, network, a system read."""
    status = os.pread(status_fd, 65536, 0).decode()
    out: dict[str, object] = {
        line.split(":")[0]: line.split(":", 1)[1].strip()
        for line in status.splitlines()
        if line.startswith(("NoNewPrivs", "Seccomp", "Cap"))
    }
    try:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
        out["inet_socket"] = 0
    except OSError as exc:
        out["inet_socket"] = exc.errno
    try:
        os.close(os.open("/etc/hostname", os.O_RDONLY))
        out["etc_hostname"] = 0
    except OSError as exc:
        out["etc_hostname"] = exc.errno
    return out


def main(argv: list[str]) -> int:
    """``main.py --zygote <control fd> <server pid> [--test-hooks] [--no-prefork]``."""
    ctl_fd, server_pid, flags = int(argv[2]), int(argv[3]), argv[4:]
    return Zygote(ctl_fd, server_pid, "--test-hooks" in flags, "--no-prefork" not in flags).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
