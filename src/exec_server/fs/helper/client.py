"""Client of the helper zygote (``main.py``): confined fs calls and Landlock launches.

The server is multi-threaded and must never fork itself to confine a child
(SANDBOX.md §0.3); one small single-threaded ``python -I -S`` zygote forks a child
per request instead (docs/sandboxed-fs.md). It starts lazily on the loop of its first
use, restarts when it dies and closes when its last owner releases it.
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
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from exec_server.fs.direct import Payload, Pieces
from exec_server.fs.fdops import temp_name
from exec_server.fs.helper.main import EXIT, ID, ID_PID, MAX_REQUEST, fds_from_anc, rights
from exec_server.fs.helper.ops import FRAME, MAX_DATA, encode_frame
from exec_server.fs.pool import shared_pool
from exec_server.process.spec import LaunchServiceUnavailable, ServicedChild
from exec_server.sandbox.linux.spawn_zygote_main import REQUEST_HEADER

__all__ = [
    "HelperFailure",
    "SpawnRequest",
    "Zygote",
    "ZygoteUnavailable",
    "describe_wait_status",
    "remove_temp",
    "remove_temp_file",
    "shared_zygote",
    "write_temp",
]

logger = logging.getLogger("exec_server.fs.sandbox")

_MAX_REPLY_HEADER: Final = 64 * 1024 * 1024
_MAIN: Final = os.path.join(os.path.dirname(os.path.abspath(__file__)), "main.py")
#: payloads up to this size are sent together with their frame header (one wake-up).
_COALESCE: Final = 256 * 1024
#: seconds for the zygote's ready message, a killed child's reaping, a launch's report.
_START_TIMEOUT: Final = 10.0
_REAP_TIMEOUT: Final = 5.0
_SPAWN_TIMEOUT: Final = 5.0
_MAX_START_FAILURES: Final = 3
_CLOSED: Final = "the helper zygote was closed"
_BAD_FRAME: Final = "failed to encode or decode fs sandbox helper message"
#: a child of these with its whole request finishes when its caller stops waiting,
#: as a cancelled direct call's worker does.
_FINISH_WHEN_CANCELLED: Final = frozenset({"fs/writeFile"})


class ZygoteUnavailable(Exception):
    """The zygote could not be started (or Landlock is missing); use another path."""


class HelperFailure(Exception):
    """A child crashed, hung, or answered something that is not a reply frame."""


class _NoChild(HelperFailure):
    def __init__(self, err: int) -> None:
        super().__init__(f"cannot fork a sandbox helper: {os.strerror(err)}")
        self.errno = err


class _NotForked(Exception):
    """The request never reached a child (the zygote was gone): safe to retry."""


def describe_wait_status(status: int) -> str:
    """Like Rust's ``ExitStatus`` Display: ``exit status: 1`` / ``signal: 9 (SIGKILL)``."""
    if not os.WIFSIGNALED(status):
        return f"exit status: {os.waitstatus_to_exitcode(status)}"
    sig = os.WTERMSIG(status)
    try:
        return f"signal: {sig} ({signal.Signals(sig).name})"
    except ValueError:
        return f"signal: {sig}"


@dataclass(frozen=True, slots=True)
class SpawnRequest:
    """One Landlock launch: launcher flags (``--status-fd 3 ... -- CMD...``), the complete
    environment, the checked cwd and the status pipe's write end (the caller closes it)."""

    args: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    status_fd: int


@dataclass(eq=False, slots=True)
class _Pending:
    """One request's child: pid and pidfd once started, wait status once reaped."""

    req_id: int
    started: asyncio.Future[tuple[int, int]]
    exited: asyncio.Future[int]
    pid: int | None = None
    pidfd: int | None = None
    #: a launch: its process group is killed if the zygote dies first.
    group: bool = False
    #: an fs call's socket, and the (directory, name) a killed writeFile child may leave.
    sock: socket.socket | None = None
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
    #: resolves when the full control socket has room again (fs senders wait on it).
    writable: asyncio.Future[None] | None = None


