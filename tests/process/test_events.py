"""The manager's domain events: order, backpressure from a slow receiver, wire mapping."""

from __future__ import annotations

import asyncio
import fcntl
import termios
from collections.abc import Callable
from typing import Any

import msgspec

from exec_server.process.events import Closed, Exited, Output, ProcessEvent
from exec_server.process.manager import DEFAULT_READ_SIZE, UNSENT_LIMIT, ProcessManager, State
from exec_server.process.spawn import PIPE_SIZE
from exec_server.process.spec import LaunchSpec
from exec_server.protocol.types.process import (
    ClosedNotification,
    ExitedNotification,
    OutputNotification,
    ProcessStream,
)
from exec_server.server.notifications import notification

PATH_ENV = {"PATH": "/usr/bin:/bin"}


class Gate:
    """An event sink that holds every event until ``opened``."""

    def __init__(self) -> None:
        self.events: list[ProcessEvent] = []
        self.opened = asyncio.Event()
        self.first = asyncio.Event()
        self.closed = asyncio.Event()

    async def __call__(self, event: ProcessEvent) -> None:
        self.first.set()
        await self.opened.wait()
        self.events.append(event)
        if isinstance(event, Closed):
            self.closed.set()


async def test_a_slow_receiver_stops_the_reading_and_loses_nothing(
    no_leaks: None, make_manager: Callable[..., ProcessManager], wait_until: Any
) -> None:
    total = 8 << 20  # far more than the pipe and the unsent bound hold
    manager = make_manager(attach=False)
    gate = Gate()
    manager.set_sink(gate)
    await manager.start("b", LaunchSpec(argv=["head", "-c", str(total), "/dev/zero"],
                                        cwd="/", env=PATH_ENV))
    rec = manager._records["b"]
    async with asyncio.timeout(10):
        await gate.first.wait()
    fd = rec.captures[0].fd

    def pipe_full() -> bool:
        return int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4), "little") >= PIPE_SIZE

    await wait_until(pipe_full)  # the child is blocked: we stopped reading
    assert rec.state is State.RUNNING
    recorded, _ = rec.buffer.snapshot(0, None)
    assert sum(len(c.chunk) for c in recorded) <= UNSENT_LIMIT + DEFAULT_READ_SIZE
    gate.opened.set()
    async with asyncio.timeout(10):
        await gate.closed.wait()
    outputs = [e for e in gate.events if isinstance(e, Output)]
    assert sum(len(e.data) for e in outputs) == total
    assert [e.seq for e in gate.events] == list(range(1, len(gate.events) + 1))
    exits = [e for e in gate.events if isinstance(e, Exited)]
    assert exits == [Exited("b", exits[0].seq, 0, None)]  # no report_denial: no verdict
    assert isinstance(gate.events[-1], Closed)
    assert rec.state is State.CLOSED


def test_events_map_to_both_notification_shapes() -> None:
    method, out = notification(Output("p", 1, ProcessStream.STDOUT, b"x"))
    assert method == "process/output"
    assert out == OutputNotification(process_id="p", seq=1, stream=ProcessStream.STDOUT, chunk=b"x")
    method, legacy = notification(Exited("p", 2, 3, None))
    assert method == "process/exited"
    assert b"sandboxDenied" not in msgspec.json.encode(legacy)
    _, current = notification(Exited("p", 2, 3, False))
    assert current == ExitedNotification(process_id="p", seq=2, exit_code=3, sandbox_denied=False)
    method, closed = notification(Closed("p", 4))
    assert (method, closed) == ("process/closed", ClosedNotification(process_id="p", seq=4))
