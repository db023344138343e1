"""Requests answered straight from the socket callback (``Router.dispatch_now``).

An in-process server behind a real WebSocket listener, with test routes whose
``now`` and async handlers record which one answered. Checks that the shortcut
keeps arrival order, falls back on ``NotNow`` and on a full write buffer, maps
errors like the async path, and that the real ``fs/getMetadata``,
``fs/readFile`` and ``process/write`` answers are the same either way.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from websockets.asyncio.client import ClientConnection, connect

from exec_server.config import ServerConfig
from exec_server.exceptions import InvalidRequestError
from exec_server.rpc.listen import ListenAddress
from exec_server.server.app import ExecServer
from exec_server.server.router import NotNow, RequestContext
from exec_server.server.services import ServerServices

TIMEOUT = 10.0


class Key(msgspec.Struct):
    key: str


class Done(msgspec.Struct):
    key: str
    path: str


class Harness:
    def __init__(self, server: ExecServer, url: str, connections: set[Any]) -> None:
        self.server = server
        self.connections = connections
        self.url = url
        self.answered: list[tuple[str, str]] = []  # (key, "now" | "async")
        self.release = asyncio.Event()
        self._next = 0

    async def open(self) -> ClientConnection:
        ws = await connect(self.url, max_size=None)
        await ws.send(json.dumps({"id": 0, "method": "initialize", "params": {"clientName": "t"}}))
        assert json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))["id"] == 0
        await ws.send(json.dumps({"method": "initialized"}))
        # A round trip, so later requests find the connection idle.
        await ws.send(json.dumps({"id": -5, "method": "environment/status"}))
        assert json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))["id"] == -5
        return ws

    def request(self, method: str, params: dict[str, Any]) -> tuple[int, str]:
        self._next += 1
        return self._next, json.dumps({"id": self._next, "method": method, "params": params})


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    cfg = ServerConfig()
    server = ExecServer(cfg, ServerServices(cfg))
    ws_server = await server.listen_websocket(ListenAddress("127.0.0.1", 0))
    port = ws_server.sockets[0].getsockname()[1]
    h = Harness(server, f"ws://127.0.0.1:{port}", ws_server.connections)
    router = server.router

    def now(ctx: RequestContext, params: Key) -> Done:
        if params.key.startswith("async"):
            raise NotNow
        if params.key == "bad":
            raise InvalidRequestError("bad key")
        if params.key == "boom":
            raise RuntimeError("boom")
        h.answered.append((params.key, "now"))
        return Done(params.key, "now")

    async def slow(ctx: RequestContext, params: Key) -> Done:
        if params.key.startswith("async-hold"):
            await h.release.wait()
        h.answered.append((params.key, "async"))
        return Done(params.key, "async")

    router.add("test/now", Key, slow, "exec", now=now)
    try:
        yield h
    finally:
        ws_server.close()
        await ws_server.wait_closed()
        await server.aclose()


async def _replies(ws: ClientConnection, n: int) -> list[dict[str, Any]]:
    return [json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT)) for _ in range(n)]


async def test_idle_connection_is_answered_by_the_now_handler(harness: Harness) -> None:
    ws = await harness.open()
    rid, text = harness.request("test/now", {"key": "a"})
    await ws.send(text)
    (reply,) = await _replies(ws, 1)
    assert reply == {"id": rid, "result": {"key": "a", "path": "now"}}
    assert harness.answered == [("a", "now")]
    await ws.close()


async def test_not_now_falls_back_to_the_async_handler(harness: Harness) -> None:
    ws = await harness.open()
    rid, text = harness.request("test/now", {"key": "async-1"})
    await ws.send(text)
    (reply,) = await _replies(ws, 1)
    assert reply == {"id": rid, "result": {"key": "async-1", "path": "async"}}
    assert harness.answered == [("async-1", "async")]
    await ws.close()


async def test_requests_behind_a_waiting_one_keep_their_order(harness: Harness) -> None:
    """A now-capable request that arrives while an earlier one still runs is queued,
    not answered ahead of it."""
    ws = await harness.open()
    _, hold = harness.request("test/now", {"key": "async-hold"})
    _, quick = harness.request("test/now", {"key": "b"})
    await ws.send(hold)
    await ws.send(quick)
    # The quick request must still be unanswered while the held one waits.
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(ws.recv(), 0.3)
    assert harness.answered == []
    harness.release.set()
    replies = await _replies(ws, 2)
    assert [r["result"]["key"] for r in replies] == ["async-hold", "b"]
    # Queued behind the held one, so answered through the queue (async handler).
    assert harness.answered == [("async-hold", "async"), ("b", "async")]
    await ws.close()


async def test_errors_are_mapped_as_on_the_async_path(harness: Harness, caplog: Any) -> None:
    ws = await harness.open()
    bad_id, bad = harness.request("test/now", {"key": "bad"})
    boom_id, boom = harness.request("test/now", {"key": "boom"})
    typo_id, typo = harness.request("test/now", {"key": 5})
    for text in (bad, boom, typo):
        await ws.send(text)
    replies = {r["id"]: r["error"] for r in await _replies(ws, 3)}
    assert replies[bad_id] == {"code": -32600, "message": "bad key"}
    assert replies[boom_id] == {"code": -32603, "message": "internal error"}
    assert replies[typo_id]["code"] == -32602
    assert "Expected `str`, got `int`" in replies[typo_id]["message"]
    assert "boom" in caplog.text  # the traceback is logged, not sent
    # Still serving.
    rid, text = harness.request("test/now", {"key": "after"})
    await ws.send(text)
    assert (await _replies(ws, 1))[0]["id"] == rid
    await ws.close()


async def test_full_write_buffer_queues_instead(harness: Harness) -> None:
    """With the socket's write buffer over its limit the shortcut steps aside: the
    request goes through the queue and the async handler, which waits for room."""
    from exec_server.rpc.ws_server import WsConnection

    ws = await harness.open()
    (conn,) = [c for c in harness.connections if isinstance(c, WsConnection)]
    conn.pause_writing()  # as asyncio does over the high-water mark
    try:
        assert not conn.send_ready
        rid, text = harness.request("test/now", {"key": "paused"})
        await ws.send(text)
        async with asyncio.timeout(TIMEOUT):
            while not harness.answered:
                await asyncio.sleep(0.01)
        assert harness.answered == [("paused", "async")]
    finally:
        conn.resume_writing()
    (reply,) = await _replies(ws, 1)
    assert reply == {"id": rid, "result": {"key": "paused", "path": "async"}}
    await ws.close()


async def test_real_routes_give_the_same_answers_both_ways(
    harness: Harness, tmp_path: Any
) -> None:
    """fs/getMetadata and fs/readFile answered now equal the async handlers' answers."""
    small = tmp_path / "small.txt"
    small.write_bytes(b"hello")
    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * (200 * 1024))  # over the inline-read limit: async path
    ws = await harness.open()
    calls = [
        ("fs/getMetadata", {"path": f"file://{small}"}),
        ("fs/getMetadata", {"path": str(small)}),
        ("fs/getMetadata", {"path": str(tmp_path / "missing")}),
        ("fs/readFile", {"path": f"file://{small}"}),
        ("fs/readFile", {"path": str(big)}),
        ("fs/readFile", {"path": f"file://{tmp_path}"}),
        ("fs/readFile", {"path": str(tmp_path / "missing")}),
    ]
    now_answers = []
    for method, params in calls:
        rid, text = harness.request(method, params)
        await ws.send(text)
        (reply,) = await _replies(ws, 1)
        assert reply["id"] == rid
        now_answers.append({k: v for k, v in reply.items() if k != "id"})
    # Same calls with the now handlers removed from the router.
    router = harness.server.router
    saved = dict(router._routes)
    for method in ("fs/getMetadata", "fs/readFile"):
        route = router._routes.pop(method)
        router.add(method, route.params_type, route.handler, route.family)
    try:
        for (method, params), expected in zip(calls, now_answers, strict=True):
            rid, text = harness.request(method, params)
            await ws.send(text)
            (reply,) = await _replies(ws, 1)
            reply.pop("id")
            if method == "fs/getMetadata" and "result" in reply:
                for key in ("createdAtMs", "modifiedAtMs"):
                    assert reply["result"][key] == expected["result"][key]
            assert reply == expected
    finally:
        router._routes.clear()
        router._routes.update(saved)
    assert base64.b64decode(now_answers[3]["result"]["dataBase64"]) == b"hello"
    assert now_answers[2]["error"]["code"] == -32004
    assert now_answers[5]["error"]["code"] == -32600
    assert len(base64.b64decode(now_answers[4]["result"]["dataBase64"])) == 200 * 1024
    await ws.close()


