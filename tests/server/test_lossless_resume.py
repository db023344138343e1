"""Lossless output across a connection that dies mid-stream (issue 2: never lose output).

The first connection's transport fails while a ``process/output`` notification
is being sent (the peer is gone but the reader has not seen EOF yet). That
chunk, and any sent before the session detaches, must not count as delivered:
after a resume the client gets every byte, by notification or read, exactly once
per seq and byte-exact.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from pathlib import Path
from typing import Any

TIMEOUT = 10.0
OUTPUT_SIZE = 3 * 1024 * 1024  # three times the 1 MiB retention cap
DIE_AFTER = 256 * 1024  # output bytes the first client receives before its connection dies


class DyingTransport:
    """Server-side transport whose peer vanishes while an output notification is sent."""

    kind = "line"

    def __init__(self) -> None:
        self.label = "dying test transport"
        self.inbound: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.outbound: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.dead = False
        self.output_bytes = 0

    async def receive(self) -> bytes | None:
        return await self.inbound.get()  # EOF is never seen: only the failed send tells

    async def send(self, data: bytes) -> None:
        if self.dead:
            raise ConnectionResetError("peer gone")
        msg = json.loads(data)
        if msg.get("method") == "process/output":
            size = len(base64.b64decode(msg["params"]["chunk"]))
            if self.output_bytes + size > DIE_AFTER:
                self.dead = True
                self.outbound.put_nowait(None)
                raise ConnectionResetError("peer gone mid-stream")
            self.output_bytes += size
        self.outbound.put_nowait(data)

    async def aclose(self) -> None:
        self.dead = True
        self.outbound.put_nowait(None)


class DyingClient:
    """The peer of :class:`DyingTransport`: requests in, replies and notifications out."""

    def __init__(self, transport: DyingTransport) -> None:
        self._transport = transport
        self._next_id = 0
        self.notifications: list[dict[str, Any]] = []
        self.eof = False

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        self._next_id += 1
        await self.send({"id": self._next_id, "method": method, "params": params})
        while True:
            msg = await self.next_message()
            assert msg is not None, f"connection died before the reply to {method}"
            if msg.get("id") == self._next_id:
                assert "result" in msg, msg
                return msg["result"]

    async def send(self, msg: dict[str, Any]) -> None:
        self._transport.inbound.put_nowait(json.dumps(msg).encode())

    async def next_message(self) -> dict[str, Any] | None:
        data = await self._transport.outbound.get()
        if data is None:
            self.eof = True
            return None
        msg: dict[str, Any] = json.loads(data)
        if "method" in msg:
            self.notifications.append(msg)
        return msg


def _take_output(notifications: list[dict[str, Any]], got: dict[int, bytes]) -> None:
    for msg in notifications:
        if msg.get("method") == "process/output":
            params = msg["params"]
            got[params["seq"]] = base64.b64decode(params["chunk"])


async def test_lossless_output_survives_death_mid_stream_and_resume(
    inprocess_server: Any, tmp_path: Path
) -> None:
    payload = os.urandom(OUTPUT_SIZE)
    big = tmp_path / "big.bin"
    big.write_bytes(payload)
    srv = inprocess_server(lossless_output=True, detach_ttl=30.0)

    transport = DyingTransport()

    a = DyingClient(transport)
    a_task = asyncio.create_task(srv.server.processor(transport).run())
    try:
        session_id = (await a.call("initialize", {"clientName": "pytest"}))["sessionId"]
        await a.send({"method": "initialized", "params": {}})
        await a.call(
            "process/start",
            {
                "processId": "big",
                "argv": ["cat", str(big)],
                "cwd": str(tmp_path),
                "env": {"PATH": "/usr/bin:/bin"},
                "tty": False,
                "sandbox": None,
            },
        )
        async with asyncio.timeout(TIMEOUT):
            while await a.next_message() is not None:
                pass
        # The send that failed ends the first connection; the session detaches.
        await asyncio.wait_for(a_task, TIMEOUT)
    finally:
        if not a_task.done():
            transport.inbound.put_nowait(None)
            await asyncio.wait_for(a_task, TIMEOUT)
    got: dict[int, bytes] = {}
    _take_output(a.notifications, got)
    assert got, "the first connection received part of the output"
    assert sum(map(len, got.values())) <= DIE_AFTER
    assert sorted(got) == list(range(1, len(got) + 1))

    b = await srv.connect()
    assert await b.initialize(resume_session_id=session_id) == session_id
    after = max(got)
    async with asyncio.timeout(30):
        while True:
            result = await b.call(
                "process/read", {"processId": "big", "afterSeq": after, "waitMs": 2000}
            )
            for chunk in result["chunks"]:
                data = base64.b64decode(chunk["chunk"])
                assert got.setdefault(chunk["seq"], data) == data
            after = result["nextSeq"] - 1
            if result["closed"]:
                break
    late: list[dict[str, Any]] = []
    while not b.notifications.empty():
        late.append(b.notifications.get_nowait())
    _take_output(late, got)
    assert result["exitCode"] == 0
    seqs = sorted(got)
    assert seqs[0] == 1
    joined = b"".join(got[s] for s in seqs)
    assert len(joined) == len(payload)
    assert joined == payload
