"""Server side of the fs zygote: start it lazily, fork confined children, read replies.

The server is multi-threaded and must never fork itself to confine a child
(SANDBOX.md §0.3). Instead one small single-threaded ``python -I -S`` process
(``zygote_main.py``) is started once and forks one child per request; each child
applies Landlock + seccomp for its own request and exits after replying.

Per request the server creates a ``SOCK_STREAM`` socketpair, hands one end to
the zygote over the ``SOCK_SEQPACKET`` control socket (``SCM_RIGHTS``), gets
back the child's pid and a pidfd, streams the request frame (raw bytes, no
base64) and reads the reply frame until complete. A hang is bounded by the
caller's timeout (the child is ``SIGKILL``ed through its pidfd), an early EOF
or an undecodable frame becomes ``HelperFailure`` with the exit status the
zygote reports, and a dead zygote is restarted on the next request. A writeFile
whose caller goes away once its child has the whole request is finished in the
background (:meth:`Zygote.drain`), and the temp file name of a writeFile child
that died is removed (:func:`remove_temp_file`; docs/sandboxed-fs.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Final

from exec_server.fs.ops import Payload, Pieces, ReceiveInto
from exec_server.fs.workers import shared_pool
from exec_server.fs.zygote_ops import encode_frame, temp_name
from exec_server.sandbox.linux.zygote_base import fds_from_anc

__all__ = [
    "HelperFailure",
    "Zygote",
    "ZygoteUnavailable",
    "describe_wait_status",
    "new_temp_token",
    "remove_temp_file",
    "remove_write_temp",
]

logger = logging.getLogger("exec_server.fs.sandbox")

_ID: Final = struct.Struct("!Q")
_PID: Final = struct.Struct("!i")
_EXIT: Final = struct.Struct("!ii")
_FRAME: Final = struct.Struct("!IQ")
_MAX_REPLY_HEADER: Final = 64 * 1024 * 1024
_MAX_REPLY_DATA: Final = 1024 * 1024 * 1024
_FS_DIR: Final = os.path.dirname(os.path.abspath(__file__))
#: payloads up to this size are sent together with their frame header.
_COALESCE: Final = 256 * 1024
#: how long to wait for the zygote to report a killed child as reaped.
_REAP_TIMEOUT: Final = 5.0
#: operations whose child, once it has the whole request, is not killed when the
#: caller stops waiting: it finishes in the background within the call's timeout,
#: as a cancelled direct call's worker thread does (docs/sandboxed-fs.md).
_FINISH_WHEN_CANCELLED: Final = frozenset({"fs/writeFile"})


class ZygoteUnavailable(Exception):
    """The zygote could not be started (or Landlock is missing); use another path."""


class HelperFailure(Exception):
    """A child crashed, hung, or answered something that is not a reply frame."""


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


@dataclass(eq=False, slots=True)
class _Pending:
    started: asyncio.Future[tuple[int, int]]
    exited: asyncio.Future[int]
    pid: int | None = None
    pidfd: int | None = None


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
    proc: asyncio.subprocess.Process
    ctl: socket.socket
    abi: int
    pending: dict[int, _Pending] = field(default_factory=dict)
    by_pid: dict[int, _Pending] = field(default_factory=dict)
    dead: bool = False


class Zygote:
    """A lazily started fs zygote. Not thread-safe; use from one event loop.

    Args:
        start_timeout: seconds to wait for the zygote's ready message.
        test_hooks: let requests carry ``test_hook`` (crash/garbage/hang/short) and
            ``test_pause`` (``zygote_main.Zygote._arm_pause``) for tests.
        prefork: keep one child forked ahead of time (takes the fork off the
            request's critical path).
    """

    def __init__(
        self, *, start_timeout: float = 10.0, test_hooks: bool = False, prefork: bool = True
    ) -> None:
        self._prefork = prefork
        self._start_timeout = start_timeout
        self._test_hooks = test_hooks
        self._z: _Process | None = None
        self._lock = asyncio.Lock()
        self._next_id = 0
        self._closed = False
        self._unavailable: str | None = None
        #: calls whose caller went away while their child finishes (``_FINISH_WHEN_CANCELLED``).
        self._finishing: set[asyncio.Task[tuple[dict[str, object], bytes]]] = set()

    @property
    def pid(self) -> int | None:
        """The running zygote's pid (for tests and diagnostics)."""
        return None if self._z is None or self._z.dead else self._z.proc.pid

    @property
    def abi(self) -> int:
        """Landlock ABI the zygote probed (0 before start)."""
        return 0 if self._z is None else self._z.abi

    def __repr__(self) -> str:
        return f"<Zygote pid={self.pid} abi={self.abi} closed={self._closed}>"

    # ------------------------------------------------------------------ lifecycle

    async def ensure_started(self) -> None:
        """Start (or restart) the zygote if needed.

        Raises:
            ZygoteUnavailable: it cannot start, or the kernel lacks Landlock.
        """
        if self._closed:
            raise ZygoteUnavailable("the filesystem sandbox is shut down")
        if self._z is not None and not self._z.dead:
            return
        async with self._lock:
            if self._z is not None and not self._z.dead:
                return
            if not sys.platform.startswith("linux"):
                self._unavailable = "the fs zygote needs Linux (Landlock)"
            if self._unavailable is not None:
                raise ZygoteUnavailable(self._unavailable)
            if self._z is not None:
                await self._reap(self._z)
                self._z = None
            self._z = await self._spawn()

    async def _spawn(self) -> _Process:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            argv = [
                sys.executable,
                "-I",
                "-S",
                "-B",
                os.path.join(_FS_DIR, "zygote_main.py"),
                _FS_DIR,
                str(theirs.fileno()),
                str(os.getpid()),
            ]
            if self._test_hooks:
                argv.append("--test-hooks")
            if not self._prefork:
                argv.append("--no-prefork")
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
                env={},
                cwd="/",
            )
        except OSError as exc:
            ours.close()
            raise ZygoteUnavailable(f"cannot start the fs zygote: {exc}") from exc
        finally:
            theirs.close()
        ours.setblocking(False)
        try:
            async with asyncio.timeout(self._start_timeout):
                msg = await loop.sock_recv(ours, 4096)
        except (TimeoutError, OSError) as exc:
            ours.close()
            proc.kill()
            await proc.wait()
            raise ZygoteUnavailable(f"the fs zygote did not start: {exc!r}") from exc
        if msg[:1] != b"R":
            ours.close()
            proc.kill()
            await proc.wait()
            raise ZygoteUnavailable(f"the fs zygote did not start (exit {proc.returncode})")
        info = json.loads(msg[1:])
        z = _Process(proc=proc, ctl=ours, abi=int(info.get("abi", 0)))
        if z.abi <= 0:
            self._unavailable = "Landlock is not available in this kernel"
            await self._shutdown(z)
            raise ZygoteUnavailable(self._unavailable)
        loop.add_reader(ours.fileno(), self._on_control, z)
        logger.debug("fs zygote started: pid %d, Landlock ABI %d", proc.pid, z.abi)
        return z

    async def aclose(self) -> None:
        """Kill every child and the zygote, and reap them. Idempotent."""
        self._closed = True
        z, self._z = self._z, None
        if z is not None:
            await self._shutdown(z)
        await self.drain()

    async def drain(self) -> None:
        """Wait until the calls whose callers stopped waiting have finished: their
        children answered, or were killed at the timeout and reaped, and their temp
        files removed."""
        while self._finishing:
            await asyncio.gather(*self._finishing, return_exceptions=True)

    async def _shutdown(self, z: _Process) -> None:
        for p in list(z.pending.values()):
            _kill(p)
        self._mark_dead(z, "the filesystem sandbox is shutting down")
        await self._reap(z)

    async def _reap(self, z: _Process) -> None:
        try:
            async with asyncio.timeout(5):
                await z.proc.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                z.proc.kill()
            await z.proc.wait()

    def _mark_dead(self, z: _Process, why: str) -> None:
        if z.dead:
            return
        z.dead = True
        with contextlib.suppress(ValueError, OSError):
            asyncio.get_running_loop().remove_reader(z.ctl.fileno())
        z.ctl.close()
        for p in z.pending.values():
            for fut in (p.started, p.exited):
                if not fut.done():
                    fut.set_exception(HelperFailure(why))
                    fut.exception()  # mark retrieved: nobody may be waiting
        if not self._closed:
            logger.warning("fs zygote %d exited: %s", z.proc.pid, why)

    # ------------------------------------------------------------------ control socket

    def _on_control(self, z: _Process) -> None:
        while not z.dead:
            try:
                msg, anc, _flags, _addr = z.ctl.recvmsg(64, socket.CMSG_SPACE(16))
            except BlockingIOError:
                return
            except OSError as exc:
                self._mark_dead(z, f"control socket error: {exc}")
                return
            fds = fds_from_anc(anc)
            if not msg:
                for fd in fds:
                    os.close(fd)
                self._mark_dead(z, "the fs zygote exited")
                return
            kind = msg[:1]
            if kind == b"P" and len(msg) == 1 + _ID.size + _PID.size and len(fds) == 1:
                (req_id,) = _ID.unpack(msg[1 : 1 + _ID.size])
                (pid,) = _PID.unpack(msg[1 + _ID.size :])
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
            elif kind == b"E" and len(msg) == 1 + _ID.size + _PID.size:
                (req_id,) = _ID.unpack(msg[1 : 1 + _ID.size])
                (err,) = _PID.unpack(msg[1 + _ID.size :])
                p = z.pending.get(req_id)
                if p is not None and not p.started.done():
                    p.started.set_exception(
                        HelperFailure(f"cannot fork fs sandbox helper: {os.strerror(err)}")
                    )

    # ------------------------------------------------------------------ requests

    async def run(
        self,
        header: dict[str, object],
        data: Payload = b"",
        *,
        timeout: float,  # noqa: ASYNC109
        into: ReceiveInto | None = None,
    ) -> tuple[dict[str, object], bytes]:
        """Run one request in a fresh confined child.

        When this returns or raises, the child has replied and exits on its
        own, or it has been killed and reaped (bounded wait).

        Args:
            header: the request header (``zygote_ops.OpRequest`` fields + ``plan``).
            data: raw payload (writeFile contents); :class:`~exec_server.fs.ops.Pieces`
                are sent as they are made, and if making one raises, the child is
                killed before it has all the data (it writes nothing) and the
                error propagates.
            timeout: seconds before the child is killed.
            into: for a successful reply's payload of ``n`` bytes, ``into(n)`` may
                give a buffer of exactly ``n`` bytes to receive it in (the payload
                returned is then empty); None receives it into new bytes.

        Returns:
            The reply header (``status`` ok/error …) and the raw reply payload.

        Raises:
            ZygoteUnavailable: no zygote can run here.
            HelperFailure: the child crashed, hung or sent garbage.
        """
        try:
            return await self._run_once(header, data, timeout, into)
        except _NotForked:
            # The zygote died before it could fork: nothing ran, so one retry
            # on a fresh zygote is safe.
            return await self._run_once(header, data, timeout, into)

    async def _run_once(
        self,
        header: dict[str, object],
        data: Payload,
        timeout: float,  # noqa: ASYNC109
        into: ReceiveInto | None,
    ) -> tuple[dict[str, object], bytes]:
        await self.ensure_started()
        z = self._z
        assert z is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        self._next_id += 1
        req_id = self._next_id
        p = _Pending(started=loop.create_future(), exited=loop.create_future())
        z.pending[req_id] = p
        temp = None
        op = header.get("op")
        path, expect = header.get("path"), header.get("expect")
        if op == "fs/writeFile" and isinstance(path, str) and isinstance(expect, str):
            token = new_temp_token()
            header = {**header, "tmp": token}
            temp = _temp_file(path, expect, token)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        call = _Call(z, req_id, p, ours, temp)
        try:
            ours.setblocking(False)
            try:
                z.ctl.sendmsg(
                    [b"F" + _ID.pack(req_id)],
                    [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", theirs.fileno()))],
                )
            except OSError as exc:
                self._mark_dead(z, f"cannot reach the fs zygote: {exc}")
                raise _NotForked from exc
            finally:
                theirs.close()
            raw = json.dumps(header).encode()
            try:
                async with asyncio.timeout_at(deadline):
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
        receive = self._receive(call, into, deadline, timeout)
        if op not in _FINISH_WHEN_CANCELLED:
            return await receive
        # The child has everything it needs: if our caller stops waiting, it is not
        # killed half way but finishes in the background (``drain``).
        task = loop.create_task(receive)
        self._finishing.add(task)
        task.add_done_callback(self._finished)
        return await asyncio.shield(task)

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
        into: ReceiveInto | None,
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
                    reply = await self._read_reply(loop, call.sock, call.p, into)
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
                        await _remove_temp(*call.temp)
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
        into: ReceiveInto | None,
    ) -> tuple[dict[str, object], bytes]:
        prefix = await _recv_exact(loop, sock, _FRAME.size)
        if prefix is None:
            raise await self._crashed(p)
        hlen, dlen = _FRAME.unpack(prefix)
        if hlen > _MAX_REPLY_HEADER or dlen > _MAX_REPLY_DATA:
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
        view = into(dlen) if into is not None and dlen and header["status"] == "ok" else None
        if view is not None:
            if len(view) != dlen:
                raise ValueError(f"a buffer of {len(view)} bytes for a payload of {dlen}")
            if not await _recv_exact_into(loop, sock, view):
                raise await self._crashed(p)
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


