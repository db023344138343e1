"""A handle on one process, remote or local: notifications are applied while their seq
follows the cursor (PROTOCOL.md §8.2), a gap is filled with ``process/read`` (§8.4). Never
a long-poll read: legacy servers answer a connection's requests in order (§17.14)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, TypedDict, final

import msgspec

from exec_server.client.errors import ClientClosedError, ConnectionLostError
from exec_server.exceptions import InvalidParamsError
from exec_server.process.spec import ExitStatus
from exec_server.protocol.types.process import (
    ClosedNotification,
    EnvPolicy,
    ExitedNotification,
    OutputChunk,
    OutputNotification,
    ProcessStream,
    ReadParams,
    SignalParams,
    TerminateParams,
    WriteParams,
    WriteStatus,
)

if TYPE_CHECKING:
    from exec_server.client.backend import LocalExecBackend
    from exec_server.client.connection import ExecServerClient

__all__ = [
    "DEFAULT_POLL_INTERVAL",
    "CompletedProcess",
    "ProcessHandle",
    "RemoteProcess",
    "Signal",
    "SpawnOptions",
]

#: seconds without any event before the handle checks with a non-blocking read
DEFAULT_POLL_INTERVAL: Final = 5.0
_READ_MAX_BYTES: Final = 1 << 20


class Signal(enum.Enum):
    """Signals ``process/signal`` can deliver (CLIENT_COMPAT.md §5.4)."""

    INTERRUPT = "interrupt"


class SpawnOptions(TypedDict, total=False):
    """``spawn()``'s keyword arguments, for layers that pass them on."""

    cwd: str | None
    env: Mapping[str, str] | None
    env_policy: EnvPolicy | None
    tty: bool
    pipe_stdin: bool
    arg0: str | None
    process_id: str | None
    sandbox: msgspec.Struct | None


@contextlib.contextmanager
def starting(
    ops: ExecServerClient | LocalExecBackend,
    handles: dict[str, ProcessHandle],
    argv: Sequence[str],
    cwd: str | None,
    process_id: str | None,
    tty: bool,
) -> Iterator[tuple[str, ProcessHandle]]:
    """The cwd and handle of a process to start, checked as the server would so both
    backends fail alike (a relative cwd has no URI form, PROTOCOL.md §8.1); registered
    before the start (notifications may beat its reply), dropped if the start fails."""
    work_dir = os.getcwd() if cwd is None else cwd
    if not os.path.isabs(work_dir):
        raise InvalidParamsError("cwd must be absolute: path must be absolute")
    pid = process_id if process_id is not None else uuid.uuid4().hex
    if pid in handles:
        raise ValueError(f"process {pid} already has a handle")
    handles[pid] = ProcessHandle(ops, pid, tty=tty, argv=argv)
    try:
        yield work_dir, handles[pid]
    except BaseException:
        handles.pop(pid, None)
        raise


@dataclass(frozen=True, slots=True)
class CompletedProcess:
    """Everything a finished process produced (``pty`` output is in ``stdout``)."""

    stdout: bytes
    stderr: bytes
    status: ExitStatus

    @property
    def exit_code(self) -> int:
        return self.status.code


_Event = OutputNotification | ExitedNotification | ClosedNotification


