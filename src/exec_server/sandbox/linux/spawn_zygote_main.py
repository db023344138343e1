"""Landlock launches in the helper zygote (``S`` requests): a forked child runs
``_launch.main``, saving an interpreter start-up. Request: ``!QBB`` (id, tty, stdin) + JSON
``{"args", "env"}``; fds ``[stdin,] stdout, stderr, status`` or ``slave, status`` (PTY).
``P`` is reported only once the child leads its group or session: a ``killpg`` cannot miss it."""

import contextlib
import json
import os
import socket
import struct
import sys

from exec_server.sandbox.linux import _launch, knobs, landlock, seccomp

__all__ = ["REQUEST_HEADER", "STATUS_FD", "accepts", "handed_off", "prefault", "serve",
           "warm_up"]

REQUEST_HEADER = struct.Struct("!QBB")
STATUS_FD = 3


def accepts(raw: memoryview | bytearray, n: int, fds: list[int]) -> bool:
    """Whether a request of ``n`` bytes carries the fds its header announces."""
    if n < 1 + REQUEST_HEADER.size:
        return False
    _req_id, tty, stdin = REQUEST_HEADER.unpack_from(raw, 1)
    return len(fds) == (2 if tty else (4 if stdin else 3))


def handed_off(raw: memoryview, pid: int, handoff: socket.socket) -> None:
    """In the zygote: return once child ``pid`` leads its process group or session."""
    _req_id, tty, _stdin = REQUEST_HEADER.unpack_from(raw, 1)
    if tty:
        with contextlib.suppress(OSError):
            handoff.recv(1)  # after its setsid (EOF: it died)
        return
    # The child does it too, whichever runs first. EACCES: it already exec'd
    # (so its group exists); ESRCH: it died.
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)


def warm_up() -> None:
    """Import and exercise what a child needs, so forks start warm."""
    import _signal  # type: ignore[import-not-found]  # noqa: F401 - used by _launch
    import fcntl  # noqa: F401
    import resource  # noqa: F401
    import termios  # noqa: F401

    landlock.abi_version()
    knobs.read_only_knobs(full_write=False, writable_roots=())  # imported by root launches
    _launch._json_str("warm \"up\"\n")
    prefault()


def prefault() -> None:
    """Touch what a launch touches, before it arrives: pure computation, no path."""
    raw = json.dumps({"args": ["--status-fd", "3", "--full-read", "--write", "/x/y", "--ro",
                               "/x/y/.git", "--command-cwd", "/x/y", "--", "true"],
                      "env": {"PATH": "/usr/bin:/bin", "HOME": "/x"}}).encode()
    req = json.loads(raw)
    _launch._parse(req["args"])
    landlock.prefault()
    for mode in (seccomp.MODE_RESTRICTED, seccomp.MODE_VSOCK):
        seccomp.build_filter(mode)


def serve(raw: bytes, fds: list[int], handoff: socket.socket) -> int:
    """Become the launch; returns only the exit code of one failing before its exec."""
    code = _launch.EXIT_SETUP
    try:
        _req_id, tty, stdin = REQUEST_HEADER.unpack_from(raw, 1)
        if tty:
            os.setsid()
            handoff.send(b"s")
        else:
            os.setpgid(0, 0)
        req = json.loads(raw[1 + REQUEST_HEADER.size:])
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
            os.write(2, f"exec-server sandbox: helper zygote launch: {exc!r}\n".encode())
            _launch._report(STATUS_FD, "error", "zygote", repr(exc))
        except BaseException:
            pass
    with contextlib.suppress(BaseException):
        sys.stderr.flush()
    return code


def _max_fd() -> int:
    try:
        return int(os.sysconf("SC_OPEN_MAX"))
    except (ValueError, OSError):
        return 65536
