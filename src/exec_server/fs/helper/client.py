"""Client of the helper zygote: confined fs calls and Landlock launches, one process.

The server is multi-threaded and must never fork itself to confine a child
(SANDBOX.md §0.3). Instead one small single-threaded ``python -I -S`` process
(``main.py``, started with ``subprocess``) forks one child per request:
a confined filesystem operation (``F``) or a Landlock launch (``S``); the
control protocol is ``fs.helper.loop``'s.

fs call: the server creates a ``SOCK_STREAM`` socketpair, hands one end to the
zygote, gets back the child's pid and a pidfd, streams the request frame (raw
bytes, no base64) and reads the reply frame until complete. A hang is bounded
by the caller's timeout (the child is ``SIGKILL``ed through its pidfd), an
early EOF or an undecodable frame becomes ``HelperFailure`` with the exit
status the zygote reports. A writeFile whose caller goes away once its child
has the whole request is finished in the background (:meth:`Zygote.drain`),
and the temp file name of a writeFile child that died is removed
(:func:`remove_temp_file`; docs/sandboxed-fs.md).

Launch (``process.spec.LaunchService``): the command's stdio and status pipe
go to the zygote; :meth:`Zygote.spawn` awaits the child's pid (it leads its
own group by then) and the child's wait status arrives when the zygote reaps
it. While the zygote is not ready a launch raises ``LaunchServiceUnavailable``
(the caller runs the launcher script) and the zygote starts meanwhile; an fs
call awaits the start.

Lifecycle: started lazily, on the event loop of its first use (a use from
another loop replaces it: tests run one loop each); restarted when it dies;
closed when its last owner (process manager, sandboxed filesystem) releases it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from exec_server.fs.direct import Payload, Pieces
from exec_server.fs.helper.loop import ID_PID, MAX_REQUEST, fds_from_anc
from exec_server.fs.helper.ops import FRAME, MAX_DATA, encode_frame, temp_name
from exec_server.fs.pool import shared_pool
from exec_server.process.spec import LaunchServiceUnavailable, ServicedChild
from exec_server.sandbox.linux.spawn_zygote_main import REQUEST_HEADER

__all__ = [
    "HelperFailure",
    "SpawnRequest",
    "Zygote",
    "ZygoteUnavailable",
    "describe_wait_status",
    "new_temp_token",
    "remove_temp",
    "remove_temp_file",
    "shared_zygote",
    "write_temp",
]

logger = logging.getLogger("exec_server.fs.sandbox")

_ID: Final = struct.Struct("!Q")
_EXIT: Final = struct.Struct("!ii")
_MAX_REPLY_HEADER: Final = 64 * 1024 * 1024
_MAIN: Final = os.path.join(os.path.dirname(os.path.abspath(__file__)), "main.py")
#: payloads up to this size are sent together with their frame header.
_COALESCE: Final = 256 * 1024
#: how long to wait for the zygote to report a killed child as reaped.
_REAP_TIMEOUT: Final = 5.0
#: seconds a launch may wait for the zygote's report of its child.
DEFAULT_SPAWN_TIMEOUT: Final = 5.0
#: after this many failed starts in a row the zygote is not tried again.
_MAX_START_FAILURES: Final = 3
_CLOSED: Final = "the helper zygote was closed"
#: operations whose child, once it has the whole request, is not killed when the
#: caller stops waiting: it finishes in the background within the call's timeout,
#: as a cancelled direct call's worker thread does (docs/sandboxed-fs.md).
_FINISH_WHEN_CANCELLED: Final = frozenset({"fs/writeFile"})


class ZygoteUnavailable(Exception):
    """The zygote could not be started (or Landlock is missing); use another path."""


class HelperFailure(Exception):
    """A child crashed, hung, or answered something that is not a reply frame."""


class _NoChild(HelperFailure):
    """The zygote could not start a child for the request (``errno``)."""

    def __init__(self, err: int) -> None:
        super().__init__(f"cannot fork a sandbox helper: {os.strerror(err)}")
        self.errno = err


class _NotForked(Exception):
    """The request never reached a child (the zygote was gone)."""


def describe_wait_status(status: int) -> str:
    """Format like Rust's ``ExitStatus`` Display: ``exit status: 1`` / ``signal: 9 (SIGKILL)``."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            return f"signal: {sig}"
        return f"signal: {sig} ({name})"
    return f"exit status: {os.waitstatus_to_exitcode(status)}"


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
class _Pending:
    """One request's child: its pid and pidfd once started, its wait status once reaped."""

    started: asyncio.Future[tuple[int, int]]
    exited: asyncio.Future[int]
    pid: int | None = None
    pidfd: int | None = None
    #: a launch: its whole process group is killed if the zygote dies first.
    group: bool = False


