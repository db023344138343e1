"""The helper zygote: one small single-threaded Python forking a child per request.

Started lazily by ``fs.helper.client.Zygote`` as ``python -I -S -B main.py
--zygote <control fd> <server pid> [--test-hooks] [--no-prefork]``: no
site-packages, no environment-driven imports; the stdlib, the mechanism
modules of ``sandbox/linux`` and ``helper.ops``/``helper.confine`` loaded by
file path. The loop, the control protocol and the spares are
``fs.helper.loop``'s; this module says what the two request kinds
do:

* ``F`` + id, with the child's ``SOCK_STREAM`` socket: one confined
  filesystem operation. The child carries no_new_privs and the seccomp network
  filter and, as root, no capability (applied while it waits as a spare);
  with the request's frame read from its socket it applies Landlock for
  *that* request's plan before touching any path, runs the operation in
  strict mode, writes one reply frame and exits. The next ``F`` spare is
  forked once no ``F`` child runs.
* ``S`` + a launch (``sandbox.linux.spawn_zygote_main``): the child becomes a
  Landlock launch of a command. The next ``S`` spare is forked once the
  zygote has been idle for ``SPARE_DELAY`` (never while a launch's child is
  still confining itself on a small machine).

``R`` carries ``{"abi", "pid"}``: the Landlock ABI (0: no Landlock, nothing
can be served).
"""

from __future__ import annotations

import errno
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
    # The mechanism modules are stdlib-only: import them from the source tree
    # without site-packages.
    _src = os.path.abspath(__file__)
    for _ in range(4):  # src/exec_server/fs/helper/main.py -> src
        _src = os.path.dirname(_src)
    sys.path.insert(0, _src)

from exec_server._os.linux import call_prctl
from exec_server.fs.helper.loop import ZygoteBase
from exec_server.sandbox.linux import spawn_zygote_main as spawn

__all__ = ["main"]

_PR_SET_PDEATHSIG = 1
_FS = b"F"
_SPAWN = b"S"
#: idle seconds after a launch before the next launch spare is forked.
SPARE_DELAY = 0.002


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
    """The helper zygote; see the module docstring for its request kinds."""

    kinds = (_FS, _SPAWN)

    def __init__(self, ctl_fd: int, server_pid: int, test_hooks: bool,
                 prefork: bool = True) -> None:
        fs_dir = os.path.dirname(os.path.abspath(__file__))
        self.ops = _load("ops", fs_dir)
        self.confine = _load("confine", fs_dir)
        self.abi: int = self.confine.landlock_abi()
        from exec_server.sandbox.linux import seccomp

        self.seccomp = seccomp
        super().__init__(ctl_fd, server_pid, prefork)
        self.test_hooks = test_hooks
        #: monotonic time after which a new launch spare may be forked.
        self.spawn_at = 0.0

    # -------------------------------------------------------------- zygote side

    def _ready_message(self) -> bytes:
        return json.dumps({"abi": self.abi, "pid": os.getpid()}).encode()

    def _warm_up(self) -> None:
        """Run the children's code paths once so forked children start warm."""
        self.confine.warm_up(self.abi)
        req = self.ops.OpRequest.from_header({"op": "fs/getMetadata", "path": "/", "expect": "/"})
        for _ in range(3):
            self.ops.execute(req, b"")
            json.loads(json.dumps({"status": "ok", "result": {"a": [1, "b"]}}))
        spawn.warm_up()

    def _accepts(self, kind: bytes, n: int, fds: list[int]) -> bool:
        if kind == _FS:
            return n == 9 and len(fds) == 1
        self.spawn_at = time.monotonic() + SPARE_DELAY
        return spawn.accepts(self.buf, n, fds)

    def _spare_at(self, kind: bytes) -> float:
        if kind == _SPAWN:
            return self.spawn_at
        # No fs child running: the fork and its page faults never compete with one.
        return float("inf") if _FS in self.children.values() else 0.0

    def _handed_off(self, kind: bytes, raw: memoryview, pid: int,
                    handoff: socket.socket) -> None:
        if kind == _SPAWN:
            spawn.handed_off(raw, pid, handoff)

    # -------------------------------------------------------------- child side

    def _prepare(self, kind: bytes, ahead: bool) -> None:
        if kind == _SPAWN:
            if ahead:
                spawn.prefault()
            return
        zygote_pid = os.getppid()
        call_prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != zygote_pid:
            os._exit(1)
        if ahead:
            self._prefault()
        # Network is always off for the helper (PROTOCOL.md §10.1); from here
        # on only sendmsg/recvmsg are used (the filter denies sendto).
        self.seccomp.install_network_filter()
        if os.getuid() == 0:
            # As the one-shot helper (bwrap --cap-drop ALL, the launcher) and
            # upstream's: a confined operation obeys file permissions too, and
            # has no mount or chown powers.
            from exec_server.sandbox.linux._launch import drop_capabilities

            drop_capabilities(now=True)

    def _serve(self, kind: bytes, raw: bytes, fds: list[int], handoff: socket.socket) -> int:
        if kind == _SPAWN:
            return spawn.serve(raw, fds, handoff)
        handoff.close()
        self._serve_fs(fds[0])
        return 0

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

    def _reply(self, fd: int, header: dict[str, object], payload: bytes = b"") -> None:
        frame = self.ops.encode_frame(json.dumps(header).encode(), len(payload))
        if len(payload) <= 256 * 1024:
            self.ops.write_all(fd, frame + payload)  # one wake-up for the server
        else:
            self.ops.write_all(fd, frame)
            self.ops.write_all(fd, payload)

    def _serve_fs(self, fd: int) -> None:
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
                result, payload = ops.execute(req, data)
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
        write at ``stage`` (``helper.ops.test_pause``): the child writes
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
    """``main.py --zygote <control fd> <server pid> [--test-hooks] [--no-prefork]``."""
    ctl_fd, server_pid, flags = int(argv[2]), int(argv[3]), argv[4:]
    return Zygote(ctl_fd, server_pid, "--test-hooks" in flags, "--no-prefork" not in flags).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
