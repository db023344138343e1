"""Per-session process table (PROTOCOL.md §8); each process is a state machine
STARTING → RUNNING → EXITED (its group may still hold the output open) → CLOSED, one
``_to_*`` method per transition. Events take the next seq of the process's buffer and
go, in that order, to one sender task; a slow receiver stops the reads (backpressure)."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import errno
import logging
import os
import signal as _signal
import subprocess
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from exec_server.errno_text import os_error_text
from exec_server.fs.pool import shared_pool
from exec_server.process import tree
from exec_server.process.errors import (
    ProcessFailedError,
    ProcessInvalidError,
    ProcessRefusedError,
)
from exec_server.process.events import Closed, EventSink, Exited, Output, ProcessEvent, Snapshot
from exec_server.process.guard import ProcessGuard
from exec_server.process.output import OutputBuffer
from exec_server.process.spawn import (
    SpawnedChild,
    close_quietly,
    exit_status_from_wait,
    set_if_pending,
    set_window_size,
    spawn,
    spawn_via_service,
)
from exec_server.process.spec import LaunchService, LaunchSpec
from exec_server.process.stdin import Stdin, wait_in, wake_all
from exec_server.protocol.types.process import ProcessStream, WriteStatus
from exec_server.sandbox.plan import SandboxType

if TYPE_CHECKING:
    from exec_server.config import ServerConfig

__all__ = [
    "DEFAULT_READ_SIZE",
    "DEFAULT_TERMINATE_GRACE",
    "ProcessManager",
    "State",
    "looks_sandbox_denied",
]

logger = logging.getLogger("exec_server.process")

#: Bytes per ``os.read`` of a child's output: one read = one chunk. Upstream reads 8 KiB
#: (§8.3); larger reads let a fast writer cost fewer notifications.
DEFAULT_READ_SIZE: Final = 131072
#: Output bytes of one process queued for the sink before its fds stop being read.
UNSENT_LIMIT: Final = 2 * DEFAULT_READ_SIZE
DEFAULT_TERMINATE_GRACE: Final = 2.0
#: Seconds a failed sandboxed process's output may drain before sandboxDenied is decided.
DENIAL_DRAIN_WAIT: Final = 0.25
#: Reads per readable callback before other ready callbacks get a turn.
READS_PER_WAKEUP: Final = 16
SHUTDOWN_REAP_TIMEOUT: Final = 5.0

_DENIAL_WORDS: Final = (
    "operation not permitted", "permission denied", "read-only file system", "seccomp",
    "sandbox", "landlock", "failed to write file",
)


class State(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    EXITED = "exited"
    CLOSED = "closed"


_NEXT: Final = {
    State.STARTING: State.RUNNING,
    State.RUNNING: State.EXITED,
    State.EXITED: State.CLOSED,
}


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


@dataclass(slots=True, eq=False)
class _Capture:
    """One output fd of a process; ``reading`` while its reader callback is installed."""

    stream: ProcessStream
    fd: int
    reading: bool = False


@dataclass(slots=True, eq=False, repr=False)
class _Record:
    process_id: str
    spec: LaunchSpec
    buffer: OutputBuffer
    report_denial: bool
    state: State = State.STARTING
    child: SpawnedChild | None = None
    sandbox_denied: bool = False
    #: output fds not at EOF yet.
    captures: list[_Capture] = field(default_factory=list)
    #: set once ``captures`` is empty (the exit watcher's denial drain waits on it).
    drained: asyncio.Future[None] | None = None
    #: output bytes queued for the sink and not handed over yet.
    unsent: int = 0
    #: long-poll reads waiting for the next event.
    waiters: list[asyncio.Future[None]] = field(default_factory=list)
    watcher: asyncio.Task[None] | None = None
    stdin: Stdin = field(default_factory=Stdin)
    terminating: bool = False
    terminate_timer: asyncio.TimerHandle | None = None
    removal: asyncio.TimerHandle | None = None
    #: pidfds of descendants outside the group that a terminate signalled.
    strays: list[int] = field(default_factory=list)

    def __repr__(self) -> str:
        pid = self.child.pid if self.child else None
        return f"<Process {self.process_id!r} {self.state.value} pid={pid} {self.buffer!r}>"


def _spawn_error(exc: BaseException) -> BaseException:
    """What a failed spawn raises: the OS text, -32603 on the wire (§8.1)."""
    if isinstance(exc, OSError):
        text = str(exc) if exc.errno is None else os_error_text(exc.errno)
        return ProcessFailedError(text)
    if isinstance(exc, subprocess.SubprocessError | ValueError):
        return ProcessFailedError(f"failed to start process: {exc}")
    return exc


def _discard_launch(spec: LaunchSpec) -> None:
    for fd in spec.pass_fds:
        close_quietly(fd)
    _cleanup(spec)


def _cleanup(spec: LaunchSpec) -> None:
    if spec.cleanup is not None:
        try:
            spec.cleanup()
        except Exception:
            logger.exception("launch cleanup failed")


class ProcessManager:
    """All processes of one session; ``read_size`` bytes per read make one chunk."""

    def __init__(
        self,
        config: ServerConfig,
        *,
        terminate_grace: float = DEFAULT_TERMINATE_GRACE,
        read_size: int = DEFAULT_READ_SIZE,
    ) -> None:
        self._config = config
        self._services: dict[int, LaunchService] = {}
        self._grace = terminate_grace
        self._read_size = read_size
        self._records: dict[str, _Record] = {}
        self._sink: EventSink | None = None
        self._outbox: deque[tuple[_Record, ProcessEvent]] = deque()
        self._sender: asyncio.Task[None] | None = None
        self._closed = False
        self._guard = ProcessGuard()

    def pid_of(self, process_id: str) -> int | None:
        rec = self._records.get(process_id)
        return rec.child.pid if rec is not None and rec.child is not None else None

    def _known(self, process_id: str) -> _Record:
        rec = self._records.get(process_id)
        if rec is None:
            raise ProcessRefusedError(f"unknown process id {process_id}")
        return rec

    def set_sink(self, sink: EventSink | None) -> None:
        """Without a sink, reads still see the events."""
        self._sink = sink

    def _emit(self, rec: _Record, event: ProcessEvent) -> None:
        wake_all(rec.waiters)
        if self._sink is None:
            return
        if isinstance(event, Output):
            rec.unsent += len(event.data)
        self._outbox.append((rec, event))
        if self._sender is None:
            self._sender = asyncio.get_running_loop().create_task(self._send_all())

    async def _send_all(self) -> None:
        try:
            while self._outbox:
                rec, event = self._outbox.popleft()
                delivered = await self._deliver(event)
                if isinstance(event, Output):
                    rec.unsent -= len(event.data)
                    if delivered and rec.buffer.lossless:
                        rec.buffer.mark_notified(event.seq)
                    self._resume(rec)
        finally:
            self._sender = None

    async def _deliver(self, event: ProcessEvent) -> bool:
        sink = self._sink
        if sink is None:
            return False
        try:
            handed_over = await sink(event)
        except Exception:  # a dead connection must not stop the others (§8.3: failures ignored)
            logger.debug("dropping %r: sink failed", event, exc_info=True)
            return False
        # Detached while the send was pending: written to a departing transport, if at all.
        return handed_over is not False and self._sink is sink

    async def start(
        self, process_id: str, spec: LaunchSpec, *, report_denial: bool = False
    ) -> None:
        """``report_denial``: exit event and reads carry a sandbox-denial verdict. Always
        consumes ``spec.pass_fds`` and ``cleanup``; a failed spawn is a ProcessFailedError."""
        if process_id in self._records:
            _discard_launch(spec)
            raise ProcessRefusedError(f"process {process_id} already exists")
        buffer = OutputBuffer(self._config.output_cap, lossless=self._config.lossless_output)
        rec = _Record(process_id, spec, buffer, report_denial)
        self._records[process_id] = rec
        try:
            child = await self._launch(spec)
        except BaseException as exc:
            if self._records.get(process_id) is rec:
                del self._records[process_id]
            _discard_launch(spec)
            raise _spawn_error(exc) from exc
        if self._closed:  # shut down meanwhile: nobody will capture it
            await self._abandon(child)
            _discard_launch(spec)
            raise ProcessFailedError("failed to start process: the server is shutting down")
        self._to_running(rec, child)

    async def _launch(self, spec: LaunchSpec) -> SpawnedChild:
        """Through the launch service if any, else in a worker thread: the spawning thread
        waits for the child's chdir and exec (``vfork``), which a hung mount may block."""
        if spec.zygote is not None and self._config.launch_zygote:
            self._services[id(spec.zygote.service)] = spec.zygote.service
            child = await spawn_via_service(spec, self)
            if child is not None:
                return child
        return await shared_pool().run(spawn, spec)

    @staticmethod
    async def _abandon(child: SpawnedChild) -> None:
        """Kill and reap a child no record will own (spawned while shutting down)."""
        with contextlib.suppress(OSError):
            os.killpg(child.pid, _signal.SIGKILL)
        for _, fd in child.outputs:
            close_quietly(fd)
        close_quietly(child.stdin_fd)
        if child.popen is not None:
            await shared_pool().run(child.popen.wait)

    @staticmethod
    def _advance(rec: _Record, state: State) -> None:
        assert _NEXT.get(rec.state) is state, f"{rec!r}: no transition to {state.value}"
        rec.state = state

    def _to_running(self, rec: _Record, child: SpawnedChild) -> None:
        self._advance(rec, State.RUNNING)
        for fd in rec.spec.pass_fds:
            close_quietly(fd)
        self._guard.add(child.pid)
        rec.child = child
        rec.stdin = Stdin(child.stdin_fd)
        rec.captures = [_Capture(stream, fd) for stream, fd in child.outputs]
        self._resume(rec)
        rec.watcher = asyncio.get_running_loop().create_task(self._watch_exit(rec, child))

    def _to_exited(self, rec: _Record, code: int) -> None:
        self._advance(rec, State.EXITED)
        seq = rec.buffer.record_exit(code)
        denied = rec.sandbox_denied if rec.report_denial else None
        self._emit(rec, Exited(rec.process_id, seq, code, denied))
        if not rec.captures:
            self._to_closed(rec)
        elif rec.terminating:
            # Escaped group members may hold the pipes: stop reading after a grace.
            asyncio.get_running_loop().call_later(self._grace, self._force_eof, rec)

    def _to_closed(self, rec: _Record) -> None:
        self._advance(rec, State.CLOSED)
        seq = rec.buffer.record_close()
        rec.stdin.close()
        assert rec.child is not None
        self._guard.discard(rec.child.pid)
        if rec.terminate_timer is not None:
            rec.terminate_timer.cancel()
            rec.terminate_timer = None
        loop = asyncio.get_running_loop()
        if rec.strays:
            # What the command left outside its group gets the rest of its grace.
            loop.call_later(self._grace, self._kill_strays, rec)
        if not self._closed:
            retention = self._config.closed_retention
            rec.removal = loop.call_later(retention, self._remove_if_closed, rec)
        self._emit(rec, Closed(rec.process_id, seq))

    def _remove_if_closed(self, rec: _Record) -> None:
        if self._records.get(rec.process_id) is rec:
            del self._records[rec.process_id]
            wake_all(rec.waiters)

    def _may_read(self, rec: _Record) -> bool:
        return rec.unsent < UNSENT_LIMIT and not rec.buffer.full

    def _resume(self, rec: _Record) -> None:
        if not self._may_read(rec):
            return
        loop = asyncio.get_running_loop()
        for cap in rec.captures:
            if not cap.reading:
                cap.reading = True
                loop.add_reader(cap.fd, self._on_readable, rec, cap)

    def _on_readable(self, rec: _Record, cap: _Capture) -> None:
        buffer = rec.buffer
        for _ in range(READS_PER_WAKEUP):
            if not self._may_read(rec):
                cap.reading = False
                asyncio.get_running_loop().remove_reader(cap.fd)
                return
            try:
                data = os.read(cap.fd, self._read_size)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno != errno.EIO:  # EIO on a PTY master = every slave closed
                    logger.debug("read of %r failed", rec, exc_info=True)
                data = b""
            if not data:
                self._end_stream(rec, cap)
                return
            chunk = buffer.append(cap.stream, data)
            self._emit(rec, Output(rec.process_id, chunk.seq, cap.stream, data))
            if len(data) < self._read_size:
                return  # drained for now (saves the EAGAIN read); stay armed

    def _end_stream(self, rec: _Record, cap: _Capture) -> None:
        """At EOF or given up on: the process closes after its last output fd."""
        if cap.reading:
            asyncio.get_running_loop().remove_reader(cap.fd)
        rec.captures.remove(cap)
        close_quietly(cap.fd)
        if rec.captures:
            return
        if rec.drained is not None:
            set_if_pending(rec.drained)
        if rec.state is State.EXITED:
            self._to_closed(rec)

    def _force_eof(self, rec: _Record) -> None:
        """Stop waiting for output that escaped group members keep open."""
        for cap in list(rec.captures):
            self._end_stream(rec, cap)

    async def _watch_exit(self, rec: _Record, child: SpawnedChild) -> None:
        code = exit_status_from_wait(await child.exit_status()).code
        if child.popen is not None:
            child.popen.returncode = code
        _cleanup(rec.spec)
        sandbox_type = rec.spec.sandbox_type
        if sandbox_type is not SandboxType.NONE and code != 0:
            # The denial message is usually still in the pipe: let it drain.
            if rec.captures:
                rec.drained = asyncio.get_running_loop().create_future()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(DENIAL_DRAIN_WAIT):
                        await rec.drained
            chunks, _ = rec.buffer.snapshot(0, None)
            text = b"".join(c.chunk for c in chunks)
            rec.sandbox_denied = looks_sandbox_denied(sandbox_type, code, text)
        self._to_exited(rec, code)

    async def read(
        self, process_id: str, *, after_seq: int = 0, max_bytes: int | None = None, wait_ms: int = 0
    ) -> Snapshot:
        """``process/read`` (§8.4): a snapshot now, or when something new arrives by ``wait_ms``."""
        rec = self._known(process_id)
        if rec.state is State.STARTING:
            raise ProcessRefusedError(f"process id {process_id} is starting")
        buffer = rec.buffer
        if buffer.lossless and after_seq > 0:
            buffer.mark_delivered(after_seq)
            self._resume(rec)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(wait_ms, 0) / 1000.0
        while True:
            taken, next_seq = buffer.snapshot(after_seq, max_bytes)
            if buffer.ready(after_seq, taken) or loop.time() >= deadline:
                break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(deadline):
                    await wait_in(rec.waiters)
        denied = rec.sandbox_denied if rec.report_denial else None
        return Snapshot(taken, next_seq, buffer.exit_code, buffer.closed, denied)

    async def write(self, process_id: str, data: bytes, write_id: str | None = None) -> WriteStatus:
        """``process/write`` (§8.5): queue for stdin, waiting while the queue is full; once
        stdin closed (exit, shutdown) the data is accepted and dropped, as upstream."""
        rec = self._records.get(process_id)
        if rec is None:
            return WriteStatus.UNKNOWN_PROCESS
        if rec.child is None:
            return WriteStatus.STARTING
        if rec.child.stdin_fd is None:
            return WriteStatus.STDIN_CLOSED
        if write_id is None or write_id not in rec.stdin.write_ids:
            await rec.stdin.write(data, write_id)
            # A terminal echoes the input during write(2): take the echo now.
            for cap in list(rec.captures):
                if cap.reading and cap.stream is ProcessStream.PTY:
                    self._on_readable(rec, cap)
        return WriteStatus.ACCEPTED

    def close_stdin(self, process_id: str) -> None:
        """``process/closeStdin`` (extension): no-op on a PTY (its end of input is the EOF
        character) or without a stdin pipe."""
        rec = self._known(process_id)
        if not rec.spec.tty:
            rec.stdin.close_when_flushed()

    def resize(self, process_id: str, rows: int, columns: int) -> None:
        """``process/resizePty`` (extension): the kernel sends SIGWINCH; no-op once closed."""
        rec = self._known(process_id)
        if not rec.spec.tty:
            raise ProcessInvalidError(f"process {process_id} has no PTY")
        if rec.stdin.fd is not None:
            with contextlib.suppress(OSError):  # EIO/EBADF: the terminal is gone
                set_window_size(rec.stdin.fd, rows, columns)

    def terminate(self, process_id: str) -> bool:
        """``process/terminate`` (issue 2 overrides §8.6): SIGTERM to the group and an
        unsandboxed child's descendants outside it, SIGKILL after ``terminate_grace``. True
        when a running process was asked to stop (an exited one's group is ended too)."""
        rec = self._records.get(process_id)
        if rec is None or rec.state not in (State.RUNNING, State.EXITED):
            return False
        running = rec.state is State.RUNNING
        if rec.terminating:
            return running
        rec.terminating = True
        root = self._tree_root(rec)
        if root is not None:
            rec.strays = tree.open_pidfds(tree.descendants(root))
        self._kill_group(rec, _signal.SIGTERM)
        tree.signal_pidfds(rec.strays, _signal.SIGTERM)
        rec.terminate_timer = asyncio.get_running_loop().call_later(
            self._grace, self._escalate, rec
        )
        return running

    def _escalate(self, rec: _Record) -> None:
        rec.terminate_timer = None  # cancelled on close: the process is RUNNING or EXITED
        self._kill_tree(rec)
        if rec.state is State.EXITED:
            asyncio.get_running_loop().call_later(self._grace, self._force_eof, rec)

    def signal(self, process_id: str, sig: _signal.Signals = _signal.SIGINT) -> None:
        """``process/signal``: deliver ``sig`` to the group; no-op when gone."""
        rec = self._records.get(process_id)
        if rec is not None and rec.state in (State.RUNNING, State.EXITED):
            self._kill_group(rec, sig)

    @staticmethod
    def _tree_root(rec: _Record) -> int | None:
        """The pid of an unsandboxed, unreaped process, whose descendants' ancestry is still
        its own (only a sandboxed process is reaped before it leaves RUNNING)."""
        if rec.spec.sandbox_type is SandboxType.NONE and rec.state is State.RUNNING and rec.child:
            return rec.child.pid
        return None

    def _kill_tree(self, rec: _Record) -> None:
        """SIGKILL the group, every descendant of an unsandboxed child and earlier strays."""
        root = self._tree_root(rec)
        if root is not None:
            tree.kill_tree(root)
        self._kill_group(rec, _signal.SIGKILL)
        self._kill_strays(rec)

    @staticmethod
    def _kill_strays(rec: _Record) -> None:
        strays, rec.strays = rec.strays, []
        tree.signal_pidfds(strays, _signal.SIGKILL)
        for fd in strays:
            close_quietly(fd)

    @staticmethod
    def _kill_group(rec: _Record, sig: _signal.Signals) -> None:
        if rec.child is not None:
            # A reaped leader's group id stays reserved while members live (no reuse).
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(rec.child.pid, sig)

    async def shutdown(self) -> None:
        """Kill every process group, reap every child, close every fd (§8.11)."""
        self._closed = True
        self._sink = None
        self._outbox.clear()
        records = list(self._records.values())
        self._records.clear()
        for rec in records:
            if rec.removal is not None:
                rec.removal.cancel()
            if rec.terminate_timer is not None:
                rec.terminate_timer.cancel()
            if rec.state in (State.RUNNING, State.EXITED):
                self._kill_tree(rec)
            self._kill_strays(rec)
            self._force_eof(rec)
        watchers = [rec.watcher for rec in records if rec.watcher is not None]
        if watchers:
            _, pending = await asyncio.wait(watchers, timeout=SHUTDOWN_REAP_TIMEOUT)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        for rec in records:
            rec.stdin.close()
            wake_all(rec.waiters)
        if self._sender is not None:
            self._sender.cancel()
            await asyncio.wait([self._sender])
        await self._guard.aclose()
        services = list(self._services.values())
        self._services.clear()
        for service in services:
            try:
                await service.release(self)
            except Exception:
                logger.exception("releasing launch service %r failed", service)
