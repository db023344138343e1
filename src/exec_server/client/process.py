"""A handle on one process started through an exec backend (remote or local).

Output arrives two ways and the handle merges them by sequence number
(PROTOCOL.md §8.2): ``process/output|exited|closed`` notifications are applied
while they are contiguous with the cursor, and whenever a gap shows up (missed
notifications, a resumed session, a handle adopted after the fact) the handle
calls ``process/read`` with the §8.4 cursor convention (``afterSeq`` = last seq
consumed, then ``nextSeq - 1``) until it has caught up. Nothing the server
still retains is lost, and bytes cross the wire once in the common case.

A handle never sends a long-poll read: the legacy server answers requests of a
connection sequentially (§17.14), so a waiting read would stall every other
call. When notifications stop unexpectedly, a short ``waitMs: 0`` read every
``poll_interval`` seconds is the safety net.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol, TypedDict, final

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
    ReadResult,
    WriteStatus,
)

__all__ = [
    "DEFAULT_POLL_INTERVAL",
    "CompletedProcess",
    "ProcessHandle",
    "ProcessOps",
    "RemoteProcess",
    "Signal",
    "SpawnOptions",
]

#: Seconds without any event before the handle checks with a non-blocking read.
DEFAULT_POLL_INTERVAL: Final = 5.0
#: Bytes per catch-up ``process/read``.
_READ_MAX_BYTES: Final = 1 << 20


class Signal(enum.Enum):
    """Signals ``process/signal`` can deliver (CLIENT_COMPAT.md §5.4)."""

    INTERRUPT = "interrupt"


class SpawnOptions(TypedDict, total=False):
    """The keyword arguments of ``spawn()`` / ``start()`` after ``argv``.

    Lets forwarding layers (``RemoteExecBackend``) pass them on without
    restating the list; see :meth:`ExecServerClient.spawn` for their meaning.
    """

    cwd: str | None
    env: Mapping[str, str] | None
    env_policy: EnvPolicy | None
    tty: bool
    pipe_stdin: bool
    arg0: str | None
    process_id: str | None
    sandbox: msgspec.Struct | None


def resolve_start(
    cwd: str | None, process_id: str | None, handles: Mapping[str, ProcessHandle]
) -> tuple[str, str]:
    """Check a start's cwd and id the way the server would; returns ``(cwd, process_id)``.

    Shared by the remote client and the local backend so both fail alike:
    ``cwd`` defaults to this process's cwd and must be absolute (a relative
    path has no URI form, PROTOCOL.md §8.1); ``process_id`` defaults to a
    random UUID and must not already have a handle.

    Raises:
        InvalidParamsError: ``cwd`` is relative.
        ValueError: ``process_id`` already has a handle.
    """
    work_dir = os.getcwd() if cwd is None else cwd
    if not os.path.isabs(work_dir):
        raise InvalidParamsError("cwd must be absolute: path must be absolute")
    pid = process_id if process_id is not None else uuid.uuid4().hex
    if pid in handles:
        raise ValueError(f"process {pid} already has a handle")
    return work_dir, pid


@contextlib.contextmanager
def registered(handles: dict[str, ProcessHandle], handle: ProcessHandle) -> Iterator[None]:
    """Route ``handle``'s notifications for the body; unregister it if the body fails.

    Registration comes before the start: notifications may beat its reply.
    """
    handles[handle.process_id] = handle
    try:
        yield
    except BaseException:
        handles.pop(handle.process_id, None)
        raise


class ProcessOps(Protocol):
    """What a handle needs from its backend; one implementation per backend."""

    async def read(self, process_id: str, after_seq: int, max_bytes: int) -> ReadResult: ...

    async def write(self, process_id: str, data: bytes, write_id: str) -> WriteStatus: ...

    async def terminate(self, process_id: str) -> bool: ...

    async def signal(self, process_id: str, signal: Signal) -> None: ...

    async def resize(self, process_id: str, rows: int, cols: int) -> None: ...

    async def close_stdin(self, process_id: str) -> None: ...

    def release(self, process_id: str) -> None: ...


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


@dataclass(slots=True)
class _Cursor:
    """Merge state: last consumed seq, out-of-order events, chunks ready for the reader."""

    seq: int = 0
    pending: dict[int, _Event] = field(default_factory=dict)
    ready: collections.deque[OutputChunk] = field(default_factory=collections.deque)


@final
class ProcessHandle:
    """A running (or finished) process: iterate its output, write, terminate, wait.

    Don't construct it yourself; ``ExecBackend.start()`` (or
    ``ExecServerClient.spawn()`` / ``.adopt()``) returns one.

    Iterating yields :class:`OutputChunk` (``seq``, ``stream``, ``chunk`` bytes) until
    the process is closed (exited *and* its output drained). Only one coroutine
    may iterate at a time.
    """

    def __init__(
        self,
        ops: ProcessOps,
        process_id: str,
        *,
        tty: bool,
        after_seq: int = 0,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        argv: Sequence[str] = (),
    ) -> None:
        self._ops = ops
        self.process_id = process_id
        self.tty = tty
        #: the command as started (empty for an adopted handle).
        self.argv: tuple[str, ...] = tuple(argv)
        self._cur = _Cursor(seq=after_seq)
        # A handle adopted mid-stream has not seen anything yet: catch up by reading.
        self._need_read = after_seq > 0
        self._exit_code: int | None = None
        self._closed = False
        self._failure: BaseException | None = None
        self._wake = asyncio.Event()
        self._read_lock = asyncio.Lock()
        self._iterating = False
        self._poll_interval = poll_interval
        self._write_ids = 0

    def __repr__(self) -> str:
        state = (
            "closed" if self._closed else "exited" if self._exit_code is not None else "running"
        )
        return (
            f"<ProcessHandle {self.process_id!r} {state} exit_code={self._exit_code} "
            f"seq={self._cur.seq}>"
        )

    # ------------------------------------------------------------------ state

    @property
    def exit_code(self) -> int | None:
        """Exit code once the exit is known (``128+signal`` for signal deaths), else None."""
        return self._exit_code

    @property
    def closed(self) -> bool:
        """True once the process exited and all its output was received."""
        return self._closed

    @property
    def failure(self) -> str | None:
        """Why reading stopped early (``exec-server transport disconnected: …``), else None.

        PROTOCOL.md §13.3 reports this as a synthesised ``closed`` read with a
        ``failure`` text; here reads raise instead and this keeps the text.
        """
        return None if self._failure is None else str(self._failure)

    @property
    def last_seq(self) -> int:
        """The last sequence number consumed (the ``afterSeq`` of the next read)."""
        return self._cur.seq

    # ------------------------------------------------------------------ events (backend side)

    def _on_event(self, event: _Event) -> None:
        """Apply a notification; out-of-order ones wait for the gap to be filled."""
        cur = self._cur
        if event.seq <= cur.seq:
            return
        if event.seq != cur.seq + 1:
            cur.pending[event.seq] = event
            self._need_read = True
            self._wake.set()
            return
        self._apply(event)
        self._drain_pending()
        self._wake.set()

    def _apply(self, event: _Event) -> None:
        cur = self._cur
        cur.seq = event.seq
        if isinstance(event, OutputNotification):
            cur.ready.append(OutputChunk(seq=event.seq, stream=event.stream, chunk=event.chunk))
        elif isinstance(event, ExitedNotification):
            self._exit_code = event.exit_code
        else:
            self._mark_closed()

    def _mark_closed(self) -> None:
        # Nothing follows ``closed`` (§8.2): stop routing, so finished handles don't pile up.
        self._closed = True
        self._ops.release(self.process_id)

    def _drain_pending(self) -> None:
        cur = self._cur
        for seq in [s for s in cur.pending if s <= cur.seq]:
            del cur.pending[seq]
        while (nxt := cur.pending.pop(cur.seq + 1, None)) is not None:
            self._apply(nxt)
        if not cur.pending:
            self._need_read = False

    def _on_failure(self, exc: BaseException) -> None:
        """The backend lost its transport: wake readers so they see ``exc``."""
        if not self._closed:
            self._failure = exc
        self._wake.set()

    def _on_resumed(self) -> None:
        """The session was resumed on a new connection: catch up by reading."""
        self._failure = None
        self._need_read = True
        self._wake.set()

    # ------------------------------------------------------------------ driving

    async def _catch_up(self) -> None:
        """One ``process/read`` from the cursor; merges chunks and exit/close state."""
        async with self._read_lock:
            cur = self._cur
            result = await self._ops.read(self.process_id, cur.seq, _READ_MAX_BYTES)
            for chunk in result.chunks:
                if chunk.seq > cur.seq:
                    cur.ready.append(chunk)
                    cur.seq = chunk.seq
            # §8.4 cursor convention: nextSeq - 1 also covers exit/close events.
            cur.seq = max(cur.seq, result.next_seq - 1)
            if result.exited and result.exit_code is not None:
                self._exit_code = result.exit_code
            # A read that returned chunks may have stopped at maxBytes: read again.
            # Only an empty read proves the cursor reached the end.
            if result.closed and not result.chunks:
                self._mark_closed()
            self._drain_pending()
            self._need_read = (bool(result.chunks) and not self._closed) or bool(cur.pending)

    async def _step(self) -> None:
        """Make progress: read if behind, else wait for the next event (or poll)."""
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
            await asyncio.wait_for(self._wake.wait(), self._poll_interval)
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
        """Next output chunk, or None once the process is closed.

        Raises:
            ConnectionLostError: the transport dropped (after ``reconnect()`` reading
                continues where it stopped).
            RuntimeError: another coroutine is already reading this handle.
        """
        if self._iterating:
            raise RuntimeError(f"process {self.process_id} is already being read")
        self._iterating = True
        try:
            while True:
                if self._cur.ready:
                    return self._cur.ready.popleft()
                if self._closed:
                    return None
                await self._step()
        finally:
            self._iterating = False

    async def wait(self) -> ExitStatus:
        """Wait until the process is closed; its unread output stays readable.

        Returns:
            The exit status (``-1`` if the server could not observe it).
        """
        while not self._closed:
            await self._step()
        assert self._exit_code is not None or self._closed
        return ExitStatus(-1 if self._exit_code is None else self._exit_code)

    async def collect(self) -> CompletedProcess:
        """Read everything until closed; ``pty`` output counts as stdout."""
        out, err = bytearray(), bytearray()
        async for chunk in self:
            (err if chunk.stream is ProcessStream.STDERR else out).extend(chunk.chunk)
        return CompletedProcess(bytes(out), bytes(err), await self.wait())

    # ------------------------------------------------------------------ actions

    async def write(self, data: bytes) -> WriteStatus:
        """Send bytes to the process's stdin (PTY in tty mode).

        Returns:
            ``accepted``, or why not (``stdinClosed`` for a pipe process started
            without ``pipe_stdin``, ``unknownProcess`` after removal).
        """
        self._write_ids += 1
        return await self._ops.write(self.process_id, data, str(self._write_ids))

    async def terminate(self) -> bool:
        """Kill the process group; returns whether it was still running."""
        return await self._ops.terminate(self.process_id)

    async def signal(self, signal: Signal = Signal.INTERRUPT) -> None:
        """Deliver ``signal`` to the process group (only ``interrupt`` exists)."""
        await self._ops.signal(self.process_id, signal)

    async def resize(self, rows: int, cols: int) -> None:
        """Set a ``tty`` process's terminal size (``process/resizePty``, an
        extension of this project's server).

        Raises:
            NotSupportedError: the server does not implement it (upstream).
            InvalidParamsError: the process is not on a PTY, or a size is
                outside 1..65535.
        """
        await self._ops.resize(self.process_id, rows, cols)

    async def close_stdin(self) -> None:
        """End of input for a ``pipe_stdin`` process, after the writes so far
        (``process/closeStdin``, an extension of this project's server).

        Raises:
            NotSupportedError: the server does not implement it (upstream).
        """
        await self._ops.close_stdin(self.process_id)

    def release(self) -> None:
        """Stop routing this process's notifications to the handle."""
        self._ops.release(self.process_id)

    async def __aenter__(self) -> ProcessHandle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Terminate if still running, then stop routing its notifications."""
        if not self._closed and self._failure is None:
            with contextlib.suppress(Exception):
                await self.terminate()
        self.release()


#: The name STYLE.md uses; local and remote handles are the same class.
RemoteProcess = ProcessHandle