@dataclass(eq=False, slots=True)
class _Call:
    """One request on its way: its zygote, child, socket and writeFile temp name."""

    z: _Process
    req_id: int
    p: _Pending
    sock: socket.socket
    #: (directory, name) of the temp file a killed writeFile child may leave.
    temp: tuple[str, str] | None = None


@dataclass(eq=False, slots=True)
class _Process:
    """One running zygote, bound to the event loop that started it."""

    popen: subprocess.Popen[bytes]
    ctl: socket.socket
    loop: asyncio.AbstractEventLoop
    ready: asyncio.Future[None]
    abi: int = 0
    pending: dict[int, _Pending] = field(default_factory=dict)
    by_pid: dict[int, _Pending] = field(default_factory=dict)
    dead: bool = False
    timer: asyncio.TimerHandle | None = None
    #: resolves when the full control socket has room again (fs senders wait on it).
    writable: asyncio.Future[None] | None = None


class Zygote:
    """A lazily started helper zygote; implements ``process.spec.LaunchService``.

    Args:
        python: interpreter for the zygote (default ``sys.executable``).
        start_timeout: seconds to wait for the zygote's ready message.
        spawn_timeout: seconds a launch waits for its child's report.
        test_hooks: let fs requests carry ``test_hook`` (crash/garbage/hang/short) and
            ``test_pause`` (``zygote_main.Zygote._arm_pause``) for tests.
        prefork: keep a child of each kind forked ahead of time (takes the fork
            off the request's critical path).
    """

    def __init__(
        self,
        *,
        python: str | None = None,
        start_timeout: float = 10.0,
        spawn_timeout: float = DEFAULT_SPAWN_TIMEOUT,
        test_hooks: bool = False,
        prefork: bool = True,
    ) -> None:
        self._python = python or sys.executable
        self._prefork = prefork
        self._start_timeout = start_timeout
        self._spawn_timeout = spawn_timeout
        self._test_hooks = test_hooks
        self._z: _Process | None = None
        self._next_id = 0
        self._failures = 0
        self._unavailable: str | None = (
            None if sys.platform.startswith("linux") else "the helper zygote needs Linux"
        )
        self._owners: dict[int, object] = {}
        self._closing: set[asyncio.Task[None]] = set()
        #: calls whose caller went away while their child finishes (``_FINISH_WHEN_CANCELLED``).
        self._finishing: set[asyncio.Task[tuple[dict[str, object], bytes]]] = set()
        #: launches started through the zygote (tests, diagnostics).
        self.spawned = 0

    @property
    def pid(self) -> int | None:
        """The running (ready) zygote's pid, else None (also for another loop's zygote)."""
        z = self._z
        if z is None or z.dead or not z.ready.done() or z.ready.cancelled():
            return None
        if z.ready.exception() is not None:
            return None
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        return z.popen.pid if loop is None or loop is z.loop else None

    @property
    def abi(self) -> int:
        """Landlock ABI the zygote probed (0 before start)."""
        return 0 if self._z is None else self._z.abi

    def __repr__(self) -> str:
        return f"<Zygote pid={self.pid} abi={self.abi} owners={len(self._owners)}>"

    # ------------------------------------------------------------------ lifecycle

    async def ensure_started(self, owner: object = None) -> None:
        """Start (or restart) the zygote for ``owner`` and wait until it is ready.

        Raises:
            ZygoteUnavailable: it cannot start, or the kernel lacks Landlock.
        """
        await self._ready(owner)

    async def _ready(self, owner: object) -> _Process:
        if owner is not None:
            self._owners[id(owner)] = owner
        z = self._current(asyncio.get_running_loop())
        if z is None:
            raise ZygoteUnavailable(self._unavailable or "the helper zygote cannot start")
        try:
            await asyncio.shield(z.ready)
        except HelperFailure as exc:
            raise ZygoteUnavailable(f"the helper zygote did not start: {exc}") from None
        if z.abi <= 0:
            self._unavailable = "Landlock is not available in this kernel"
            self._retire(z, self._unavailable)
            raise ZygoteUnavailable(self._unavailable)
        return z

    async def release(self, owner: object) -> None:
        """Forget ``owner``; the last one closes (and reaps) the zygote."""
        self._owners.pop(id(owner), None)
        if not self._owners:
            await self.aclose()

    async def aclose(self) -> None:
        """Close the zygote (it kills its children's groups and exits) and reap it.

        The service stays usable: a later use starts a new zygote.
        """
        loop = asyncio.get_running_loop()
        z, self._z = self._z, None
        if z is not None:
            if z.loop is loop:
                self._retire(z, _CLOSED)
            else:
                self._kill_sync(z)
        while pending := [t for t in self._closing if t.get_loop() is loop]:
            await asyncio.wait(pending)
        await self.drain()

    async def drain(self) -> None:
        """Wait until the calls whose callers stopped waiting have finished: their
        children answered, or were killed at the timeout and reaped, and their temp
        files removed."""
        while self._finishing:
            await asyncio.gather(*self._finishing, return_exceptions=True)

    def _current(self, loop: asyncio.AbstractEventLoop) -> _Process | None:
        """The zygote of ``loop``, starting one when there is none (None: cannot start)."""
        z = self._z
        if z is not None and z.loop is not loop:
            # A zygote of another (probably finished) loop: it and its owners are stale.
            self._z = None
            self._kill_sync(z)
            self._owners.clear()
            self._closing = {t for t in self._closing if t.get_loop() is loop}
            self._finishing = {t for t in self._finishing if t.get_loop() is loop}
            z = None
        if z is not None and z.dead:
            self._z = z = None
        if z is None and self._unavailable is None:
            z = self._z = self._start(loop)
        return z

    def _start(self, loop: asyncio.AbstractEventLoop) -> _Process | None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        flags = [*(["--test-hooks"] if self._test_hooks else ()),
                 *(["--no-prefork"] if not self._prefork else ())]
        try:
            with contextlib.suppress(OSError):
                ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_REQUEST * 2)
            popen = subprocess.Popen(
                [self._python, "-I", "-S", "-B", _MAIN, "--zygote", str(theirs.fileno()),
                 str(os.getpid()), *flags],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
                env={},
                cwd="/",
            )
        except OSError as exc:
            ours.close()
            self._failed_start(f"cannot start the helper zygote: {exc}")
            return None
        finally:
            theirs.close()
        ours.setblocking(False)
        z = _Process(popen=popen, ctl=ours, loop=loop, ready=loop.create_future())
        loop.add_reader(ours.fileno(), self._on_control, z)
        z.timer = loop.call_later(self._start_timeout, self._start_timed_out, z)
        return z

    def _failed_start(self, why: str) -> None:
        self._failures += 1
        logger.warning("%s", why)
        if self._failures >= _MAX_START_FAILURES:
            self._unavailable = f"the helper zygote failed to start {self._failures} times"

    def _start_timed_out(self, z: _Process) -> None:
        z.timer = None
        if not z.ready.done():
            self._retire(z, "the helper zygote did not report ready in time")

    def _kill_sync(self, z: _Process) -> None:
        """Tear down a zygote whose loop is gone (no awaiting possible)."""
        z.dead = True
        with contextlib.suppress(Exception):
            z.loop.remove_reader(z.ctl.fileno())
        if z.timer is not None:
            z.timer.cancel()
        z.ctl.close()
        _kill_launches(z)
        with contextlib.suppress(OSError):
            z.popen.kill()
        with contextlib.suppress(ChildProcessError):
            z.popen.wait()

    def _retire(self, z: _Process, why: str) -> None:
        """The zygote is closed, gone or unusable: fail what waits on it, reap it (async)."""
        if z.dead:
            return
        z.dead = True
        if z.timer is not None:
            z.timer.cancel()
            z.timer = None
        with contextlib.suppress(ValueError, OSError, RuntimeError):
            z.loop.remove_reader(z.ctl.fileno())
        self._writable(z)
        # EOF on the control socket: the zygote SIGKILLs its children's groups and exits.
        z.ctl.close()
        if not z.ready.done():
            if why != _CLOSED:  # closed while starting is no failed start
                self._failed_start(f"helper zygote {z.popen.pid}: {why}")
            z.ready.set_exception(HelperFailure(why))
            z.ready.exception()  # mark retrieved: nobody may be waiting
        elif why != _CLOSED:
            logger.warning("helper zygote %d: %s", z.popen.pid, why)
        _kill_launches(z)
        for p in {*z.pending.values(), *z.by_pid.values()}:
            for fut in (p.started, p.exited):
                if not fut.done():
                    fut.set_exception(HelperFailure(why))
                    fut.exception()
        task = z.loop.create_task(self._reap(z))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _reap(z: _Process) -> None:
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
            logger.warning("helper zygote %d did not exit; killing it", z.popen.pid)
        finally:
            if pidfd >= 0:
                os.close(pidfd)
            if z.popen.poll() is None:
                # Timed out, cancelled (loop ending) or no pidfd: SIGKILL ends it at once.
                with contextlib.suppress(OSError):
                    z.popen.kill()
                z.popen.wait()

    # ------------------------------------------------------------------ control socket

    def _on_control(self, z: _Process) -> None:
        while not z.dead:
            try:
                msg, anc, _flags, _addr = z.ctl.recvmsg(4096, socket.CMSG_SPACE(16))
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._retire(z, f"control socket error: {exc}")
                return
            fds = fds_from_anc(anc)
            if not msg:
                for fd in fds:
                    os.close(fd)
                self._retire(z, "the helper zygote exited")
                return
            kind = msg[:1]
            if kind == b"P" and len(msg) == 1 + ID_PID.size and len(fds) == 1:
                req_id, pid = ID_PID.unpack(msg[1:])
                p = z.pending.get(req_id)
                if p is None or p.started.done():
                    os.close(fds[0])
                    continue
                p.pid, p.pidfd = pid, fds[0]
                z.by_pid[pid] = p
                p.started.set_result((pid, fds[0]))
                continue
            for fd in fds:
                os.close(fd)
            if kind == b"X" and len(msg) == 1 + _EXIT.size:
                pid, status = _EXIT.unpack(msg[1:])
                p = z.by_pid.pop(pid, None)
                if p is not None and not p.exited.done():
                    p.exited.set_result(status)
            elif kind == b"E" and len(msg) == 1 + ID_PID.size:
                req_id, err = ID_PID.unpack(msg[1:])
                p = z.pending.get(req_id)
                if p is not None and not p.started.done():
                    p.started.set_exception(_NoChild(err))
            elif kind == b"R" and not z.ready.done():
                z.abi = int(json.loads(msg[1:]).get("abi", 0))
                self._failures = 0
                if z.timer is not None:
                    z.timer.cancel()
                    z.timer = None
                z.ready.set_result(None)
                logger.debug("helper zygote %d ready, Landlock ABI %d", z.popen.pid, z.abi)

    def _pending(self, z: _Process, *, group: bool = False) -> tuple[int, _Pending]:
        self._next_id += 1
        p = _Pending(started=z.loop.create_future(), exited=z.loop.create_future(), group=group)
        z.pending[self._next_id] = p
        return self._next_id, p

    # ------------------------------------------------------------------ launches

    async def spawn(
        self,
        request: object,
        stdio: tuple[int | None, int, int],
        *,
        tty: bool,
        owner: object,
    ) -> ServicedChild:
        """Start a confined child for ``request``; see ``process.spec.LaunchService``."""
        if not isinstance(request, SpawnRequest):
            raise LaunchServiceUnavailable(f"not a spawn request: {request!r}")
        self._owners[id(owner)] = owner
        z = self._current(asyncio.get_running_loop())
        if z is None or z.dead or not z.ready.done() or z.abi <= 0:
            raise LaunchServiceUnavailable("the helper zygote is not ready")
        # The launcher path fails here too (Popen's cwd); a worker, as the cwd
        # may be on a hung mount.
        st = await shared_pool().run(os.stat, request.cwd)
        if not stat.S_ISDIR(st.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), request.cwd)
        stdin, stdout, stderr = stdio
        body = json.dumps({"args": request.args, "env": request.env}).encode()
        if 1 + REQUEST_HEADER.size + len(body) > MAX_REQUEST:
            raise LaunchServiceUnavailable("launch request too large for the helper zygote")
        if tty:
            fds = [stdout, request.status_fd]
        elif stdin is not None:
            fds = [stdin, stdout, stderr, request.status_fd]
        else:
            fds = [stdout, stderr, request.status_fd]
        if z.dead:
            raise LaunchServiceUnavailable("the helper zygote is gone")
        req_id, p = self._pending(z, group=True)
        # ASCII JSON: surrogates travel escaped.
        raw = b"S" + REQUEST_HEADER.pack(req_id, tty, stdin is not None and not tty) + body
        try:
            try:
                z.ctl.sendmsg([raw], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                       struct.pack(f"{len(fds)}i", *fds))])
            except (BlockingIOError, InterruptedError) as exc:
                raise LaunchServiceUnavailable("the helper zygote is busy") from exc
            except OSError as exc:
                if exc.errno in (errno.EMSGSIZE, errno.ENOBUFS, errno.ENOMEM):
                    raise LaunchServiceUnavailable(f"helper zygote request: {exc}") from exc
                # Not delivered (EPIPE/ECONNRESET): nothing was started.
                self._retire(z, f"cannot reach the helper zygote: {exc}")
                raise LaunchServiceUnavailable("the helper zygote is gone") from exc
            try:
                async with asyncio.timeout(self._spawn_timeout):
                    pid, pidfd = await asyncio.shield(p.started)
            except TimeoutError:
                self._retire(z, "no report of a launch in time")
                raise OSError(errno.ETIMEDOUT, "the helper zygote did not start it") from None
            except _NoChild as exc:
                raise OSError(exc.errno, f"helper zygote fork: {os.strerror(exc.errno)}") from None
            except HelperFailure:
                raise OSError(errno.EIO, "the helper zygote died starting it") from None
        except BaseException:
            # Cancelled while the child starts: it is killed once it is known.
            p.started.add_done_callback(_kill_launch)
            raise
        finally:
            z.pending.pop(req_id, None)
        os.close(pidfd)
        p.pidfd = None
        self.spawned += 1
        return ServicedChild(pid=pid, wait=lambda: _exit_status(p))

    # ------------------------------------------------------------------ requests

    async def run(
        self,
        header: dict[str, object],
        data: Payload = b"",
        *,
        timeout: float,  # noqa: ASYNC109
        owner: object = None,
    ) -> tuple[dict[str, object], bytes]:
        """Run one request in a fresh confined child (for ``owner``, which releases us).

        When this returns or raises, the child has replied and exits on its
        own, or it has been killed and reaped (bounded wait).

        Args:
            header: the request header (``helper.ops.OpRequest`` fields + ``plan``).
            data: raw payload (writeFile contents); :class:`~exec_server.fs.direct.Pieces`
                are sent as they are made, and if making one raises, the child is
                killed before it has all the data (it writes nothing) and the
                error propagates.
            timeout: seconds before the child is killed.

        Returns:
            The reply header (``status`` ok/error …) and the raw reply payload.

        Raises:
            ZygoteUnavailable: no zygote can run here.
            HelperFailure: the child crashed, hung or sent garbage.
        """
        try:
            return await self._run_once(header, data, timeout, owner)
        except _NotForked:
            # The zygote died before it could fork: nothing ran, so one retry
            # on a fresh zygote is safe.
            return await self._run_once(header, data, timeout, owner)

    async def _run_once(
        self,
        header: dict[str, object],
        data: Payload,
        timeout: float,  # noqa: ASYNC109
        owner: object,
    ) -> tuple[dict[str, object], bytes]:
        z = await self._ready(owner)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        req_id, p = self._pending(z)
        op = header.get("op")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        call = _Call(z, req_id, p, ours, write_temp(header))
        try:
            ours.setblocking(False)
            raw = json.dumps(header).encode()
            try:
                async with asyncio.timeout_at(deadline):
                    try:
                        await self._send_control(z, b"F" + _ID.pack(req_id), theirs.fileno())
                    finally:
                        theirs.close()
                    # The frame goes into the socket buffer while the zygote forks.
                    await self._send(loop, ours, raw, data)
            except TimeoutError:
                raise HelperFailure(
                    f"fs sandbox helper timed out after {timeout:g}s and was killed"
                ) from None
        except BaseException:
            # The child (almost always) does not have its whole request yet: it has
            # done nothing, and is killed.
            await self._end(call, clean=False)
            raise
        receive = self._receive(call, deadline, timeout)
        if op not in _FINISH_WHEN_CANCELLED:
            return await receive
        # The child has everything it needs: if our caller stops waiting, it is not
        # killed half way but finishes in the background (``drain``).
        task = loop.create_task(receive)
        self._finishing.add(task)
        task.add_done_callback(self._finished)
        return await asyncio.shield(task)

    async def _send_control(self, z: _Process, msg: bytes, fd: int) -> None:
        """Send an ``F`` request; a full control socket (a burst, big launches queued
        before it) is waited out; a dead zygote forked nothing (``_NotForked``)."""
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fd))]
        while not z.dead:
            try:
                z.ctl.sendmsg([msg], anc)
                return
            except (BlockingIOError, InterruptedError):
                if z.writable is None:
                    z.writable = z.loop.create_future()
                    z.loop.add_writer(z.ctl.fileno(), self._writable, z)
                await asyncio.shield(z.writable)
            except OSError as exc:
                self._retire(z, f"cannot reach the helper zygote: {exc}")
        raise _NotForked

    @staticmethod
    def _writable(z: _Process) -> None:
        """Wake the senders waiting for room on the control socket (or its end)."""
        with contextlib.suppress(ValueError, OSError):
            z.loop.remove_writer(z.ctl.fileno())
        fut, z.writable = z.writable, None
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def _send(
        self, loop: asyncio.AbstractEventLoop, sock: socket.socket, raw: bytes, data: Payload
    ) -> None:
        try:
            if isinstance(data, Pieces):
                await loop.sock_sendall(sock, encode_frame(raw, data.size))
                # Each piece is made (decoded) here, on the loop, in the
                # ~1 ms msgspec takes for 1 MiB of text.
                sent = 0
                for piece in data.produce():
                    await loop.sock_sendall(sock, piece)
                    sent += len(piece)
                if sent != data.size:  # the child would wait for the rest
                    raise HelperFailure(f"fs sandbox payload was {sent} bytes, not {data.size}")
            elif len(data) <= _COALESCE:
                frame = encode_frame(raw, len(data))
                await loop.sock_sendall(sock, frame + data)  # one wake-up
            else:
                await loop.sock_sendall(sock, encode_frame(raw, len(data)))
                await loop.sock_sendall(sock, data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the child died early; reading the reply reports how

    async def _receive(
        self,
        call: _Call,
        deadline: float,
        timeout: float,  # noqa: ASYNC109
    ) -> tuple[dict[str, object], bytes]:
        loop = asyncio.get_running_loop()
        clean = False
        try:
            try:
                async with asyncio.timeout_at(deadline):
                    # The zygote's ``P`` (pid + pidfd) arrives concurrently; it is
                    # only needed to kill the child or to explain a crash.
                    reply = await self._read_reply(loop, call.sock, call.p)
            except TimeoutError:
                raise HelperFailure(
                    f"fs sandbox helper timed out after {timeout:g}s and was killed"
                ) from None
            clean = True
            return reply
        finally:
            await self._end(call, clean=clean)

    async def _end(self, call: _Call, *, clean: bool) -> None:
        """Release a call; unless it ended with a reply, kill and reap its child and
        remove the temp file a writeFile child may have been killed with."""
        call.sock.close()
        call.z.pending.pop(call.req_id, None)
        p = call.p
        try:
            if not clean:
                dead = await self._kill_and_reap(p)
                if call.temp is not None:
                    if dead:
                        await remove_temp(*call.temp)
                    elif p.pidfd is not None:
                        _remove_temp_once_dead(p.pidfd, *call.temp)
        finally:
            if p.pidfd is not None:
                os.close(p.pidfd)
                p.pidfd = None

    def _finished(self, task: asyncio.Task[tuple[dict[str, object], bytes]]) -> None:
        self._finishing.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # Its caller may be gone: the failure is only logged.
            logger.debug("fs sandbox call ended: %s", task.exception())

    async def _kill_and_reap(self, p: _Pending) -> bool:
        """SIGKILL a child and wait (bounded) until it is dead; False if it may still run."""
        if not p.started.done():
            with contextlib.suppress(TimeoutError, HelperFailure):
                async with asyncio.timeout(_REAP_TIMEOUT):
                    await p.started
        if p.pid is None:
            # Never forked, or the zygote died before telling us the pid (its
            # children die with it: PDEATHSIG).
            return True
        _kill(p)
        try:
            async with asyncio.timeout(_REAP_TIMEOUT):
                await p.exited
        except TimeoutError:
            return False
        except HelperFailure:
            # The zygote is gone (it kills its children on its way out): the pidfd
            # tells when this one is.
            return p.pidfd is None or await _exited(p.pidfd, _REAP_TIMEOUT)
        return True

    async def _read_reply(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        p: _Pending,
    ) -> tuple[dict[str, object], bytes]:
        prefix = await _recv_exact(loop, sock, FRAME.size)
        if prefix is None:
            raise await self._crashed(p)
        hlen, dlen = FRAME.unpack(prefix)
        if hlen > _MAX_REPLY_HEADER or dlen > MAX_DATA:
            raise HelperFailure("failed to encode or decode fs sandbox helper message: bad frame")
        raw = await _recv_exact(loop, sock, hlen)
        if raw is None:
            raise await self._crashed(p)
        try:
            header = json.loads(raw)
        except ValueError as exc:
            raise HelperFailure(
                f"failed to encode or decode fs sandbox helper message: {exc}"
            ) from None
        if not isinstance(header, dict) or header.get("status") not in ("ok", "error"):
            raise HelperFailure(
                "failed to encode or decode fs sandbox helper message: not a reply object"
            )
        result = header.get("result")
        if header["status"] == "ok" and isinstance(result, dict) and result.get("passed_fd"):
            # fs/open: one more byte carries the descriptor the child opened.
            fd = await _recv_fd(loop, sock)
            if fd is None:
                raise await self._crashed(p)
            result["passed_fd"] = fd
            return header, b""
        data = await _recv_exact(loop, sock, dlen)
        if data is None:
            raise await self._crashed(p)
        return header, data

    async def _crashed(self, p: _Pending) -> HelperFailure:
        try:
            async with asyncio.timeout(_REAP_TIMEOUT):
                await p.started
                status = await p.exited
        except TimeoutError:
            return HelperFailure("fs sandbox helper closed its reply without answering")
        except HelperFailure as exc:
            return HelperFailure(f"fs sandbox helper failed: {exc}")
        return HelperFailure(f"fs sandbox helper failed with status {describe_wait_status(status)}")


def _kill_launches(z: _Process) -> None:
    """Kill the groups of a zygote's launches: one outliving its zygote is unobservable."""
    for pid, p in z.by_pid.items():
        if p.group:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)


