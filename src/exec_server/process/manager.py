"""Per-session process table: start, read, write, terminate, signal, notifications.

One :class:`ProcessManager` per session (PROTOCOL.md §8). Each running process
has three owned tasks: one capture loop per output fd and an exit watcher
(pidfd). Every event (output chunk, exit, close) takes the next seq of the
process's :class:`OutputBuffer` and is then sent through the sink, all under a
per-process lock so notifications leave in seq order; awaiting the sink is
the backpressure path (a slow client slows the child). ``closed`` is recorded
only after the exit status was reaped *and* every output stream hit EOF.

Termination (issue 2 overrides §8.6): SIGTERM to the process group, then
SIGKILL after ``terminate_grace``; the exit code stays observable (143/137).
An unsandboxed child's descendants outside its group (``setsid``, double
forks: ``process.tree``) get the same signals; a sandboxed one's die with its
PID namespace.

Why one module of ~700 lines: the record's capture, exit, close, stdin and
retention paths share one lock and one set of invariants (close last, seq
order); spawning (``pipes``/``pty``) and the event buffer (``output``) are
already apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal as _signal
import subprocess
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from typing import Final, Protocol

import msgspec

from exec_server.exceptions import (
    InternalError,
    InvalidParamsError,
    InvalidRequestError,
    os_error_message,
)
from exec_server.fs.workers import shared_pool
from exec_server.process import tree
from exec_server.process.output import RETAINED_OUTPUT_CAP, OutputBuffer
from exec_server.process.pipes import (
    ProcessGuard,
    SpawnedChild,
    close_quietly,
    spawn_may_block,
    spawn_pipes,
    spawn_via_service,
)
from exec_server.process.pty import set_window_size, spawn_pty
from exec_server.process.spec import ExitStatus, LaunchService, LaunchSpec
from exec_server.protocol.process_types import (
    NOTIFY_CLOSED,
    NOTIFY_EXITED,
    NOTIFY_OUTPUT,
    ClosedNotification,
    ExitedNotification,
    OutputNotification,
    ProcessStream,
    ReadResult,
    WriteStatus,
)
from exec_server.sandbox.plan import SandboxType

__all__ = [
    "DEFAULT_READ_SIZE",
    "DEFAULT_TERMINATE_GRACE",
    "WRITE_QUEUE_BYTES",
    "WRITE_QUEUE_DEPTH",
    "NotificationSink",
    "NotificationSinkNowait",
    "ProcessManager",
    "exit_status_from_wait",
    "looks_sandbox_denied",
]

logger = logging.getLogger("exec_server.process")

#: ``await sink(method, params)`` delivers one notification (awaiting = backpressure).
#: It returns False when the message did not reach a live transport (the
#: connection is closing or gone): lossless mode then keeps the chunk. ``None``
#: (a sink that cannot tell) counts as delivered.
NotificationSink = Callable[[str, msgspec.Struct], Awaitable[bool | None]]
#: ``sink_nowait(method, params)`` sends at once if the connection can take it
#: without waiting: True/False as for the sink; None = nothing sent, use the sink.
NotificationSinkNowait = Callable[[str, msgspec.Struct], bool | None]

#: Bytes per ``os.read`` of a child's output: one read = one chunk. Upstream reads 8 KiB
#: (§8.3); larger reads let a fast writer cost fewer notifications.
DEFAULT_READ_SIZE: Final = 131072
#: Seconds between SIGTERM and SIGKILL on ``process/terminate``.
DEFAULT_TERMINATE_GRACE: Final = 2.0
#: Pending stdin writes per process before ``write`` waits (§14).
WRITE_QUEUE_DEPTH: Final = 128
#: Bytes queued for a child's stdin before ``write`` waits. The count alone let
#: 128 writes of 4 MiB to a child that never reads hold 512 MiB; 16 MiB still
#: keeps several MiB-sized writes queued, so a child that reads fast never waits
#: for the client's next round trip. A bigger single write is taken whole
#: once the queue is empty (it could never be written otherwise).
WRITE_QUEUE_BYTES: Final = 16 << 20
#: Remembered ``writeId`` values per process (CLIENT_COMPAT.md §5.1).
WRITE_ID_MEMORY: Final = 4096
#: Seconds a failed sandboxed process's output may drain before sandboxDenied is decided.
DENIAL_DRAIN_WAIT: Final = 0.25
#: Reads per readable callback before other ready callbacks get a turn.
READS_PER_WAKEUP: Final = 16
#: Seconds without a running process before the process guard is closed.
GUARD_IDLE_LINGER: Final = 1.0
#: Seconds ``shutdown`` waits for killed children to be reaped.
SHUTDOWN_REAP_TIMEOUT: Final = 5.0

_DENIAL_WORDS: Final = (
    "operation not permitted",
    "permission denied",
    "read-only file system",
    "seccomp",
    "sandbox",
    "landlock",
    "failed to write file",
)


class ProcessConfig(Protocol):
    """The parts of ``ServerConfig`` the manager reads."""

    @property
    def closed_retention(self) -> float: ...
    @property
    def output_cap(self) -> int: ...
    @property
    def lossless_output(self) -> bool: ...


def exit_status_from_wait(status: int) -> ExitStatus:
    """``waitpid`` status → exit code (``128 + signal`` for signal deaths)."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return ExitStatus(128 + sig, sig)
    if os.WIFEXITED(status):
        return ExitStatus(os.WEXITSTATUS(status))
    return ExitStatus(-1)