async def test_cork_writes_held_frames_in_one_send(harness: Harness) -> None:
    """Frames sent while corked leave in one transport write, in order; a big
    frame flushes what is held first; the peer sees every frame intact."""
    from exec_server.rpc.ws_server import WsConnection

    ws = await harness.open()
    (conn,) = [c for c in harness.connections if isinstance(c, WsConnection)]
    assert conn.transport is not None
    writes: list[bytes] = []
    real_write = conn.transport.write

    def counting_write(data: bytes | bytearray | memoryview) -> None:
        writes.append(bytes(data))
        real_write(data)

    conn.transport.write = counting_write  # type: ignore[method-assign]
    big = b'"' + b"x" * (70 * 1024) + b'"'
    try:
        conn.cork()
        conn.send_nowait(b'"one"')
        conn.send_nowait(b'"two"')
        assert writes == []
        conn.send_nowait(big)  # over the join limit: held frames go first
        conn.send_nowait(b'"three"')
        conn.uncork()
    finally:
        conn.transport.write = real_write  # type: ignore[method-assign]
    assert len(writes) == 4  # [one+two], big header, big payload, [three]
    assert [await asyncio.wait_for(ws.recv(), TIMEOUT) for _ in range(4)] == [
        '"one"',
        '"two"',
        big.decode(),
        '"three"',
    ]
    await ws.close()