@final
class ProcessHandle:
    """A running (or finished) process from ``start()``, ``spawn()`` or ``adopt()``; iterating
    yields :class:`OutputChunk` until it is closed (exited and drained), one reader at a time."""

    def __init__(
        self,
        ops: ExecServerClient | LocalExecBackend,
        process_id: str,
        *,
        tty: bool,
        after_seq: int = 0,
        argv: Sequence[str] = (),
    ) -> None:
        self._ops = ops
        self.process_id = process_id
        self.tty = tty
        #: empty for an adopted handle
        self.argv: tuple[str, ...] = tuple(argv)
        #: last consumed seq; out-of-order events; chunks ready for the reader
        self._seq = after_seq
        self._pending: dict[int, _Event] = {}
        self._ready: collections.deque[OutputChunk] = collections.deque()
        self._need_read = False  # adopt() sets it: a handle adopted mid-stream catches up
        self._exit_code: int | None = None
        self._closed = False
        self._failure: BaseException | None = None
        self._wake = asyncio.Event()
        self._read_lock = asyncio.Lock()
        self._iterating = False
        self._write_ids = 0

    def __repr__(self) -> str:
        state = (
            "closed" if self._closed else "exited" if self._exit_code is not None else "running"
        )
        return (
            f"<ProcessHandle {self.process_id!r} {state} exit_code={self._exit_code} "
            f"seq={self._seq}>"
        )

    @property
    def exit_code(self) -> int | None:
        """``128+N`` for a death by signal N; None until the exit is known."""
        return self._exit_code

    @property
    def closed(self) -> bool:
        """Exited and all its output received."""
        return self._closed

    @property
    def failure(self) -> str | None:
        """Why reading stopped early (reads raise; §13.3 reports it as ``closed``)."""
        return None if self._failure is None else str(self._failure)

    @property
    def last_seq(self) -> int:
        """The last sequence number consumed."""
        return self._seq

    def _on_event(self, event: _Event) -> None:
        if event.seq <= self._seq:
            return
        if event.seq != self._seq + 1:
            self._pending[event.seq] = event
            self._need_read = True
            self._wake.set()
            return
        self._apply(event)
        self._drain_pending()
        self._wake.set()

    def _apply(self, event: _Event) -> None:
        self._seq = event.seq
        if isinstance(event, OutputNotification):
            self._ready.append(OutputChunk(seq=event.seq, stream=event.stream, chunk=event.chunk))
        elif isinstance(event, ExitedNotification):
            self._exit_code = event.exit_code
        else:
            self._mark_closed()

    def _mark_closed(self) -> None:
        # Nothing follows ``closed`` (§8.2): stop routing, so finished handles don't pile up.
        self._closed = True
        self._ops._release(self.process_id)

    def _drain_pending(self) -> None:
        pending = self._pending
        for seq in [s for s in pending if s <= self._seq]:
            del pending[seq]
        while (nxt := pending.pop(self._seq + 1, None)) is not None:
            self._apply(nxt)
        if not pending:
            self._need_read = False

    def _on_failure(self, exc: BaseException) -> None:
        if not self._closed:
            self._failure = exc
        self._wake.set()

    def _on_resumed(self) -> None:
        self._failure = None
        self._need_read = True
        self._wake.set()

    async def _catch_up(self) -> None:
        async with self._read_lock:
            params = ReadParams(process_id=self.process_id, after_seq=self._seq,
                                max_bytes=_READ_MAX_BYTES, wait_ms=0)
            result = await self._ops.read_process(params)
            for chunk in result.chunks:
                if chunk.seq > self._seq:
                    self._ready.append(chunk)
                    self._seq = chunk.seq
            # §8.4 cursor convention: nextSeq - 1 also covers exit/close events.
            self._seq = max(self._seq, result.next_seq - 1)
            if result.exited and result.exit_code is not None:
                self._exit_code = result.exit_code
            # A read that returned chunks may have stopped at maxBytes: read again.
            # Only an empty read proves the cursor reached the end.
            if result.closed and not result.chunks:
                self._mark_closed()
            self._drain_pending()
            self._need_read = (bool(result.chunks) and not self._closed) or bool(self._pending)

    async def _step(self) -> None:
        if self._failure is not None:
            # A fresh exception per raise: re-raising one object grows its traceback.
            failure = self._failure
            if isinstance(failure, ConnectionLostError):
                raise ConnectionLostError(failure.reason) from failure
            raise ClientClosedError(str(failure)) from failure
        if self._need_read:
            await self._catch_up()
            return
        self._wake.clear()
        try:
            await asyncio.wait_for(self._wake.wait(), DEFAULT_POLL_INTERVAL)
        except TimeoutError:
            self._need_read = True

    def __aiter__(self) -> ProcessHandle:
        return self

    async def __anext__(self) -> OutputChunk:
        chunk = await self.read_chunk()
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    async def read_chunk(self) -> OutputChunk | None:
        """Next output chunk, or None once closed; ``ConnectionLostError`` if the
        transport dropped (reading continues after ``reconnect()``)."""
        if self._iterating:
            raise RuntimeError(f"process {self.process_id} is already being read")
        self._iterating = True
        try:
            while True:
                if self._ready:
                    return self._ready.popleft()
                if self._closed:
                    return None
                await self._step()
        finally:
            self._iterating = False

    async def wait(self) -> ExitStatus:
        """Wait until closed (unread output stays readable); ``-1`` if unobservable."""
        while not self._closed:
            await self._step()
        return ExitStatus(-1 if self._exit_code is None else self._exit_code)

    async def collect(self) -> CompletedProcess:
        """Read everything until closed (``pty`` output counts as stdout)."""
        out, err = bytearray(), bytearray()
        async for chunk in self:
            (err if chunk.stream is ProcessStream.STDERR else out).extend(chunk.chunk)
        return CompletedProcess(bytes(out), bytes(err), await self.wait())

    async def write(self, data: bytes) -> WriteStatus:
        """Send bytes to stdin (the PTY in tty mode); ``accepted`` or why not."""
        self._write_ids += 1
        params = WriteParams(process_id=self.process_id, chunk=data, write_id=str(self._write_ids))
        return (await self._ops.write_process(params)).status

    async def terminate(self) -> bool:
        """Kill the process group; returns whether it was still running."""
        result = await self._ops.terminate_process(TerminateParams(process_id=self.process_id))
        return result.running

    async def signal(self, signal: Signal = Signal.INTERRUPT) -> None:
        """Deliver ``signal`` to the process group (only ``interrupt`` exists)."""
        params = SignalParams(process_id=self.process_id, signal=signal.value)
        await self._ops.signal_process(params)

    async def resize(self, rows: int, cols: int) -> None:
        """Set a PTY's size (extension ``process/resizePty``: ``NotSupportedError`` upstream)."""
        await self._ops.resize_pty(self.process_id, rows, cols)

    async def close_stdin(self) -> None:
        """End a ``pipe_stdin`` process's input (extension ``process/closeStdin``)."""
        await self._ops.close_stdin(self.process_id)

    def release(self) -> None:
        """Stop routing this process's notifications to the handle."""
        self._ops._release(self.process_id)

    async def __aenter__(self) -> ProcessHandle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self._closed and self._failure is None:
            with contextlib.suppress(Exception):
                await self.terminate()
        self.release()


#: STYLE.md's name; local and remote handles are one class.
RemoteProcess = ProcessHandle