def looks_sandbox_denied(sandbox_type: SandboxType, exit_code: int, output: bytes) -> bool:
    """Upstream's denial heuristic (CLIENT_COMPAT.md §5.2)."""
    if sandbox_type is SandboxType.NONE or exit_code == 0:
        return False
    text = output.decode("utf-8", "replace").lower()
    if any(word in text for word in _DENIAL_WORDS):
        return True
    if exit_code in (2, 126, 127):
        return False
    return sandbox_type is SandboxType.LINUX_SECCOMP and exit_code == 128 + 31


class _Record:
    """One entry of the process table (a starting placeholder until ``child`` is set)."""

    __slots__ = (
        "buffer",
        "captures",
        "child",
        "current",
        "emit_lock",
        "eof_waiters",
        "open_streams",
        "process_id",
        "reaped",
        "removal",
        "sandbox_denied",
        "sandbox_type",
        "space_waiters",
        "spec",
        "stdin_eof",
        "stdin_fd",
        "stop_reading",
        "strays",
        "tasks",
        "terminate_timer",
        "terminating",
        "waiters",
        "write_ids",
        "write_queue",
        "write_queued",
        "write_space",
        "writer_armed",
    )

    def __init__(self, process_id: str, buffer: OutputBuffer, current: bool) -> None:
        self.process_id = process_id
        self.buffer = buffer
        self.current = current
        self.child: SpawnedChild | None = None
        self.spec: LaunchSpec | None = None
        self.sandbox_type = SandboxType.NONE
        self.sandbox_denied = False
        self.emit_lock = asyncio.Lock()
        self.open_streams = 2
        self.waiters: list[asyncio.Future[None]] = []
        self.space_waiters: list[asyncio.Future[None]] = []
        self.eof_waiters: list[asyncio.Future[None]] = []
        self.captures: list[_Capture] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.stdin_fd: int | None = None
        #: ``process/closeStdin`` arrived: close stdin once the queue is written.
        self.stdin_eof = False
        self.write_queue: deque[memoryview] = deque()
        #: bytes in ``write_queue`` (what :data:`WRITE_QUEUE_BYTES` bounds).
        self.write_queued = 0
        self.write_space: list[asyncio.Future[None]] = []
        self.writer_armed = False
        self.write_ids: OrderedDict[str, None] = OrderedDict()
        self.reaped = False
        self.terminating = False
        self.terminate_timer: asyncio.TimerHandle | None = None
        self.removal: asyncio.TimerHandle | None = None
        self.stop_reading = False
        #: pidfds of descendants outside the group that a terminate signalled.
        self.strays: list[int] = []

    @property
    def starting(self) -> bool:
        return self.child is None

    def __repr__(self) -> str:
        pid = self.child.pid if self.child else None
        return f"<Process {self.process_id!r} pid={pid} {self.buffer!r}>"


class _Capture:
    """One output fd being read: its reader callback's hand-off to the capture task.

    The reader stays installed while the callback can handle the fd on its
    own (read, record, send without waiting). Anything else - EOF, a full
    lossless buffer, a sink that must be awaited, an emit in progress - disarms
    the reader and wakes the task, which re-arms it when done.
    """

    __slots__ = ("armed", "eof", "fd", "pending", "stream", "wake")

    def __init__(self, stream: ProcessStream, fd: int) -> None:
        self.stream = stream
        self.fd = fd
        self.armed = False
        self.eof = False
        #: bytes read but not yet recorded (the task records and sends them).
        self.pending: bytes | None = None
        self.wake: asyncio.Future[None] | None = None


def _wake(futures: list[asyncio.Future[None]]) -> None:
    for fut in futures:
        if not fut.done():
            fut.set_result(None)
    futures.clear()


