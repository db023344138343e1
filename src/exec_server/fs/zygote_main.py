"""The fs zygote process: a small single-threaded Python that forks one child per request.

Started once by ``fs.zygote.Zygote`` as ``python -I -S zygote_main.py <fs dir>
<control fd> <server pid> [--test-hooks]``: no site-packages, no
environment-driven imports, only the stdlib plus ``zygote_ops`` and
``zygote_confine`` loaded by file path (not through the ``exec_server``
package, whose ``__init__`` modules may grow third-party imports).

Control channel (``SOCK_SEQPACKET``, one message per datagram):

* server → zygote ``F`` + 8-byte request id, with the child's socket in
  ``SCM_RIGHTS``: fork a child for it.
* zygote → server ``R`` + JSON ``{"abi", "pid"}`` once ready;
  ``P`` + id + pid (``!i``) with a pidfd of the child (``SCM_RIGHTS``), right
  after the fork; ``X`` + pid + wait status (``!ii``) after reaping a child;
  ``E`` + id + errno when the fork failed.

The zygote itself carries no_new_privs and the seccomp network filter
(``sandbox.linux.seccomp``), installed once after start-up, and as root drops
every capability then; children inherit all three. One child is kept
pre-forked, waiting for a request socket.

The child: closes everything of the zygote's, arms ``PDEATHSIG``, reads its
request frame from its socket, applies Landlock for *that* request's plan
before touching any path, runs the operation in strict mode and writes one
reply frame, then ``_exit(0)``. EOF on the control socket means
the server is going away: kill and reap every child, exit.
"""

from __future__ import annotations

import ctypes
import errno
import gc
import importlib.util
import json
import os
import signal
import socket
import struct
import sys
import time
from types import ModuleType
from typing import Any

if __name__ == "__main__":
    # Landlock plumbing, the seccomp program and the zygote loop are the
    # mechanism modules' (stdlib-only): import them from the source tree
    # without site-packages.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from exec_server.sandbox.linux.zygote_base import ZygoteBase, fds_from_anc

__all__ = ["main"]

_PR_SET_PDEATHSIG = 1
_ID = struct.Struct("!Q")
_PID = struct.Struct("!i")