def new_temp_token() -> str:
    """A fresh token for a writeFile's temp file name (``zygote_ops.temp_name``)."""
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


def _temp_file(path: str, expect: str, token: str) -> tuple[str, str]:
    return expect, temp_name(os.path.basename(path), token)


async def remove_write_temp(path: str, expect: str, token: str) -> None:
    """Remove what a writeFile helper given ``tmp=token`` for the check path ``path``
    (whose real parent is ``expect``) may have left, once it is dead: a helper
    killed (timeout, cancelled caller) or crashed while it put its file in place
    leaves its temp file's name (``zygote_ops._write_atomic``)."""
    await _remove_temp(*_temp_file(path, expect, token))


async def _remove_temp(directory: str, name: str) -> None:
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
    if size == 0:
        return b""
    buf = bytearray(size)
    with memoryview(buf) as view:
        whole = await _recv_exact_into(loop, sock, view)
    return bytes(buf) if whole else None


async def _recv_exact_into(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, view: memoryview
) -> bool:
    """Fill ``view`` from ``sock``; False on a premature EOF."""
    size = len(view)
    got = 0
    while got < size:
        try:
            n = await loop.sock_recv_into(sock, view[got:])
        except (ConnectionResetError, BrokenPipeError):
            return False
        if n == 0:
            return False
        got += n
    return True


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
