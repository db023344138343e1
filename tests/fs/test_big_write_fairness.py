"""A big ``fs/writeFile`` does not hold the event loop (issue 30: a big message must
not stall other connections). Nothing here is timed: the test counts the loop's
turns (a task that only yields) while the server decodes and writes the message,
and checks where the decoding ran."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from exec_server.protocol import codec
from exec_server.server import connection
from exec_server.server.handlers import fs as fs_handlers

MIB = 1 << 20


class _Turns:
    """Counts the event loop's turns while running (each turn: one ``sleep(0)``)."""

    def __init__(self) -> None:
        self.count = 0
        self._task: asyncio.Task[None] | None = None

    async def _spin(self) -> None:
        while True:
            await asyncio.sleep(0)
            self.count += 1

    def __enter__(self) -> _Turns:
        self._task = asyncio.get_running_loop().create_task(self._spin())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


async def test_a_big_write_is_decoded_while_the_loop_runs(
    inprocess_server: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 64 MiB write (85 MiB of text): the message is walked in a worker thread, and
    its text decoded there a 1 MiB slice at a time, with loop turns between
    slices. Decoding the message on the loop (as msgspec, or a scan of the whole
    text there) gives no turn at all: a synchronous call on the loop's thread
    cannot be interleaved with the loop."""
    data = os.urandom(64 * MIB)
    target = tmp_path / "big.bin"
    message = json.dumps({
        "id": 7,
        "method": "fs/writeFile",
        "params": {"path": target.as_uri(), "dataBase64": base64.b64encode(data).decode()},
    }).encode()
    loop_thread = threading.get_ident()
    turns = _Turns()
    decoded_on: list[int] = []
    turns_at_slices: list[int] = []

    def decode_message(item: Any) -> Any:
        if len(item) >= connection.DECODE_OFF_LOOP:
            decoded_on.append(threading.get_ident())
        return codec.decode_message(item)

    def decode_slices(*args: Any) -> Iterator[bytes]:
        for piece in codec_slices(*args):
            turns_at_slices.append(turns.count)
            yield piece

    codec_slices = fs_handlers.decode_slices
    monkeypatch.setattr(connection, "decode_message", decode_message)
    monkeypatch.setattr(fs_handlers, "decode_slices", decode_slices)
    srv = inprocess_server()
    client = await srv.connect()
    await client.initialize()
    with turns:
        await client.send_raw(message)
        del message
        reply = await client.response(7, timeout=120)
    assert reply.get("result") == {}, reply
    assert target.read_bytes() == data
    assert decoded_on and loop_thread not in decoded_on
    slices = len(turns_at_slices)
    assert slices == -(-len(base64.b64encode(data)) // MIB)  # 1 MiB of text at a time
    # The loop turned between slices, in several of the gaps (1 in 5 to 1 in 10
    # on this project's loaded VM: the worker gives the GIL up while it writes,
    # and Python's switch interval, 5 ms, makes it give it up every few 1 MiB
    # decodes), and many times in all; a decode of the whole text in one call
    # would have shown no turn from the first slice to the last.
    turned = sum(b > a for a, b in itertools.pairwise(turns_at_slices))
    assert turned >= 3, f"the loop turned between {turned} of {slices} slices"
    assert turns_at_slices[-1] - turns_at_slices[0] >= slices