def _set_if_pending(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _spawn(spec: LaunchSpec) -> SpawnedChild:
    return spawn_pty(spec) if spec.tty else spawn_pipes(spec)


def _spawn_error(exc: BaseException) -> BaseException:
    """What a failed spawn raises: the OS text as an internal error (§8.1)."""
    if isinstance(exc, OSError):
        return InternalError(os_error_message(exc))
    if isinstance(exc, subprocess.SubprocessError | ValueError):
        return InternalError(f"failed to start process: {exc}")
    return exc


class ProcessManager:
    """All processes of one session.

    Args:
        config: retention, output cap and lossless mode (``ServerConfig``).
        terminate_grace: seconds between SIGTERM and SIGKILL on terminate.
        read_size: bytes per read of a child's output (one chunk each).
    """

    def __init__(
        self,
        config: ProcessConfig,
        *,
        terminate_grace: float = DEFAULT_TERMINATE_GRACE,
        read_size: int = DEFAULT_READ_SIZE,
    ) -> None:
        self._config = config
        self._retention = float(getattr(config, "closed_retention", 30.0))
        self._cap = int(getattr(config, "output_cap", RETAINED_OUTPUT_CAP))
        self._lossless = bool(getattr(config, "lossless_output", False))
        # Launches a sandbox backend marked for a launch service (the Landlock
        # spawn zygote) go through it unless the config turns that off.
        self._use_services = bool(getattr(config, "launch_zygote", True))
        self._services: dict[int, LaunchService] = {}
        self._grace = terminate_grace
        self._read_size = read_size
        self._records: dict[str, _Record] = {}
        self._sink: NotificationSink | None = None
        self._sink_nowait: NotificationSinkNowait | None = None
        self._closed = False
        self._guard = ProcessGuard()
        self._guard_timer: asyncio.TimerHandle | None = None
        self._aux_tasks: set[asyncio.Task[None]] = set()

    # -- sink ----------------------------------------------------------------------

    def set_sink(
        self, sink: NotificationSink | None, nowait: NotificationSinkNowait | None = None
    ) -> None:
        """Attach (or with ``None`` detach) the notification receiver.

        ``nowait``, when given, lets output be read and sent straight from the
        fd's reader callback (no task wake-up per chunk).
        """
        self._sink = sink
        self._sink_nowait = nowait if sink is not None else None

    async def _notify(self, method: str, params: msgspec.Struct) -> bool:
        sink = self._sink
        if sink is None:
            return False
        try:
            handed_over = await sink(method, params)
        except asyncio.CancelledError:
            raise
        except Exception:  # a dead connection must not kill capture (§8.3: failures ignored)
            logger.debug("dropping %s notification: sink failed", method, exc_info=True)
            return False
        # Detached while the send was pending: the old connection's sink may
        # have written into a transport that is going away; not delivered.
        return handed_over is not False and self._sink is sink

    # -- queries ---------------------------------------------------------------------

    def __contains__(self, process_id: object) -> bool:
        return process_id in self._records

    def __len__(self) -> int:
        return len(self._records)

    def process_ids(self) -> list[str]:
        return list(self._records)

    def pid_of(self, process_id: str) -> int | None:
        """OS pid of a running record (tests and diagnostics)."""
        rec = self._records.get(process_id)
        return rec.child.pid if rec is not None and rec.child is not None else None

    # -- start -------------------------------------------------------------------------

    def start(self, process_id: str, spec: LaunchSpec, *, current: bool = False) -> None:
        """Spawn ``spec`` as ``process_id`` and start capturing it.

        ``current`` selects the current client's notification shapes
        (``sandboxDenied``). Always consumes ``spec.pass_fds`` (closed here)
        and runs ``spec.cleanup`` once the child is gone or failed to start.

        Raises:
            InvalidRequestError: ``process <id> already exists``.
            InternalError: spawn failure with the OS text.
        """
        loop = asyncio.get_running_loop()
        rec, _ = self._begin(process_id, spec, current)
        child = self._spawn_or_forget(rec, spec)
        self._attach(rec, child, spec, loop)

    async def start_async(
        self, process_id: str, spec: LaunchSpec, *, current: bool = False
    ) -> None:
        """:meth:`start`, but a spawn that could wait on a filesystem runs in a worker
        thread, the process "starting" meanwhile.

        Why: the spawning thread waits until the child has changed to its cwd and
        exec'd its program (``vfork``); with either on a hung network or FUSE mount
        that was the event loop, and every connection stalled. Spawns whose cwd and
        program the dentry cache resolves on local filesystems
        (:mod:`exec_server.fs.nonblocking`) stay on the loop; a launch service's
        start (the helper zygote) is awaited.
        """
        if spec.zygote is None and not spawn_may_block(spec):
            self.start(process_id, spec, current=current)
            return
        loop = asyncio.get_running_loop()
        rec, owner = self._begin(process_id, spec, current)
        try:
            child = await spawn_via_service(spec, owner)
            if child is None:
                child = await shared_pool().run(_spawn, spec)
        except BaseException as exc:
            self._forget(rec, spec)
            raise _spawn_error(exc) from exc
        if self._closed:  # shut down meanwhile: nobody will capture it
            await self._abandon(child)
            self._discard_launch(spec)
            raise InternalError("failed to start process: the server is shutting down")
        self._attach(rec, child, spec, loop)

    def _begin(
        self, process_id: str, spec: LaunchSpec, current: bool
    ) -> tuple[_Record, object | None]:
        if process_id in self._records:
            self._discard_launch(spec)
            raise InvalidRequestError(f"process {process_id} already exists")
        rec = _Record(process_id, OutputBuffer(self._cap, lossless=self._lossless), current)
        self._records[process_id] = rec
        owner: object | None = None
        if spec.zygote is not None and self._use_services:
            owner = self
            self._services[id(spec.zygote.service)] = spec.zygote.service
        return rec, owner

    def _spawn_or_forget(self, rec: _Record, spec: LaunchSpec) -> SpawnedChild:
        """Spawn; on failure forget ``rec``, discard the launch and raise InternalError."""
        try:
            return _spawn(spec)
        except BaseException as exc:
            self._forget(rec, spec)
            raise _spawn_error(exc) from exc

    def _forget(self, rec: _Record, spec: LaunchSpec) -> None:
        if self._records.get(rec.process_id) is rec:
            del self._records[rec.process_id]
        self._discard_launch(spec)

    def _attach(
        self,
        rec: _Record,
        child: SpawnedChild,
        spec: LaunchSpec,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        for fd in spec.pass_fds:
            close_quietly(fd)
        self._guard.add(child.pid)
        if self._guard_timer is not None:
            self._guard_timer.cancel()
            self._guard_timer = None
        rec.child = child
        rec.spec = spec
        rec.sandbox_type = spec.sandbox_type
        rec.stdin_fd = child.stdin_fd
        rec.open_streams = 2
        if len(child.outputs) == 1:
            rec.open_streams = 1  # PTY: the empty stderr channel ends at once (§8.3)
        for stream, fd in child.outputs:
            self._spawn_task(rec, self._capture(rec, stream, fd), loop)
        self._spawn_task(rec, self._watch_exit(rec, child), loop)

    @staticmethod
    async def _abandon(child: SpawnedChild) -> None:
        """Kill and reap a child no record will own (spawned while shutting down)."""
        with contextlib.suppress(OSError):
            os.killpg(child.pid, _signal.SIGKILL)
        for _, fd in child.outputs:
            close_quietly(fd)
        close_quietly(child.stdin_fd)
        for fd in child.extra_fds:
            close_quietly(fd)
        if child.popen is not None:
            await shared_pool().run(child.popen.wait)

    @staticmethod
    def _discard_launch(spec: LaunchSpec) -> None:
        for fd in spec.pass_fds:
            close_quietly(fd)
        if spec.cleanup is not None:
            try:
                spec.cleanup()
            except Exception:
                logger.exception("launch cleanup failed")

    def _spawn_task(
        self,
        rec: _Record,
        coro: Awaitable[None],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        task: asyncio.Task[None] = loop.create_task(coro)  # type: ignore[arg-type]
        rec.tasks.add(task)
        task.add_done_callback(rec.tasks.discard)

    # -- capture -----------------------------------------------------------------------

    async def _wait_space(self, rec: _Record) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        rec.space_waiters.append(fut)
        await fut

    async def _capture(self, rec: _Record, stream: ProcessStream, fd: int) -> None:
        """Own one output fd: the slow path behind :meth:`_on_readable`, then EOF and close."""
        loop = asyncio.get_running_loop()
        cap = _Capture(stream, fd)
        rec.captures.append(cap)
        buffer = rec.buffer
        try:
            while True:
                data = cap.pending
                if data is not None:
                    cap.pending = None
                    await self._emit_output(rec, stream, data)
                if cap.eof or rec.stop_reading:
                    break
                if buffer.full:
                    await self._wait_space(rec)
                    continue
                cap.wake = loop.create_future()
                cap.armed = True
                loop.add_reader(fd, self._on_readable, rec, cap)
                try:
                    await cap.wake
                finally:
                    cap.wake = None
                    if cap.armed:
                        cap.armed = False
                        loop.remove_reader(fd)
        finally:
            rec.captures.remove(cap)
            close_quietly(fd)
        rec.open_streams -= 1
        if rec.open_streams <= 0:
            _wake(rec.eof_waiters)
        await self._maybe_close(rec)

    def _on_readable(self, rec: _Record, cap: _Capture) -> None:
        """Reader callback: read, record and send output without a task hop.

        Everything here is synchronous, so a chunk's seq and its notification
        cannot interleave with another event's; when that cannot be done
        without waiting, the capture task takes over (``_hand_off``).
        """
        buffer = rec.buffer
        for _ in range(READS_PER_WAKEUP):
            if rec.stop_reading or buffer.full or rec.emit_lock.locked():
                break
            try:
                data = os.read(cap.fd, self._read_size)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno != errno.EIO:  # EIO on a PTY master = every slave closed
                    logger.debug("read of %r failed", rec, exc_info=True)
                cap.eof = True
                break
            if not data:
                cap.eof = True
                break
            if self._sink is not None:
                nowait = self._sink_nowait
                if nowait is None:
                    cap.pending = data
                    break
                delivered = nowait(
                    NOTIFY_OUTPUT,
                    OutputNotification(
                        process_id=rec.process_id,
                        seq=buffer.next_seq,
                        stream=cap.stream,
                        chunk=data,
                    ),
                )
                if delivered is None:  # nothing sent: the task awaits the sink
                    cap.pending = data
                    break
                chunk = buffer.append(cap.stream, data)
                if delivered and self._lossless:
                    buffer.mark_notified(chunk.seq)
                    _wake(rec.space_waiters)
            else:
                buffer.append(cap.stream, data)
            _wake(rec.waiters)
            if len(data) < self._read_size:
                return  # drained for now (saves the EAGAIN read); stay armed
        else:
            return  # more may be ready: stay armed, other callbacks run first
        self._hand_off(cap)

    @staticmethod
    def _hand_off(cap: _Capture) -> None:
        if cap.armed:
            cap.armed = False
            asyncio.get_running_loop().remove_reader(cap.fd)
        if cap.wake is not None:
            _set_if_pending(cap.wake)

    async def _emit_output(self, rec: _Record, stream: ProcessStream, data: bytes) -> None:
        async with rec.emit_lock:
            chunk = rec.buffer.append(stream, data)
            _wake(rec.waiters)
            delivered = await self._notify(
                NOTIFY_OUTPUT,
                OutputNotification(
                    process_id=rec.process_id, seq=chunk.seq, stream=stream, chunk=data
                ),
            )
            if delivered and self._lossless:
                rec.buffer.mark_notified(chunk.seq)
                _wake(rec.space_waiters)

    # -- exit --------------------------------------------------------------------------

    async def _reap(self, pid: int) -> int:
        """Wait for ``pid`` to exit and reap it; returns the raw wait status (-1: unknown)."""
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            pidfd = -1
        if pidfd >= 0:
            loop = asyncio.get_running_loop()
            fut: asyncio.Future[None] = loop.create_future()
            loop.add_reader(pidfd, _set_if_pending, fut)
            try:
                await fut
            finally:
                loop.remove_reader(pidfd)
                os.close(pidfd)
            try:
                # The pidfd is readable: the child is a zombie, so this returns at once.
                _, status = os.waitpid(pid, os.WNOHANG)  # noqa: ASYNC222
            except ChildProcessError:
                return -1
            return status
        try:
            _, status = await asyncio.to_thread(os.waitpid, pid, 0)
        except ChildProcessError:
            return -1
        return status

    async def _watch_exit(self, rec: _Record, child: SpawnedChild) -> None:
        if child.exit_status is not None:
            status = await child.exit_status()  # reaped by its real parent (a launch service)
        else:
            status = await self._reap(child.pid)
        rec.reaped = True
        code = -1 if status == -1 else exit_status_from_wait(status).code
        if child.popen is not None:
            child.popen.returncode = code
        if rec.spec is not None and rec.spec.cleanup is not None:
            try:
                rec.spec.cleanup()
            except Exception:
                logger.exception("launch cleanup of %r failed", rec)
        if rec.sandbox_type is not SandboxType.NONE and code != 0:
            # The denial message is usually still in the pipe: let capture drain it.
            if rec.open_streams > 0:
                fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                rec.eof_waiters.append(fut)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(DENIAL_DRAIN_WAIT):
                        await fut
            rec.sandbox_denied = looks_sandbox_denied(rec.sandbox_type, code, self._text_of(rec))
        async with rec.emit_lock:
            seq = rec.buffer.record_exit(code)
            _wake(rec.waiters)
            await self._notify(
                NOTIFY_EXITED,
                ExitedNotification(
                    process_id=rec.process_id,
                    seq=seq,
                    exit_code=code,
                    sandbox_denied=rec.sandbox_denied if rec.current else msgspec.UNSET,
                ),
            )
        if rec.terminating and rec.open_streams > 0:
            # Escaped group members may hold the pipes: stop reading after a grace.
            asyncio.get_running_loop().call_later(self._grace, self._force_eof, rec)
        await self._maybe_close(rec)

    @staticmethod
    def _text_of(rec: _Record) -> bytes:
        chunks, _ = rec.buffer.snapshot(0, None)
        return b"".join(c.chunk for c in chunks)

    async def _maybe_close(self, rec: _Record) -> None:
        async with rec.emit_lock:
            buffer = rec.buffer
            if buffer.closed or rec.open_streams > 0 or buffer.exit_code is None:
                return
            seq = buffer.record_close()
            _wake(rec.waiters)
            self._close_stdin(rec)
            if rec.child is not None:
                self._release_guard(rec.child.pid)
            if rec.terminate_timer is not None:
                rec.terminate_timer.cancel()
                rec.terminate_timer = None
            if rec.strays:
                # the command is done; what it left outside its group still gets the
                # rest of its grace period, then SIGKILL
                asyncio.get_running_loop().call_later(self._grace, self._kill_strays, rec)
            if not self._closed:
                rec.removal = asyncio.get_running_loop().call_later(
                    self._retention, self._remove_if_closed, rec
                )
            closed = ClosedNotification(process_id=rec.process_id, seq=seq)
            await self._notify(NOTIFY_CLOSED, closed)

    def _remove_if_closed(self, rec: _Record) -> None:
        if self._records.get(rec.process_id) is rec and rec.buffer.closed:
            del self._records[rec.process_id]
            _wake(rec.waiters)

    def _force_eof(self, rec: _Record) -> None:
        if rec.open_streams <= 0:
            return
        rec.stop_reading = True
        for cap in list(rec.captures):
            self._hand_off(cap)
        _wake(rec.space_waiters)

    def _release_guard(self, pid: int) -> None:
        self._guard.discard(pid)
        if self._guard.idle and self._guard_timer is None and not self._closed:
            self._guard_timer = asyncio.get_running_loop().call_later(
                GUARD_IDLE_LINGER, self._close_idle_guard
            )

    def _close_idle_guard(self) -> None:
        self._guard_timer = None
        if not self._guard.idle:
            return
        popen = self._guard.close()
        if popen is not None:
            task = asyncio.get_running_loop().create_task(self._reap_guard(popen))
            self._aux_tasks.add(task)
            task.add_done_callback(self._aux_tasks.discard)

    async def _reap_guard(self, popen: subprocess.Popen[bytes]) -> None:
        status = await self._reap(popen.pid)
        popen.returncode = -1 if status == -1 else exit_status_from_wait(status).code

    # -- read ----------------------------------------------------------------------------

    def _lookup(self, process_id: str) -> _Record:
        rec = self._records.get(process_id)
        if rec is None:
            raise InvalidRequestError(f"unknown process id {process_id}")
        if rec.starting:
            raise InvalidRequestError(f"process id {process_id} is starting")
        return rec

    async def read(
        self,
        process_id: str,
        *,
        after_seq: int = 0,
        max_bytes: int | None = None,
        wait_ms: int = 0,
    ) -> ReadResult:
        """``process/read`` (§8.4): a snapshot now, or when something new arrives by ``wait_ms``.

        Raises:
            InvalidRequestError: unknown or still-starting process.
        """
        rec = self._lookup(process_id)
        buffer = rec.buffer
        if buffer.lossless and after_seq > 0:
            buffer.mark_delivered(after_seq)
            _wake(rec.space_waiters)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(wait_ms, 0) / 1000.0
        while True:
            taken, next_seq = buffer.snapshot(after_seq, max_bytes)
            if buffer.ready(after_seq, taken) or loop.time() >= deadline:
                break
            fut: asyncio.Future[None] = loop.create_future()
            rec.waiters.append(fut)
            try:
                async with asyncio.timeout_at(deadline):
                    await fut
            except TimeoutError:
                pass
            finally:
                if not fut.done():
                    fut.cancel()
                    with contextlib.suppress(ValueError):
                        rec.waiters.remove(fut)
        return ReadResult(
            chunks=taken,
            next_seq=next_seq,
            exited=buffer.exit_code is not None,
            exit_code=buffer.exit_code,
            closed=buffer.closed,
            failure=None,
            sandbox_denied=rec.sandbox_denied if rec.current else msgspec.UNSET,
        )

    # -- write -------------------------------------------------------------------------

    async def write(self, process_id: str, data: bytes, write_id: str | None = None) -> WriteStatus:
        """``process/write`` (§8.5, CLIENT_COMPAT §5.1): queue ``data`` for the child's stdin.

        Waits while the child's stdin queue is full (backpressure): it holds
        :data:`WRITE_QUEUE_DEPTH` writes or, with ``data``, would hold more
        than :data:`WRITE_QUEUE_BYTES` (a bigger write waits for an empty
        queue). The wait ends when the child reads, its stdin closes (exit,
        session shutdown), or the caller is cancelled (the connection went
        away): ``data`` is then not queued and ``write_id`` not remembered,
        so a retry with the same id still writes.
        """
        status = self.write_now(process_id, data, write_id)
        if status is not None:
            return status
        rec = self._records[process_id]
        loop = asyncio.get_running_loop()
        while rec.stdin_fd is not None and self._stdin_full(rec, len(data)):
            fut: asyncio.Future[None] = loop.create_future()
            rec.write_space.append(fut)
            try:
                await fut
            finally:
                if not fut.done():  # cancelled: leave no dead future behind
                    fut.cancel()
                    with contextlib.suppress(ValueError):
                        rec.write_space.remove(fut)
        self._remember_write_id(rec, write_id)
        if rec.stdin_fd is not None:
            self._enqueue(rec, data)
        return WriteStatus.ACCEPTED

    def write_now(
        self, process_id: str, data: bytes, write_id: str | None = None
    ) -> WriteStatus | None:
        """:meth:`write` without waiting: None, having done nothing, when it would wait."""
        rec = self._records.get(process_id)
        if rec is None:
            return WriteStatus.UNKNOWN_PROCESS
        if rec.starting or rec.child is None:
            return WriteStatus.STARTING
        if rec.child.stdin_fd is None:
            return WriteStatus.STDIN_CLOSED
        if write_id is not None and write_id in rec.write_ids:
            return WriteStatus.ACCEPTED
        if rec.stdin_fd is not None and data and self._stdin_full(rec, len(data)):
            return None
        self._remember_write_id(rec, write_id)
        if rec.stdin_fd is not None and data:
            self._enqueue(rec, data)
        # else exited/closed: accepted and dropped (observed upstream)
        return WriteStatus.ACCEPTED

    @staticmethod
    def _stdin_full(rec: _Record, size: int) -> bool:
        """Must a write of ``size`` bytes wait for the child to read?"""
        queued = rec.write_queued
        return len(rec.write_queue) >= WRITE_QUEUE_DEPTH or (
            queued > 0 and queued + size > WRITE_QUEUE_BYTES
        )

    @staticmethod
    def _remember_write_id(rec: _Record, write_id: str | None) -> None:
        if write_id is not None:
            rec.write_ids[write_id] = None
            if len(rec.write_ids) > WRITE_ID_MEMORY:
                rec.write_ids.popitem(last=False)

    def _enqueue(self, rec: _Record, data: bytes) -> None:
        rec.write_queue.append(memoryview(data))
        rec.write_queued += len(data)
        self._flush_stdin(rec)
        # A terminal echoes the input during write(2): send the echo now, before
        # the reply, instead of one loop iteration later.
        for cap in rec.captures:
            if cap.armed and cap.stream is ProcessStream.PTY:
                self._on_readable(rec, cap)

    def _flush_stdin(self, rec: _Record) -> None:
        fd = rec.stdin_fd
        queue = rec.write_queue
        queued = rec.write_queued
        while queue and fd is not None:
            head = queue[0]
            try:
                n = os.write(fd, head)
            except BlockingIOError:
                if not rec.writer_armed:
                    asyncio.get_running_loop().add_writer(fd, self._flush_stdin, rec)
                    rec.writer_armed = True
                if rec.write_queued < queued:
                    _wake(rec.write_space)  # room for a waiting write, perhaps
                return
            except OSError:
                # EPIPE/EIO: the child stopped reading; upstream ignores write errors.
                queue.clear()
                rec.write_queued = 0
                break
            rec.write_queued -= n
            if n < len(head):
                queue[0] = head[n:]
            else:
                queue.popleft()
        if rec.writer_armed and fd is not None:
            asyncio.get_running_loop().remove_writer(fd)
            rec.writer_armed = False
        _wake(rec.write_space)
        if rec.stdin_eof and not queue:
            self._close_stdin(rec)

    def close_stdin(self, process_id: str) -> None:
        """``process/closeStdin`` (extension): end of input for a ``pipeStdin`` child.

        Queued writes are delivered first; the pipe closes once they are.
        Nothing happens for a PTY (its end of input is the EOF character) or
        a child without a stdin pipe.

        Raises:
            InvalidRequestError: no such process.
        """
        rec = self._known(process_id)
        if rec.child is None or rec.spec is None or rec.spec.tty or rec.stdin_fd is None:
            return
        rec.stdin_eof = True
        self._flush_stdin(rec)

    def resize(self, process_id: str, rows: int, columns: int) -> None:
        """``process/resizePty`` (extension): set a PTY child's window size.

        The kernel sends SIGWINCH to the terminal's foreground group. A
        process that already exited is a no-op.

        Raises:
            InvalidRequestError: no such process.
            InvalidParamsError: it is not on a PTY.
        """
        rec = self._known(process_id)
        if rec.spec is not None and not rec.spec.tty:
            raise InvalidParamsError(f"process {process_id} has no PTY")
        fd = rec.stdin_fd
        if fd is None or rec.buffer.closed:
            return
        with contextlib.suppress(OSError):  # EIO/EBADF: the terminal is gone
            set_window_size(fd, rows, columns)

    def _known(self, process_id: str) -> _Record:
        rec = self._records.get(process_id)
        if rec is None:
            raise InvalidRequestError(f"unknown process id {process_id}")
        return rec

    def _close_stdin(self, rec: _Record) -> None:
        fd = rec.stdin_fd
        if fd is None:
            return
        if rec.writer_armed:
            asyncio.get_running_loop().remove_writer(fd)
            rec.writer_armed = False
        rec.stdin_fd = None
        rec.write_queue.clear()
        rec.write_queued = 0
        close_quietly(fd)
        _wake(rec.write_space)

    # -- terminate / signal ------------------------------------------------------------

    def terminate(self, process_id: str) -> bool:
        """``process/terminate``: True when a running process was asked to stop."""
        rec = self._records.get(process_id)
        if rec is None or rec.child is None:
            return False
        if rec.buffer.exit_code is not None:
            # Exited, but members of its group (a background job) may still hold
            # its output open: end them too. It is not running (§8.6: false).
            if not rec.buffer.closed and not rec.terminating:
                rec.terminating = True
                self._kill_group(rec, _signal.SIGTERM)
                rec.terminate_timer = asyncio.get_running_loop().call_later(
                    self._grace, self._escalate, rec
                )
            return False
        if not rec.terminating:
            rec.terminating = True
            if self._owns_tree(rec):
                assert rec.child is not None
                rec.strays = tree.open_pidfds(
                    tree.descendants(rec.child.pid, skip_group=rec.child.pid))
            self._kill_group(rec, _signal.SIGTERM)
            tree.signal_pidfds(rec.strays, _signal.SIGTERM)
            rec.terminate_timer = asyncio.get_running_loop().call_later(
                self._grace, self._escalate, rec
            )
        return True

    def _escalate(self, rec: _Record) -> None:
        rec.terminate_timer = None
        if rec.buffer.closed:
            return
        self._kill_tree(rec)
        if rec.reaped:
            asyncio.get_running_loop().call_later(self._grace, self._force_eof, rec)

    def signal(self, process_id: str, sig: _signal.Signals = _signal.SIGINT) -> None:
        """``process/signal``: deliver ``sig`` to the group; no-op when gone."""
        rec = self._records.get(process_id)
        if rec is None or rec.child is None or rec.buffer.closed:
            return
        if rec.reaped and rec.open_streams <= 0:
            return
        self._kill_group(rec, sig)

    @staticmethod
    def _owns_tree(rec: _Record) -> bool:
        """Unsandboxed and still running: its subreaper child holds its whole tree."""
        return rec.sandbox_type is SandboxType.NONE and rec.child is not None and not rec.reaped

    def _kill_tree(self, rec: _Record) -> None:
        """SIGKILL the group, every descendant of an unsandboxed child and earlier strays."""
        if self._owns_tree(rec):
            assert rec.child is not None
            tree.kill_tree(rec.child.pid, skip_group=rec.child.pid)
        self._kill_group(rec, _signal.SIGKILL)
        self._kill_strays(rec)

    @staticmethod
    def _kill_strays(rec: _Record) -> None:
        """SIGKILL what a terminate signalled outside the group, and let go of it."""
        strays, rec.strays = rec.strays, []
        tree.signal_pidfds(strays, _signal.SIGKILL)
        for fd in strays:
            close_quietly(fd)

    @staticmethod
    def _kill_group(rec: _Record, sig: _signal.Signals) -> None:
        if rec.child is None:
            return
        # A reaped leader's group id stays reserved while members live (no reuse).
        try:
            os.killpg(rec.child.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            logger.debug("killpg(%d) not permitted", rec.child.pid)

    # -- shutdown ------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """Kill every process group, reap every child, close every fd; clear the table (§8.11)."""
        self._closed = True
        self._sink = None
        records = list(self._records.values())
        self._records.clear()
        for rec in records:
            if rec.removal is not None:
                rec.removal.cancel()
            if rec.terminate_timer is not None:
                rec.terminate_timer.cancel()
            if rec.child is not None and not rec.buffer.closed:
                self._kill_tree(rec)
                rec.stop_reading = True
            self._kill_strays(rec)
        tasks = [t for rec in records for t in rec.tasks]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=SHUTDOWN_REAP_TIMEOUT)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        for rec in records:
            self._close_stdin(rec)
            _wake(rec.waiters)
        if self._guard_timer is not None:
            self._guard_timer.cancel()
            self._guard_timer = None
        guard = self._guard.close()
        if guard is not None:
            await self._reap_guard(guard)
        if self._aux_tasks:
            await asyncio.wait(list(self._aux_tasks))
        services = list(self._services.values())
        self._services.clear()
        for service in services:
            try:
                await service.release(self)
            except Exception:
                logger.exception("releasing launch service %r failed", service)