def _kill_launch(started: asyncio.Future[tuple[int, int]]) -> None:
    """Kill the group of a launch whose caller went away before it was started."""
    if started.cancelled() or started.exception() is not None:
        return
    pid, pidfd = started.result()
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
    os.close(pidfd)


async def _exit_status(p: _Pending) -> int:
    """A launch's raw wait status; -1 when its zygote died first (unobservable)."""
    try:
        return await p.exited
    except HelperFailure:
        return -1


_shared: Zygote | None = None


def shared_zygote() -> Zygote:
    """The process's helper zygote, shared by the sandboxed filesystem and launches."""
    global _shared
    if _shared is None:
        _shared = Zygote()
    return _shared


def new_temp_token() -> str:
    """A fresh token for a writeFile's temp file name (``helper.ops.temp_name``)."""
    return os.urandom(6).hex()


def remove_temp_file(directory: str, name: str) -> None:
    """Remove the temp file ``name`` a killed writeFile helper may have left in ``directory``.

    Only a regular file, only that entry (``unlinkat`` never follows a symlink),
    and only if ``directory`` still resolves to itself (the real path the helper
    verified): a component swapped for a symlink since is not followed elsewhere.
    The name carries the server's random token and exists only while a helper
    puts its finished file in place, so nothing else can be there.
    """
    try:
        fd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        if os.readlink(f"/proc/self/fd/{fd}") != directory:
            return
        if stat.S_ISREG(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
            os.unlink(name, dir_fd=fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_temp(header: Mapping[str, object]) -> tuple[str, str] | None:
    """Where a writeFile request's child names its finished file before it takes the
    path's place: (the real parent the server checked, the temp name of its ``tmp``
    token). A child killed (timeout, cancelled caller) or crashed in that instant
    leaves the name behind; :func:`remove_temp` removes it once the child is dead."""
    path, expect, token = header.get("path"), header.get("expect"), header.get("tmp")
    if isinstance(path, str) and isinstance(expect, str) and isinstance(token, str):
        return expect, temp_name(os.path.basename(path), token)
    return None


async def remove_temp(directory: str, name: str) -> None:
    """:func:`remove_temp_file` in a worker (the directory may be on a hung mount)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(_REAP_TIMEOUT):
            await shared_pool().run(remove_temp_file, directory, name)


def _remove_temp_once_dead(pidfd: int, directory: str, name: str) -> None:
    """Remove the temp file once the child of ``pidfd`` (still running after SIGKILL,
    e.g. in a write to a hung mount) is gone."""
    loop = asyncio.get_running_loop()
    fd = os.dup(pidfd)

    def gone() -> None:
        loop.remove_reader(fd)
        os.close(fd)
        shared_pool().submit(lambda _result, _error: None, remove_temp_file, directory, name)

    loop.add_reader(fd, gone)


async def _exited(pidfd: int, timeout: float) -> bool:  # noqa: ASYNC109
    """Whether the process of ``pidfd`` ends within ``timeout`` (its pidfd turns readable)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(pidfd, readable)
    try:
        async with asyncio.timeout(timeout):
            await done
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(pidfd)
    return True


def _kill(p: _Pending) -> None:
    if p.pidfd is not None:
        with contextlib.suppress(ProcessLookupError, OSError):
            signal.pidfd_send_signal(p.pidfd, signal.SIGKILL)


async def _recv_exact(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, size: int
) -> bytes | None:
    """Receive exactly ``size`` bytes; None on a premature EOF."""
    buf = bytearray(size)
    got = 0
    with memoryview(buf) as view:
        while got < size:
            try:
                n = await loop.sock_recv_into(sock, view[got:])
            except (ConnectionResetError, BrokenPipeError):
                return None
            if n == 0:
                return None
            got += n
    return bytes(buf)


async def _recv_fd(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> int | None:
    """The descriptor sent with the next byte (``SCM_RIGHTS``); None on EOF or without one.
    Descriptors still in the socket when it is closed (a cancelled caller) are closed
    by the kernel."""
    while True:
        try:
            msg, anc, _flags, _addr = sock.recvmsg(
                1, socket.CMSG_SPACE(4), socket.MSG_CMSG_CLOEXEC
            )
            break
        except BlockingIOError:
            ready = loop.create_future()
            loop.add_reader(sock.fileno(), ready.set_result, None)
            try:
                await ready
            finally:
                loop.remove_reader(sock.fileno())
        except (ConnectionResetError, BrokenPipeError):
            return None
    fds = fds_from_anc(anc)
    if not msg or not fds:
        for fd in fds:
            os.close(fd)
        return None
    for extra in fds[1:]:
        os.close(extra)
    return fds[0]
