"""Fixtures for process tests: an in-process ProcessManager and a notification collector."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest

from exec_server.config import ServerConfig
from exec_server.process.manager import ProcessManager
from exec_server.protocol.types.process import (
    ClosedNotification,
    ExitedNotification,
    OutputNotification,
)
from exec_server.server.notifications import notifier

TIMEOUT = 10.0


@dataclass
class Collected:
    """Everything the sink saw for one process."""

    output: list[OutputNotification] = field(default_factory=list)
    exited: ExitedNotification | None = None
    closed: ClosedNotification | None = None
    order: list[tuple[str, int]] = field(default_factory=list)
    closed_event: asyncio.Event = field(default_factory=asyncio.Event)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def data(self, stream: str | None = None) -> bytes:
        return b"".join(n.chunk for n in self.output if stream is None or n.stream.value == stream)


class Sink:
    """Collects notifications per process id."""

    def __init__(self) -> None:
        self.by_id: dict[str, Collected] = {}
        self.methods: list[str] = []

    def of(self, process_id: str) -> Collected:
        return self.by_id.setdefault(process_id, Collected())

    async def __call__(self, method: str, params: msgspec.Struct) -> None:
        self.methods.append(method)
        process_id: str = params.process_id  # type: ignore[attr-defined]
        rec = self.of(process_id)
        seq: int = params.seq  # type: ignore[attr-defined]
        rec.order.append((method, seq))
        if isinstance(params, OutputNotification):
            rec.output.append(params)
        elif isinstance(params, ExitedNotification):
            rec.exited = params
        elif isinstance(params, ClosedNotification):
            rec.closed = params
            rec.closed_event.set()
        rec.changed.set()

    async def closed(self, process_id: str, timeout: float = TIMEOUT) -> Collected:  # noqa: ASYNC109
        rec = self.of(process_id)
        async with asyncio.timeout(timeout):
            await rec.closed_event.wait()
        return rec

    async def output_contains(
        self,
        process_id: str,
        needle: bytes,
        timeout: float = TIMEOUT,  # noqa: ASYNC109
    ) -> bytes:
        rec = self.of(process_id)
        async with asyncio.timeout(timeout):
            while needle not in rec.data():
                rec.changed.clear()
                await rec.changed.wait()
        return rec.data()


async def _wait_until(predicate: Callable[[], bool], timeout: float = TIMEOUT) -> None:  # noqa: ASYNC109
    """Poll a condition with a deadline (for state that has no event of its own)."""
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 - the state has no event of its own
            await asyncio.sleep(0.01)


@pytest.fixture
def wait_until() -> Callable[..., Any]:
    """``await wait_until(predicate)``: poll with a deadline."""
    return _wait_until


@pytest.fixture
def sink() -> Sink:
    return Sink()


@pytest.fixture
async def make_manager(sink: Sink) -> AsyncIterator[Callable[..., ProcessManager]]:
    """``make_manager(**config_and_kwargs)``: a manager wired to ``sink``; shut down at teardown."""
    managers: list[ProcessManager] = []

    def factory(*, attach: bool = True, **kwargs: Any) -> ProcessManager:
        manager_kwargs = {k: kwargs.pop(k) for k in ("terminate_grace", "read_size") if k in kwargs}
        manager = ProcessManager(ServerConfig(**kwargs), **manager_kwargs)
        if attach:
            manager.set_sink(notifier(sink))
        managers.append(manager)
        return manager

    yield factory
    for manager in managers:
        await manager.shutdown()


@pytest.fixture
def manager(make_manager: Callable[..., ProcessManager]) -> ProcessManager:
    return make_manager()