def _load(name: str, directory: str) -> ModuleType:
    path = os.path.join(directory, name + ".py")
    spec = importlib.util.spec_from_file_location("_exec_server_fs_" + name, path)
    if spec is None or spec.loader is None:
        raise ImportError(path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class Zygote(ZygoteBase):
    """State of the zygote process; see the module docstring for the protocol."""

    #: the server is told about every reaped child, the spare included.
    report_spare_exit = True
    server_gone = (BrokenPipeError, ConnectionResetError)

    def __init__(
        self, ctl_fd: int, server_pid: int, fs_dir: str, test_hooks: bool, prefork: bool = True
    ) -> None:
        self.ops = _load("zygote_ops", fs_dir)
        self.confine = _load("zygote_confine", fs_dir)
        self.abi: int = self.confine.landlock_abi()
        from exec_server.sandbox.linux import seccomp

        self.seccomp = seccomp
        super().__init__(ctl_fd, server_pid, prefork)
        self.test_hooks = test_hooks
        self.libc = ctypes.CDLL(None, use_errno=True)

    # -------------------------------------------------------------- zygote side

    def run(self) -> int:
        self.libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != self.server_pid:
            return 1
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        self._install_wakeup()
        self._warm_up()
        # Network is always off for the helper (PROTOCOL.md §10.1): filter the
        # zygote once; every child inherits it (and no_new_privs) across fork.
        # From here on only sendmsg/recvmsg are used (the filter denies sendto).
        self.seccomp.install_network_filter()
        if os.getuid() == 0:
            # As the one-shot helper (bwrap --cap-drop ALL, the launcher) and
            # upstream's: a confined operation obeys file permissions too, and
            # has no mount or chown powers. Dropped once; children inherit.
            from exec_server.sandbox.linux._launch import drop_capabilities

            drop_capabilities(now=True)
        gc.collect()
        gc.freeze()
        self._send(b"R" + json.dumps({"abi": self.abi, "pid": os.getpid()}).encode())
        self._make_spare()
        self._loop()
        return 0

    def _warm_up(self) -> None:
        """Run the child's code paths once so forked children start warm."""
        self.confine.warm_up(self.abi)
        req = self.ops.OpRequest.from_header({"op": "fs/getMetadata", "path": "/", "expect": "/"})
        for _ in range(3):
            self.ops.execute(req, b"", strict=True)
            json.loads(json.dumps({"status": "ok", "result": {"a": [1, "b"]}}))

    def _all_reaped(self, report: bool) -> None:
        if report:
            # Re-fork the spare once no request's child is running, so the
            # fork and its page faults never compete with one.
            self._make_spare()

    def _on_control(self) -> bool:
        try:
            msg, anc, _flags, _addr = self.ctl.recvmsg(64, socket.CMSG_SPACE(16))
        except InterruptedError:
            return True
        fds = fds_from_anc(anc)
        if not msg:
            for fd in fds:
                os.close(fd)
            return False
        if msg[:1] != b"F" or len(fds) != 1 or len(msg) != 1 + _ID.size:
            for fd in fds:
                os.close(fd)
            return True
        req_id = msg[1:]
        spare, self.spare = self.spare, None
        if spare is not None:
            pid, handoff = spare
            try:
                # Hand the request socket to the waiting child: the fork is
                # already paid for, off this request's critical path.
                handoff.sendmsg(
                    [b"G"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fds[0]))]
                )
            except OSError:
                pid = -1
            finally:
                handoff.close()
            if pid < 0:
                pid = self._fork_for(fds[0], req_id)
        else:
            pid = self._fork_for(fds[0], req_id)
        os.close(fds[0])
        if pid < 0:
            return True
        pidfd = os.pidfd_open(pid)
        try:
            self._send(b"P" + req_id + _PID.pack(pid), (pidfd,))
        finally:
            os.close(pidfd)
        return True

    def _fork_for(self, fd: int, req_id: bytes) -> int:
        """Fork a child for request socket ``fd``; -1 (reported) when fork fails."""
        try:
            pid = os.fork()
        except OSError as exc:
            self._send(b"E" + req_id + _PID.pack(exc.errno or errno.EAGAIN))
            return -1
        if pid == 0:
            self._child(fd)  # never returns
        self.children.add(pid)
        return pid

    def _make_spare(self) -> None:
        """Pre-fork the next child; it waits (unconfined, touching nothing) for a request."""
        if self.spare is not None or not self.prefork:
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            pid = os.fork()
        except OSError:
            ours.close()
            theirs.close()
            return
        if pid == 0:
            ours.close()
            self._child(-1, handoff=theirs)  # never returns
        theirs.close()
        self.children.add(pid)
        self.spare = (pid, ours)

    # -------------------------------------------------------------- child side

    def _child(self, fd: int, handoff: socket.socket | None = None) -> None:
        code = 0
        try:
            gc.disable()  # short-lived: a collection would touch (copy) every page
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            self._close_zygote_fds()
            zygote_pid = os.getppid()
            self.libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != zygote_pid:
                os._exit(1)
            if handoff is not None:
                self._prefault()
                fd = self._await_request(handoff)
            self._serve(fd)
        except BaseException:
            code = 1
        finally:
            os._exit(code)

    def _prefault(self) -> None:
        """Touch (copy-on-write) what serving a request touches, before it arrives.

        Pure computation only: no path is looked at before Landlock.
        """
        sample = {
            "op": "fs/readFile",
            "path": "/x/y",
            "expect": "/x",
            "plan": {"full_read": True, "full_write": False, "writable_roots": ["/x"]},
            "recursive": True,
            "force": True,
        }
        raw = json.dumps(sample).encode()
        self.ops.prefault(self.ops.OpRequest.from_header(json.loads(raw)))
        self.ops.encode_frame(json.dumps({"status": "ok", "result": {}}).encode(), 0)
        err = self.ops.error_from_os(FileNotFoundError(errno.ENOENT, "x"))
        json.dumps({"status": "error", "code": err.code, "message": err.message})
        self.confine.prefault()

    @staticmethod
    def _await_request(handoff: socket.socket) -> int:
        """A spare child blocks here until the zygote hands it a request socket."""
        while True:
            try:
                _msg, anc, _flags, _addr = handoff.recvmsg(8, socket.CMSG_SPACE(4))
                break
            except InterruptedError:
                continue
        handoff.close()
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS and len(payload) >= 4:
                return int(struct.unpack("i", payload[:4])[0])
        os._exit(0)  # the zygote is going away (EOF): nothing to do

    def _reply(self, fd: int, header: dict[str, object], payload: bytes = b"") -> None:
        frame = self.ops.encode_frame(json.dumps(header).encode(), len(payload))
        if len(payload) <= 256 * 1024:
            self.ops.write_all(fd, frame + payload)  # one wake-up for the server
        else:
            self.ops.write_all(fd, frame)
            self.ops.write_all(fd, payload)

    def _serve(self, fd: int) -> None:
        ops = self.ops
        try:
            raw, data = ops.read_frame(fd)
            header = json.loads(raw)
            if not isinstance(header, dict):
                raise ops.OpError(-32600, "fs sandbox request is not an object")
            if self.test_hooks:
                self._test_hook(fd, header.get("test_hook"))
                self._arm_pause(header.get("test_pause"))
            req = ops.OpRequest.from_header(header)
            plan = header.get("plan")
            if not isinstance(plan, dict):
                raise ops.OpError(-32600, "fs sandbox request has no plan")
            probe = (
                self._probe_open()
                if self.test_hooks and header.get("test_hook") == "probe"
                else None
            )
            try:
                self.confine.confine(plan, abi=self.abi)
            except OSError as exc:
                raise ops.OpError(-32603, f"failed to confine fs sandbox helper: {exc}") from exc
            if probe is not None:
                result, payload = self._probe(probe), b""
            else:
                result, payload = ops.execute(req, data, strict=True)
        except ops.OpError as exc:
            self._reply(fd, {"status": "error", "code": exc.code, "message": exc.message})
            return
        except (ValueError, EOFError) as exc:
            self._reply(
                fd,
                {
                    "status": "error",
                    "code": -32603,
                    "message": f"failed to decode fs sandbox request: {exc}",
                },
            )
            return
        passed = result.pop("passed_fd", None)
        if passed is None:
            self._reply(fd, {"status": "ok", "result": result}, payload)
            return
        # fs/open: the reply, then one byte carrying the descriptor (SCM_RIGHTS).
        self._reply(fd, {"status": "ok", "result": {"passed_fd": True}})
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fileno=fd)
        try:
            sock.sendmsg(
                [b"F"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", passed))]
            )
        finally:
            sock.detach()

    @staticmethod
    def _probe_open() -> int:
        return os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)

    @staticmethod
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

    def _test_hook(self, fd: int, hook: object) -> None:
        """Failure injection for the test suite (only with ``--test-hooks``)."""
        if hook == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        elif hook == "garbage":
            self.ops.write_all(fd, b"\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00\x00{{{{{")
            os._exit(0)
        elif hook == "hang":
            while True:
                time.sleep(3600)
        elif hook == "exit":
            os._exit(3)
        elif hook == "short":  # an ok reply that announces 1 MiB and sends 10 bytes
            ok = json.dumps({"status": "ok", "result": {}}).encode()
            self.ops.write_all(fd, self.ops.encode_frame(ok, 1 << 20) + b"0123456789")
            os._exit(0)

    def _arm_pause(self, spec: object) -> None:
        """Tests (``--test-hooks``): ``{"stage", "paused", "resume", "named"}`` stops a
        write at ``stage`` (``zygote_ops.test_pause``): the child writes
        ``<stage> <pid>\n`` to the FIFO ``paused`` and goes on once it reads a byte
        (or EOF) from the FIFO ``resume``. Both are opened before Landlock.
        ``named``: a named temp file instead of an unnamed one."""
        if not isinstance(spec, dict):
            return
        ops: Any = self.ops
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


def main(argv: list[str]) -> int:
    fs_dir, ctl_fd, server_pid = argv[1], int(argv[2]), int(argv[3])
    flags = argv[4:]
    return Zygote(
        ctl_fd, server_pid, fs_dir, "--test-hooks" in flags, "--no-prefork" not in flags
    ).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
