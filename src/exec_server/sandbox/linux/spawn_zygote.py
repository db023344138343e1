"""Server side of the spawn zygote: Landlock launches without a fresh interpreter each.

The Landlock launcher (``launcher.py``) costs one ``python -I -S`` start-up
per launch (~9 ms CPU). Instead one small single-threaded zygote
(``spawn_zygote_main.py``, started with ``subprocess`` — never a fork of the
multi-threaded server) preloads the launcher body and forks one child per
launch; the child runs the *same* ``_launch.main`` with the same flags, then
execs the command. The zygote is the child's parent: it reaps it and reports
the raw wait status, which :class:`SpawnZygote` hands to the process manager
through :class:`~exec_server.process.spec.ServicedChild`.

Lifecycle: started lazily by the first ``spawn`` of an event loop, which (like
every spawn before the zygote is ready) raises ``LaunchServiceUnavailable``
so the caller runs the launcher script instead — nothing ever waits for the
zygote to start. A zygote that dies is restarted the same way. It is closed
(and reaped) when its last owner (process manager) releases it, or by
:meth:`SpawnZygote.aclose`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Final

from exec_server.process.spec import LaunchServiceUnavailable, ServicedChild
from exec_server.sandbox.linux.spawn_zygote_main import MAX_REQUEST, REQUEST_HEADER
from exec_server.sandbox.linux.zygote_base import fds_from_anc

__all__ = ["SpawnRequest", "SpawnZygote"]

logger = logging.getLogger("exec_server.sandbox")

_LAUNCHER: Final = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launcher.py")
_ID_PID: Final = struct.Struct("!Qi")
_EXIT: Final = struct.Struct("!ii")
#: bigger than any reply (the largest is ``R`` + a short JSON object).
_REPLY_SIZE: Final = 4096
#: seconds a spawn may wait for the zygote's fork report before failing.
DEFAULT_SPAWN_TIMEOUT: Final = 5.0
#: seconds the zygote may take to report ready before it is killed.
DEFAULT_START_TIMEOUT: Final = 10.0
#: after this many failed starts in a row the zygote is not tried again.
_MAX_START_FAILURES: Final = 3


@dataclass(frozen=True, slots=True)
class SpawnRequest:
    """One launch for the zygote (the ``LaunchSpec.zygote.request`` of the Landlock backend).

    Attributes:
        args: launcher flags (``--status-fd 3 ... -- CMD...``), as ``_launch.main`` takes.
        env: the command's complete environment.
        cwd: the command's working directory (checked before the spawn).
        status_fd: the server-side write end of the status pipe (also in
            ``LaunchSpec.pass_fds``; the caller closes it after the spawn).
    """

    args: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    status_fd: int


@dataclass(eq=False, slots=True)
class _Proc:
    """One running zygote, bound to the event loop that started it."""

    popen: subprocess.Popen[bytes]
    ctl: socket.socket
    loop: asyncio.AbstractEventLoop
    ready: bool = False
    dead: bool = False
    started: dict[int, tuple[int, asyncio.Future[int]] | OSError] = field(default_factory=dict)
    exits: dict[int, asyncio.Future[int]] = field(default_factory=dict)
    timer: asyncio.TimerHandle | None = None


class SpawnZygote:
    """A lazily started spawn zygote; implements ``process.spec.LaunchService``.

    Use from one event loop at a time (a new loop replaces the zygote).

    Args:
        python: interpreter for the zygote (default ``sys.executable``).
        start_timeout: seconds to wait for the zygote's ready message.
        spawn_timeout: seconds a spawn waits for the fork report.
        prefork: keep one child forked ahead of time (the fork and its
            copy-on-write faults leave the launch's critical path).
    """

    def __init__(
        self,
        *,
        python: str | None = None,
        start_timeout: float = DEFAULT_START_TIMEOUT,
        spawn_timeout: float = DEFAULT_SPAWN_TIMEOUT,
        prefork: bool = True,
    ) -> None:
        self._python = python or sys.executable
        self._prefork = prefork
        self._start_timeout = start_timeout
        self._spawn_timeout = spawn_timeout
        self._z: _Proc | None = None
        self._owners: dict[int, object] = {}
        self._next_id = 0
        self._failures = 0
        self._closing: set[asyncio.Task[None]] = set()
        self._ready_waiters: list[asyncio.Future[None]] = []
        #: launches started through the zygote (tests, diagnostics).
        self.spawned = 0

    @property
    def pid(self) -> int | None:
        """The running (ready) zygote's pid, else None."""
        z = self._z
        return z.popen.pid if z is not None and z.ready and not z.dead else None

    def __repr__(self) -> str:
        return f"<SpawnZygote pid={self.pid} owners={len(self._owners)} spawned={self.spawned}>"

    # ------------------------------------------------------------------ LaunchService

    def spawn(
        self,
        request: object,
        stdio: tuple[int | None, int, int],
        *,
        tty: bool,
        owner: object,
    ) -> ServicedChild:
        """Fork a confined child for ``request``; see ``process.spec.LaunchService``."""
        if not isinstance(request, SpawnRequest):
            raise LaunchServiceUnavailable(f"not a spawn request: {request!r}")
        loop = asyncio.get_running_loop()
        z = self._current(loop)
        self._owners[id(owner)] = owner
        if z is None or not z.ready:
            raise LaunchServiceUnavailable("the spawn zygote is not ready")
        st = os.stat(request.cwd)  # the launcher path fails here too (Popen's cwd)
        if not (st.st_mode & 0o170000 == 0o040000):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), request.cwd)
        self._next_id += 1
        req_id = self._next_id
        stdin, stdout, stderr = stdio
        header = REQUEST_HEADER.pack(req_id, tty, stdin is not None and not tty)
        body = json.dumps({"args": request.args, "env": request.env})
        raw = b"S" + header + body.encode()  # ASCII: surrogates travel escaped
        if len(raw) > MAX_REQUEST:
            raise LaunchServiceUnavailable("launch request too large for the spawn zygote")
        if tty:
            fds = [stdout, request.status_fd]
        elif stdin is not None:
            fds = [stdin, stdout, stderr, request.status_fd]
        else:
            fds = [stdout, stderr, request.status_fd]
        try:
            z.ctl.sendmsg([raw], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                   struct.pack(f"{len(fds)}i", *fds))])
        except (BlockingIOError, InterruptedError) as exc:
            raise LaunchServiceUnavailable("the spawn zygote is busy") from exc
        except OSError as exc:
            if exc.errno in (errno.EMSGSIZE, errno.ENOBUFS, errno.ENOMEM):
                raise LaunchServiceUnavailable(f"spawn zygote request: {exc}") from exc
            # Not delivered (EPIPE/ECONNRESET): nothing was forked.
            self._mark_dead(z, f"cannot reach the spawn zygote: {exc}")
            raise LaunchServiceUnavailable("the spawn zygote is gone") from exc
        # The exit may already be in (same drain as the fork report): the future holds it.
        pid, fut = self._await_fork(z, req_id)
        self.spawned += 1
        return ServicedChild(pid=pid, wait=lambda: fut)

    async def release(self, owner: object) -> None:
        """Forget ``owner``; the last one closes (and reaps) the zygote."""
        self._owners.pop(id(owner), None)
        if not self._owners:
            await self.aclose()

    # ------------------------------------------------------------------ lifecycle

    async def ensure_started(self, owner: object) -> None:
        """Start the zygote for ``owner`` and wait until it is ready (tests, benchmarks).

        Raises:
            LaunchServiceUnavailable: it could not be started.
        """
        loop = asyncio.get_running_loop()
        z = self._current(loop)
        self._owners[id(owner)] = owner
        if z is None:
            raise LaunchServiceUnavailable("the spawn zygote cannot be started")
        if z.ready:
            return
        fut: asyncio.Future[None] = loop.create_future()
        self._ready_waiters.append(fut)
        await fut
        if self._z is None or not self._z.ready or self._z.dead:
            raise LaunchServiceUnavailable("the spawn zygote did not start")

    async def aclose(self) -> None:
        """Close the zygote (it kills its children's groups and exits) and reap it.

        The service stays usable: a later ``spawn`` starts a new zygote.
        """
        loop = asyncio.get_running_loop()
        z, self._z = self._z, None
        if z is not None:
            if z.loop is loop:
                self._retire(z, "closed")
            else:
                self._kill_sync(z)
        while pending := [t for t in self._closing if t.get_loop() is loop]:
            await asyncio.wait(pending)

    def _current(self, loop: asyncio.AbstractEventLoop) -> _Proc | None:
        """The zygote of ``loop``, starting one when there is none (None: cannot start)."""
        z = self._z
        if z is not None and z.loop is not loop:
            # A zygote of another (probably finished) loop: it and its owners are stale.
            self._z = None
            self._kill_sync(z)
            self._owners.clear()
            self._closing = {t for t in self._closing if t.get_loop() is loop}
            z = None
        if z is not None and z.dead:
            self._z = z = None
        if z is None:
            if self._failures >= _MAX_START_FAILURES:
                return None
            z = self._z = self._start(loop)
        return z

    def _start(self, loop: asyncio.AbstractEventLoop) -> _Proc | None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with contextlib.suppress(OSError):
                ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_REQUEST * 2)
            popen = subprocess.Popen(
                [self._python, "-I", "-S", "-B", _LAUNCHER, "--zygote", str(theirs.fileno()),
                 str(os.getpid()), *(() if self._prefork else ("--no-prefork",))],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
                env={},
                cwd="/",
            )
        except OSError as exc:
            ours.close()
            self._failures += 1
            logger.warning("cannot start the spawn zygote: %s", exc)
            return None
        finally:
            theirs.close()
        ours.setblocking(False)
        z = _Proc(popen=popen, ctl=ours, loop=loop)
        loop.add_reader(ours.fileno(), self._drain, z)
        z.timer = loop.call_later(self._start_timeout, self._start_timed_out, z)
        return z

    def _start_timed_out(self, z: _Proc) -> None:
        z.timer = None
        if not z.ready and not z.dead:
            self._mark_dead(z, "the spawn zygote did not report ready in time")

    def _kill_sync(self, z: _Proc) -> None:
        """Tear down a zygote whose loop is gone (no awaiting possible)."""
        z.dead = True
        with contextlib.suppress(Exception):
            z.loop.remove_reader(z.ctl.fileno())
        if z.timer is not None:
            z.timer.cancel()
        z.ctl.close()
        for pid in z.exits:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            z.popen.kill()
        with contextlib.suppress(ChildProcessError):
            z.popen.wait()

    def _mark_dead(self, z: _Proc, why: str) -> None:
        """The zygote is gone or unusable: fail what waits on it and reap it (async)."""
        if z.dead:
            return
        if not z.ready:
            self._failures += 1
        logger.warning("spawn zygote %d: %s", z.popen.pid, why)
        self._retire(z, why)

    def _retire(self, z: _Proc, why: str) -> None:
        if z.dead and z.ctl.fileno() < 0:
            return
        z.dead = True
        if z.timer is not None:
            z.timer.cancel()
            z.timer = None
        with contextlib.suppress(ValueError, OSError, RuntimeError):
            z.loop.remove_reader(z.ctl.fileno())
        # EOF on the control socket: the zygote SIGKILLs its children's groups and exits.
        z.ctl.close()
        for pid, fut in z.exits.items():
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)  # a child outliving its zygote is unobservable
            if not fut.done():
                fut.set_result(-1)
        z.exits.clear()
        for w in self._ready_waiters:
            if not w.done():
                w.set_result(None)
        self._ready_waiters.clear()
        task = z.loop.create_task(self._reap(z))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        logger.debug("spawn zygote %d retired: %s", z.popen.pid, why)

    @staticmethod
    async def _reap(z: _Proc) -> None:
        """Wait (pidfd) for the retired zygote to exit, SIGKILL it after 5 s; always reap."""
        loop = asyncio.get_running_loop()
        try:
            pidfd = os.pidfd_open(z.popen.pid)
        except OSError:
            pidfd = -1
        try:
            if pidfd >= 0:
                gone: asyncio.Event = asyncio.Event()
                loop.add_reader(pidfd, gone.set)
                try:
                    async with asyncio.timeout(5.0):
                        await gone.wait()
                finally:
                    loop.remove_reader(pidfd)
        except TimeoutError:
            logger.warning("spawn zygote %d did not exit; killing it", z.popen.pid)
        finally:
            if pidfd >= 0:
                os.close(pidfd)
            if z.popen.poll() is None:
                # Timed out, cancelled (loop ending) or no pidfd: SIGKILL ends it at once.
                with contextlib.suppress(OSError):
                    z.popen.kill()
                z.popen.wait()

    # ------------------------------------------------------------------ control socket

    def _drain(self, z: _Proc) -> None:
        """Read every pending control message (reader callback, and while spawning)."""
        while not z.dead:
            try:
                msg, anc, _flags, _addr = z.ctl.recvmsg(_REPLY_SIZE, socket.CMSG_SPACE(16))
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._mark_dead(z, f"control socket error: {exc}")
                return
            for fd in fds_from_anc(anc):  # none expected; never leak one
                os.close(fd)
            if not msg:
                self._mark_dead(z, "the spawn zygote exited")
                return
            kind = msg[:1]
            if kind == b"X" and len(msg) == 1 + _EXIT.size:
                pid, status = _EXIT.unpack(msg[1:])
                fut = z.exits.pop(pid, None)
                if fut is not None and not fut.done():
                    fut.set_result(status)
            elif kind in (b"P", b"E") and len(msg) == 1 + _ID_PID.size:
                req_id, value = _ID_PID.unpack(msg[1:])
                if kind == b"P":
                    fut = z.exits[value] = z.loop.create_future()
                    z.started[req_id] = (value, fut)
                else:
                    z.started[req_id] = OSError(value, f"spawn zygote fork: {os.strerror(value)}")
            elif kind == b"R":
                z.ready = True
                self._failures = 0
                if z.timer is not None:
                    z.timer.cancel()
                    z.timer = None
                for w in self._ready_waiters:
                    if not w.done():
                        w.set_result(None)
                self._ready_waiters.clear()
                logger.debug("spawn zygote %d ready", z.popen.pid)

    def _await_fork(self, z: _Proc, req_id: int) -> tuple[int, asyncio.Future[int]]:
        """Block (briefly: one fork) until the zygote reports this request's child."""
        deadline = time.monotonic() + self._spawn_timeout
        while req_id not in z.started:
            if z.dead:
                raise OSError(errno.EIO, "the spawn zygote died while starting the process")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._mark_dead(z, "no fork report in time")
                raise OSError(errno.ETIMEDOUT, "the spawn zygote did not start the process")
            with contextlib.suppress(InterruptedError):
                select.select([z.ctl], [], [], remaining)
            self._drain(z)
        result = z.started.pop(req_id)
        if isinstance(result, OSError):
            raise result
        return result