class Zygote:
    """A lazily started helper zygote; implements ``process.spec.LaunchService``.
    ``test_hooks``: fs requests may carry ``test_hook`` and ``test_pause`` (tests);
    ``prefork``: keep a child of each kind forked ahead of time."""

    def __init__(
        self, *, python: str | None = None, test_hooks: bool = False, prefork: bool = True
    ) -> None:
        self._python = python or sys.executable
        self._flags = [*(["--test-hooks"] if test_hooks else ()),
                       *(["--no-prefork"] if not prefork else ())]
        self._z: _Process | None = None
        self._next_id = 0
        self._failures = 0
        self._unavailable: str | None = (
            None if sys.platform.startswith("linux") else "the helper zygote needs Linux"
        )
        self._owners: dict[int, object] = {}
        self._closing: set[asyncio.Task[None]] = set()
        #: calls whose caller went away while their child finishes.
        self._finishing: set[asyncio.Task[tuple[object, bytes]]] = set()
        #: launches started through the zygote (tests, diagnostics).
        self.spawned = 0

    @property
    def pid(self) -> int | None:
        """The ready zygote's pid, else None (also when it belongs to another loop)."""
        z = self._z
        if z is None or z.dead or not z.ready.done() or z.ready.exception() is not None:
            return None
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return z.popen.pid
        return z.popen.pid if loop is z.loop else None

    def __repr__(self) -> str:
        return f"<Zygote pid={self.pid} owners={len(self._owners)}>"

    async def ensure_started(self, owner: object = None) -> _Process:
        """Start (or restart) the zygote for ``owner`` and wait until it is ready;
        ``ZygoteUnavailable`` when it cannot start or the kernel lacks Landlock."""
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
        """Close (it kills its children's groups) and reap the zygote; a later use restarts."""
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
        """Wait for the calls whose callers stopped waiting (answered, or killed and reaped)."""
        while self._finishing:
            await asyncio.gather(*self._finishing, return_exceptions=True)

    def _current(self, loop: asyncio.AbstractEventLoop) -> _Process | None:
        """The zygote of ``loop``, starting one when there is none (None: cannot start)."""
        z = self._z
        if z is not None and z.loop is not loop:
            # Another (probably finished) loop's zygote: it and its owners are stale.
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
        try:
            with contextlib.suppress(OSError):
                ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_REQUEST * 2)
            popen = subprocess.Popen(
                [self._python, "-I", "-S", "-B", _MAIN, "--zygote", str(theirs.fileno()),
                 str(os.getpid()), *self._flags],
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
        loop.call_later(_START_TIMEOUT, self._start_timed_out, z)
        return z

    def _failed_start(self, why: str) -> None:
        self._failures += 1
        logger.warning("%s", why)
        if self._failures >= _MAX_START_FAILURES:
            self._unavailable = f"the helper zygote failed to start {self._failures} times"

    def _start_timed_out(self, z: _Process) -> None:
        if not z.ready.done():
            self._retire(z, "the helper zygote did not report ready in time")

    def _kill_sync(self, z: _Process) -> None:
        """Tear down a zygote whose loop is gone (no awaiting possible)."""
        z.dead = True
        with contextlib.suppress(Exception):
            z.loop.remove_reader(z.ctl.fileno())
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
        try:
            pidfd = os.pidfd_open(z.popen.pid)
        except OSError:
            pidfd = -1
        try:
            if pidfd >= 0 and not await _exited(pidfd, _REAP_TIMEOUT):
                logger.warning("helper zygote %d did not exit; killing it", z.popen.pid)
        finally:
            if pidfd >= 0:
                os.close(pidfd)
            if z.popen.poll() is None:
                # Timed out, cancelled (loop ending) or no pidfd: SIGKILL ends it at once.
                with contextlib.suppress(OSError):
                    z.popen.kill()
                z.popen.wait()

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
            kind, body = msg[:1], msg[1:]
            if kind == b"P" and len(body) == ID_PID.size and len(fds) == 1:
                req_id, pid = ID_PID.unpack(body)
                p = z.pending.get(req_id)
                if p is not None and not p.started.done():
                    p.pid, p.pidfd = pid, fds.pop()
                    z.by_pid[pid] = p
                    p.started.set_result((pid, p.pidfd))
            for fd in fds:
                os.close(fd)
            if not msg:
                self._retire(z, "the helper zygote exited")
            elif kind == b"X" and len(body) == EXIT.size:
                pid, status = EXIT.unpack(body)
                p = z.by_pid.pop(pid, None)
                if p is not None and not p.exited.done():
                    p.exited.set_result(status)
            elif kind == b"E" and len(body) == ID_PID.size:
                req_id, err = ID_PID.unpack(body)
                p = z.pending.get(req_id)
                if p is not None and not p.started.done():
                    p.started.set_exception(_NoChild(err))
            elif kind == b"R" and not z.ready.done():
                z.abi = int(json.loads(body).get("abi", 0))
                self._failures = 0
                z.ready.set_result(None)
                logger.debug("helper zygote %d ready, Landlock ABI %d", z.popen.pid, z.abi)

    def _pending(self, z: _Process, *, group: bool = False) -> _Pending:
        self._next_id += 1
        p = _Pending(self._next_id, z.loop.create_future(), z.loop.create_future(), group=group)
        z.pending[p.req_id] = p
        return p

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
        if z is None or not z.ready.done() or z.abi <= 0:
            raise LaunchServiceUnavailable("the helper zygote is not ready")
        # As the launcher path (Popen's cwd) would; in a worker: a hung mount.
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
        p = self._pending(z, group=True)
        # ASCII JSON: surrogates travel escaped.
        raw = b"S" + REQUEST_HEADER.pack(p.req_id, tty, stdin is not None and not tty) + body
        try:
            try:
                z.ctl.sendmsg([raw], rights(fds))
            except (BlockingIOError, InterruptedError) as exc:
                raise LaunchServiceUnavailable("the helper zygote is busy") from exc
            except OSError as exc:
                if exc.errno in (errno.EMSGSIZE, errno.ENOBUFS, errno.ENOMEM):
                    raise LaunchServiceUnavailable(f"helper zygote request: {exc}") from exc
                # Not delivered (EPIPE/ECONNRESET): nothing was started.
                self._retire(z, f"cannot reach the helper zygote: {exc}")
                raise LaunchServiceUnavailable("the helper zygote is gone") from exc
            try:
                async with asyncio.timeout(_SPAWN_TIMEOUT):
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
            z.pending.pop(p.req_id, None)
        os.close(pidfd)
        p.pidfd = None
        self.spawned += 1
        return ServicedChild(pid=pid, wait=lambda: _exit_status(p))

    async def run(
        self,
        header: dict[str, object],
        data: Payload = b"",
        *,
        timeout: float,  # noqa: ASYNC109
        owner: object = None,
    ) -> tuple[object, bytes]:
        """Run one request in a fresh confined child: its decoded reply header and payload.
        On return or raise the child has replied, or was killed and reaped (``Pieces`` are
        sent as made; if making one raises, the child never has them all).
        ``ZygoteUnavailable``: no zygote here; ``HelperFailure``: it crashed, hung, babbled."""
        try:
            return await self._run_once(header, data, timeout, owner)
        except _NotForked:
            # The zygote died before it could fork: nothing ran, one retry is safe.
            return await self._run_once(header, data, timeout, owner)

    async def _run_once(
        self,
        header: dict[str, object],
        data: Payload,
        timeout: float,  # noqa: ASYNC109
        owner: object,
    ) -> tuple[object, bytes]:
        z = await self.ensure_started(owner)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        p = self._pending(z)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        p.sock, p.temp = ours, write_temp(header)
        try:
            ours.setblocking(False)
            raw = json.dumps(header).encode()
            try:
                async with asyncio.timeout_at(deadline):
                    try:
                        await self._send_control(z, b"F" + ID.pack(p.req_id), theirs.fileno())
                    finally:
                        theirs.close()
                    # The frame goes into the socket buffer while the zygote forks.
                    await _send(loop, ours, raw, data)
            except TimeoutError:
                raise _timed_out(timeout) from None
        except BaseException:
            # The child does not have its whole request yet: it did nothing; kill it.
            await self._end(z, p, clean=False)
            raise
        receive = self._receive(z, p, deadline, timeout)
        if header.get("op") not in _FINISH_WHEN_CANCELLED:
            return await receive
        # The child has everything: it finishes even if our caller stops waiting.
        task = loop.create_task(receive)
        self._finishing.add(task)
        task.add_done_callback(self._finished)
        return await asyncio.shield(task)

    async def _send_control(self, z: _Process, msg: bytes, fd: int) -> None:
        """Send an ``F`` request, waiting out a full control socket."""
        while not z.dead:
            try:
                z.ctl.sendmsg([msg], rights([fd]))
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

    async def _receive(
        self, z: _Process, p: _Pending, deadline: float, timeout: float  # noqa: ASYNC109
    ) -> tuple[object, bytes]:
        assert p.sock is not None
        clean = False
        try:
            async with asyncio.timeout_at(deadline):
                reply = await _read_reply(asyncio.get_running_loop(), p.sock, p)
            clean = True
            return reply
        except TimeoutError:
            raise _timed_out(timeout) from None
        finally:
            await self._end(z, p, clean=clean)

    async def _end(self, z: _Process, p: _Pending, *, clean: bool) -> None:
        """Release a call; without a reply, kill and reap its child and remove its temp file."""
        if p.sock is not None:
            p.sock.close()
        z.pending.pop(p.req_id, None)
        try:
            if not clean:
                dead = await _kill_and_reap(p)
                if p.temp is not None:
                    if dead:
                        await remove_temp(*p.temp)
                    elif p.pidfd is not None:
                        _remove_temp_once_dead(p.pidfd, *p.temp)
        finally:
            if p.pidfd is not None:
                os.close(p.pidfd)
                p.pidfd = None

    def _finished(self, task: asyncio.Task[tuple[object, bytes]]) -> None:
        self._finishing.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.debug("fs sandbox call ended: %s", task.exception())


def _timed_out(timeout: float) -> HelperFailure:
    return HelperFailure(f"fs sandbox helper timed out after {timeout:g}s and was killed")


async def _send(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, raw: bytes, data: Payload
) -> None:
    try:
        if isinstance(data, Pieces):
            await loop.sock_sendall(sock, encode_frame(raw, data.size))
            # Each piece is decoded here, on the loop (~1 ms per MiB of text).
            sent = 0
            for piece in data.produce():
                await loop.sock_sendall(sock, piece)
                sent += len(piece)
            if sent != data.size:  # the child would wait for the rest
                raise HelperFailure(f"fs sandbox payload was {sent} bytes, not {data.size}")
        elif len(data) <= _COALESCE:
            await loop.sock_sendall(sock, encode_frame(raw, len(data)) + data)
        else:
            await loop.sock_sendall(sock, encode_frame(raw, len(data)))
            await loop.sock_sendall(sock, data)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the child died early; reading the reply reports how


async def _read_reply(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, p: _Pending
) -> tuple[object, bytes]:
    """One reply frame; its header's shape is the caller's to check (``fs.confined``)."""
    try:
        hlen, dlen = FRAME.unpack(await _recv_exact(loop, sock, FRAME.size))
        if hlen > _MAX_REPLY_HEADER or dlen > MAX_DATA:
            raise HelperFailure(f"{_BAD_FRAME}: bad frame")
        raw = await _recv_exact(loop, sock, hlen)
        try:
            header = json.loads(raw)
        except ValueError as exc:
            raise HelperFailure(f"{_BAD_FRAME}: {exc}") from None
        ok = isinstance(header, dict) and header.get("status") == "ok"
        result = header.get("result") if ok else None
        if isinstance(result, dict) and result.get("passed_fd"):
            # fs/open: one more byte carries the descriptor the child opened.
            result["passed_fd"] = await _recv_fd(sock)
            return header, b""
        return header, await _recv_exact(loop, sock, dlen)
    except EOFError:
        raise await _crashed(p) from None


async def _crashed(p: _Pending) -> HelperFailure:
    try:
        async with asyncio.timeout(_REAP_TIMEOUT):
            await p.started
            status = await p.exited
    except TimeoutError:
        return HelperFailure("fs sandbox helper closed its reply without answering")
    except HelperFailure as exc:
        return HelperFailure(f"fs sandbox helper failed: {exc}")
    return HelperFailure(f"fs sandbox helper failed with status {describe_wait_status(status)}")


async def _kill_and_reap(p: _Pending) -> bool:
    """SIGKILL a child, wait (bounded) until it is dead; False if it may still run."""
    if not p.started.done():
        with contextlib.suppress(TimeoutError, HelperFailure):
            async with asyncio.timeout(_REAP_TIMEOUT):
                await p.started
    if p.pid is None:
        # Never forked, or its zygote died first (its children die with it: PDEATHSIG).
        return True
    if p.pidfd is not None:
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(p.pidfd, signal.SIGKILL)
    try:
        async with asyncio.timeout(_REAP_TIMEOUT):
            await p.exited
    except TimeoutError:
        return False
    except HelperFailure:
        # The zygote is gone (killing its children): the pidfd tells when this one is.
        return p.pidfd is None or await _exited(p.pidfd, _REAP_TIMEOUT)
    return True


def _killpg(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)


def _kill_launches(z: _Process) -> None:
    """Kill the groups of a zygote's launches: one outliving its zygote is unobservable."""
    for pid, p in z.by_pid.items():
        if p.group:
            _killpg(pid)


def _kill_launch(started: asyncio.Future[tuple[int, int]]) -> None:
    """Kill the group of a launch whose caller went away before it was started."""
    if started.cancelled() or started.exception() is not None:
        return
    pid, pidfd = started.result()
    _killpg(pid)
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


def remove_temp_file(directory: str, name: str) -> None:
    """Remove the temp file a killed writeFile helper may have left: only a regular file
    (``unlinkat`` follows no link), only if ``directory`` is still the real path the
    helper verified. The name carries the server's random token: nothing else is there."""
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
    """(the checked real parent, the temp name) a writeFile request's child gives its file
    just before it takes the path's place; a child killed in that instant leaves it."""
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
    """Remove the temp file once the child (alive after SIGKILL: a hung mount) is gone."""
    loop = asyncio.get_running_loop()
    fd = os.dup(pidfd)

    def gone() -> None:
        loop.remove_reader(fd)
        os.close(fd)
        shared_pool().submit(lambda _result, _error: None, remove_temp_file, directory, name)

    loop.add_reader(fd, gone)


async def _readable(fd: int) -> None:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


async def _exited(pidfd: int, timeout: float) -> bool:  # noqa: ASYNC109
    """Whether the process of ``pidfd`` ends within ``timeout`` (its pidfd turns readable)."""
    try:
        async with asyncio.timeout(timeout):
            await _readable(pidfd)
    except TimeoutError:
        return False
    return True


async def _recv_exact(loop: asyncio.AbstractEventLoop, sock: socket.socket, size: int) -> bytes:
    """Receive exactly ``size`` bytes; EOFError on a premature end."""
    buf = bytearray(size)
    got = 0
    with memoryview(buf) as view:
        while got < size:
            try:
                n = await loop.sock_recv_into(sock, view[got:])
            except (ConnectionResetError, BrokenPipeError):
                n = 0
            if n == 0:
                raise EOFError
            got += n
    return bytes(buf)


async def _recv_fd(sock: socket.socket) -> int:
    """The descriptor sent with the next byte (``SCM_RIGHTS``); EOFError on EOF or without
    one (the kernel closes those left in a socket closed by a cancelled caller)."""
    while True:
        try:
            msg, anc, _flags, _addr = sock.recvmsg(1, socket.CMSG_SPACE(4), socket.MSG_CMSG_CLOEXEC)
            break
        except BlockingIOError:
            await _readable(sock.fileno())
        except (ConnectionResetError, BrokenPipeError):
            raise EOFError from None
    fds = fds_from_anc(anc)
    for fd in fds[1:] if msg else fds:
        os.close(fd)
    if not msg or not fds:
        raise EOFError
    return fds[0]
