"""A closed connection's processor is freed by reference counting, not by a later
full garbage collection: its session attachment held it through its sinks (bound
methods), and with it the transport and whatever that still buffered."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Callable
from typing import Any


async def test_a_closed_connections_processor_is_freed_without_the_collector(
    inprocess_server: Callable[..., Any],
) -> None:
    srv = inprocess_server()
    client = await srv.connect()
    await client.initialize()
    processor = weakref.ref(client.processor)
    client.processor = None  # the fixture keeps the client (and its finished task)
    gc.disable()
    try:
        await client.aclose()  # the transport drops
        async with asyncio.timeout(30):
            await client.task
        assert processor() is None
    finally:
        gc.enable()
