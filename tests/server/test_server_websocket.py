"""A real ``exec-server serve`` child over a real WebSocket (PROTOCOL.md §2-§4, §15.3-§15.4)."""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from ws_frames import client_frame, read_frame, upgraded

TIMEOUT = 10.0
Rpc = Callable[[str], Awaitable[Any]]


async def test_announces_url_and_handshake(server: Any, rpc: Rpc) -> None:
    assert server.url.startswith("ws://127.0.0.1:")
    assert int(server.url.rsplit(":", 1)[1]) > 0
    client = await rpc(server.url)
    result = await client.call(
        "initialize", {"clientName": "codex-environment", "resumeSessionId": None}
    )
    assert uuid.UUID(result["sessionId"]).version == 4
    assert result["environmentInfo"]["shell"]["path"].startswith("/")
    await client.notify("initialized", {})
    assert await client.call("environment/status") == {"status": "ready"}


async def test_malformed_json_keeps_connection_usable(server: Any, rpc: Rpc) -> None:
    """§15.3 test 12."""
    client = await rpc(server.url)
    await client.send_raw("not-json")
    reply = await client.response(-1)
    assert reply["error"]["code"] == -32600
    assert reply["error"]["message"].startswith(
        "failed to parse websocket JSON-RPC message from exec-server websocket 127.0.0.1:"
    )
    await client.send_raw("[]")  # batches are malformed in the target
    assert (await client.response(-1))["error"]["code"] == -32600
    session_id = await client.initialize()
    assert uuid.UUID(session_id)


@pytest.mark.parametrize(
    "params",
    [
        b'{"path":"/tmp/\xff\xfe"}',  # fs/getMetadata answered at once
        b'{"path":"/tmp/\xff","dataBase64":"","sandbox":null}',  # started in a worker
        b'{"path":"/tmp/\xff","dataBase64":"' + b"QUFB" * 30000 + b'","sandbox":null}',  # big
    ],
    ids=["now", "start", "big"],
)
async def test_invalid_utf8_in_params_is_a_malformed_message(
    server: Any, rpc: Rpc, params: bytes
) -> None:
    """Raw bytes that are not UTF-8 inside params (a path): the envelope is read
    without looking into them, so they used to fail later as an internal error
    (-32603, logged with a traceback). Now the request gets -32600 with the
    malformed-message text, under its own id (upstream, which parses the whole
    message at once, answers id -1); the connection keeps serving."""
    client = await rpc(server.url)
    await client.initialize()
    method = b"fs/writeFile" if b"dataBase64" in params else b"fs/getMetadata"
    await client.send_raw(b'{"id":5,"method":"' + method + b'","params":' + params + b"}")
    reply = await client.response(5)
    assert reply["error"]["code"] == -32600
    assert reply["error"]["message"].startswith(
        "failed to parse websocket JSON-RPC message from exec-server websocket 127.0.0.1:"
    )
    assert reply["error"]["message"].endswith(": Invalid UTF-8 encoded string")
    assert await client.call("environment/status") == {"status": "ready"}
    assert "internal error" not in server.stderr_text()
    assert "Traceback" not in server.stderr_text()


@pytest.mark.parametrize("idle", [True, False], ids=["on-arrival", "queued"])
async def test_deeply_nested_message_is_malformed_and_connection_survives(
    server: Any, rpc: Rpc, idle: bool
) -> None:
    """5000 nested arrays in params: the decoder's RecursionError escaped, logged a
    traceback and dropped the connection (on an idle connection, from the socket
    callback, without a close frame). Now: the malformed-message error."""
    client = await rpc(server.url)
    await client.initialize()
    deep = "[" * 5000 + "]" * 5000
    message = '{"id":5,"method":"fs/getMetadata","params":{"path":"/tmp","x":' + deep + "}}"
    if idle:
        await client.send_raw(message)
    else:  # behind a request still running, so it is decoded on the queued path
        await client.send(
            {"id": 4, "method": "process/start", "params": {
                "processId": "p", "argv": ["/bin/true"], "cwd": "/", "env": {}, "tty": False,
                "sandbox": None}}
        )
        await client.send_raw(message)
        await client.response(4)
    reply = await client.response(-1)
    assert reply["error"]["code"] == -32600
    assert "recursion" in reply["error"]["message"]
    assert reply["error"]["message"].startswith(
        "failed to parse websocket JSON-RPC message from exec-server websocket 127.0.0.1:"
    )
    assert await client.call("environment/status") == {"status": "ready"}
    assert "Traceback" not in server.stderr_text()


async def test_unknown_method_and_gating(server: Any, rpc: Rpc) -> None:
    client = await rpc(server.url)
    reply = await client.request("no/such", {}, msg_id=7)
    assert reply == {
        "id": 7,
        "error": {"code": -32601, "message": "exec-server stub does not implement `no/such` yet"},
    }
    reply = await client.request("fs/getMetadata", {"path": "/"})
    assert reply["error"] == {
        "code": -32600,
        "message": "client must call initialize before using filesystem methods",
    }
    reply = await client.request("process/read", {"processId": "p"})
    assert reply["error"] == {
        "code": -32600,
        "message": "client must call initialize before using exec methods",
    }
    await client.call("initialize", {"clientName": "t"})
    reply = await client.request("process/read", {"processId": "p"})
    assert reply["error"]["message"] == "client must send initialized before using exec methods"


async def test_binary_frames_and_jsonrpc_member_accepted(server: Any) -> None:
    async with connect(server.url, compression=None) as ws:
        await ws.send(
            b'{"jsonrpc":"2.0","id":"b1","method":"initialize","params":{"clientName":"t"}}'
        )
        raw = await asyncio.wait_for(ws.recv(), TIMEOUT)
        assert isinstance(raw, str)  # we always answer with text frames
        msg = json.loads(raw)
        assert msg["id"] == "b1" and "sessionId" in msg["result"]
        assert "jsonrpc" not in msg


async def test_pipelined_requests_all_answered(server: Any, rpc: Rpc, tmp_path: Any) -> None:
    """Codex sends ids 2-8 before any reply (CLIENT_COMPAT.md §0.3)."""
    client = await rpc(server.url)
    await client.send({"id": 1, "method": "initialize", "params": {"clientName": "c"}})
    await client.notify("initialized", {})
    paths = [tmp_path / "a" / ".git", tmp_path / ".git", tmp_path]
    for i, path in enumerate(paths * 3, start=2):
        await client.send(
            {
                "id": i,
                "method": "fs/getMetadata",
                "params": {"path": path.as_uri(), "sandbox": None},
            }
        )
    await client.send({"id": 100, "method": "no/such"})
    assert "sessionId" in (await client.response(1))["result"]
    for i, path in enumerate(paths * 3, start=2):
        reply = await client.response(i)
        if path == tmp_path:
            assert reply["result"]["isDirectory"] is True
        else:
            assert reply["error"]["code"] == -32004
    assert (await client.response(100))["error"]["code"] == -32601


async def test_oversized_message_gets_error_and_connection_survives(
    server_factory: Callable[..., Any], rpc: Rpc
) -> None:
    srv = server_factory("--max-message-size", "64K")
    client = await rpc(srv.url)
    await client.initialize()
    big = json.dumps({"id": 42, "method": "fs/writeFile", "params": {"dataBase64": "A" * 200_000}})
    await client.send_raw(big)
    reply = await client.response(42)
    assert reply["error"]["code"] == -32600
    assert "too large" in reply["error"]["message"]
    assert "65536" in reply["error"]["message"]
    # id not first: answered with -1
    await client.send_raw(json.dumps({"method": "x", "id": 43, "params": "B" * 100_000}))
    assert "too large" in (await client.response(-1))["error"]["message"]
    assert await client.call("environment/status") == {"status": "ready"}


async def test_oversized_fragmented_message_is_discarded(
    server_factory: Callable[..., Any],
) -> None:
    srv = server_factory("--max-message-size", "64K")
    async with connect(srv.url, compression=None) as ws:
        head = '{"id":5,"method":"fs/writeFile","params":{"dataBase64":"'
        fragments = [head] + ["A" * 32768] * 10 + ['"}}']
        await ws.send(fragments)  # one message in 12 frames (~320 KiB)
        msg = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))
        assert msg["id"] == 5 and "too large" in msg["error"]["message"]
        await ws.send('{"id":6,"method":"environment/status"}')
        msg = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))
        assert msg == {"id": 6, "result": {"status": "ready"}}


async def test_default_limit_accepts_64_mib(server: Any, rpc: Rpc) -> None:
    client = await rpc(server.url)
    payload = "x" * (64 << 20)
    reply = await client.request("environment/status", {"padding": payload}, timeout=60)
    assert reply["result"] == {"status": "ready"}


async def test_many_concurrent_connections(server: Any, rpc: Rpc) -> None:
    clients = await asyncio.gather(*(rpc(server.url) for _ in range(50)))
    ids = await asyncio.gather(*(c.initialize() for c in clients))
    assert len(set(ids)) == 50
    replies = await asyncio.gather(*(c.call("environment/status") for c in clients))
    assert all(r == {"status": "ready"} for r in replies)


async def test_tcp_nodelay_on_accepted_socket() -> None:
    """In-process server, so the accepted (server-side) socket can be inspected."""
    from exec_server.config import ServerConfig
    from exec_server.server.app import ExecServer
    from exec_server.server.services import ServerServices
    from exec_server.transport.listen import ListenAddress

    config = ServerConfig()
    srv = ExecServer(config, ServerServices(config))
    ws_server = await srv.listen_websocket(ListenAddress("127.0.0.1", 0))
    try:
        port = next(iter(ws_server.sockets)).getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}", compression=None) as ws:
            await ws.send('{"id":1,"method":"environment/status"}')
            assert json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))["id"] == 1
            (conn,) = ws_server.connections
            assert conn.transport is not None
            sock = conn.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        ws_server.close()
        await ws_server.wait_closed()
        await srv.aclose()


async def test_unexpected_notification_closes(server: Any, rpc: Rpc) -> None:
    client = await rpc(server.url)
    await client.initialize()
    await client.notify("process/output", {})
    await client.wait_closed()


async def test_resume_keeps_processes_then_ttl_kills_them(
    wait_until: Callable[..., Awaitable[None]],
    server_factory: Callable[..., Any],
    rpc: Rpc,
    tmp_path: Any,
) -> None:
    srv = server_factory("--detach-ttl", "1")
    a = await rpc(srv.url)
    session_id = await a.initialize()
    start = {
        "processId": "p1",
        "argv": ["/bin/sleep", "60"],
        "cwd": str(tmp_path),
        "env": {"PATH": "/usr/bin:/bin"},
        "tty": False,
        "sandbox": None,
    }
    await a.call("process/start", start)
    await wait_until(lambda: bool(srv.child_pids()))
    children = srv.child_pids()

    b = await rpc(srv.url)
    reply = await b.request("initialize", {"clientName": "t", "resumeSessionId": session_id})
    assert reply["error"] == {
        "code": -32600,
        "message": f"session {session_id} is already attached to another connection",
    }
    await a.aclose()
    # The failed initialize may be retried on the same connection (§4.1 step 3);
    # it succeeds as soon as the server has processed a's disconnect.
    async with asyncio.timeout(TIMEOUT):
        while True:
            reply = await b.request(
                "initialize", {"clientName": "t", "resumeSessionId": session_id}
            )
            if "result" in reply:
                break
            assert "already attached" in reply["error"]["message"]
    assert reply["result"]["sessionId"] == session_id
    await b.notify("initialized", {})
    read = await b.call("process/read", {"processId": "p1", "afterSeq": 0, "waitMs": 0})
    assert read["exited"] is False and read["closed"] is False
    assert srv.child_pids() == children
    await b.aclose()

    await wait_until(lambda: not srv.child_pids())  # killed when the TTL expired
    c = await rpc(srv.url)
    reply = await c.request("initialize", {"clientName": "t", "resumeSessionId": session_id})
    assert reply["error"] == {"code": -32600, "message": f"unknown session id {session_id}"}


async def test_ping_is_answered(server: Any) -> None:
    async with connect(server.url, compression=None) as ws:
        pong = await ws.ping(b"hello")
        await asyncio.wait_for(pong, TIMEOUT)


async def test_plain_http_is_rejected_and_server_keeps_serving(server: Any, rpc: Rpc) -> None:
    host, port = server.url.removeprefix("ws://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    status = await asyncio.wait_for(reader.readline(), TIMEOUT)
    assert status.startswith(b"HTTP/1.1 4")
    writer.close()
    await writer.wait_closed()
    client = await rpc(server.url)
    assert uuid.UUID(await client.initialize())


async def test_tcp_drop_without_close_frame_detaches(server: Any, rpc: Rpc) -> None:
    """Codex drops TCP without a close frame at exit (CLIENT_COMPAT.md §7.1)."""
    a = await rpc(server.url)
    session_id = await a.initialize()
    a.ws.transport.abort()
    await a.wait_closed()
    b = await rpc(server.url)
    async with asyncio.timeout(TIMEOUT):
        while True:
            reply = await b.request(
                "initialize", {"clientName": "t", "resumeSessionId": session_id}
            )
            if "result" in reply:
                break
            assert "already attached" in reply["error"]["message"]
    assert reply["result"]["sessionId"] == session_id


async def test_root_path_with_a_query_is_served_other_paths_are_404(server: Any) -> None:
    """As upstream 0.163 (AUTH_AND_DISCOVERY.md §2.4): only ``/`` upgrades; a query is ignored."""
    async with connect(server.url + "/?x=1", compression=None) as ws:
        await ws.send('{"id":1,"method":"environment/status"}')
        assert json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))["result"] == {
            "status": "ready"
        }
    with pytest.raises(InvalidStatus) as info:
        async with connect(server.url + "/any/path", compression=None):
            pass
    assert info.value.response.status_code == 404


async def test_single_frame_far_over_the_limit_closes_with_1009(
    server_factory: Callable[..., Any], rpc: Rpc
) -> None:
    """The memory guard: a frame over 2x the limit (+1 MiB) is not buffered."""
    srv = server_factory("--max-message-size", "64K")
    async with connect(srv.url, compression=None, max_size=None) as ws:
        await ws.send("x" * (3 << 20))
        with pytest.raises(ConnectionClosed) as info:
            await asyncio.wait_for(ws.recv(), TIMEOUT)
        assert info.value.rcvd is not None and info.value.rcvd.code == 1009
    client = await rpc(srv.url)
    assert uuid.UUID(await client.initialize())


@pytest.mark.parametrize("size", [10, 100, 1000, 70_000, 3 << 20])
async def test_replies_of_every_frame_length_class(
    server: Any, rpc: Rpc, tmp_path: Any, size: int
) -> None:
    """7-bit, 16-bit and 64-bit WebSocket payload lengths (our frames are hand-built)."""
    import base64
    import os

    data = os.urandom(size)
    path = tmp_path / "blob"
    path.write_bytes(data)
    client = await rpc(server.url)
    await client.initialize()
    result = await client.call("fs/readFile", {"path": path.as_uri(), "sandbox": None})
    assert base64.b64decode(result["dataBase64"]) == data


async def test_bulk_output_arrives_complete_via_notifications(
    server: Any, rpc: Rpc, tmp_path: Any
) -> None:
    """32 MiB through process/output: every byte, seq numbers contiguous."""
    import base64

    total = 32 << 20
    client = await rpc(server.url)
    await client.initialize()
    await client.call(
        "process/start",
        {
            "processId": "bulk",
            "argv": ["/usr/bin/head", "-c", str(total), "/dev/zero"],
            "cwd": str(tmp_path),
            "env": {"PATH": "/usr/bin:/bin"},
            "tty": False,
            "sandbox": None,
        },
    )
    received = 0
    seqs: list[int] = []
    while True:
        note = await client.notification(timeout=30)
        params = note["params"]
        seqs.append(params["seq"])
        if note["method"] == "process/output":
            chunk = base64.b64decode(params["chunk"])
            assert chunk.count(0) == len(chunk)
            received += len(chunk)
        elif note["method"] == "process/closed":
            break
    assert received == total
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))


async def test_protocol_violation_fails_only_that_connection(server: Any, rpc: Rpc) -> None:
    """A frame with a reserved opcode: the server closes with 1002; others keep working."""
    other = await rpc(server.url)
    await other.initialize()
    bad = await rpc(server.url)
    bad.ws.transport.write(b"\x83\x80\x00\x00\x00\x00")  # FIN + opcode 3, masked, empty
    await bad.wait_closed()
    assert bad.ws.close_code == 1002
    assert await other.call("environment/status") == {"status": "ready"}


def _client_frame(payload: bytes, opcode: int = 1, fin: bool = True) -> bytes:
    """A client frame with a mask that changes the bytes (RFC 6455 §5.3)."""
    return client_frame(payload, opcode, fin, mask=b"\x11\x22\x33\x44")


async def test_frames_split_batched_then_ping_and_fragments(server: Any) -> None:
    """The server's own frame parser: frames across reads, several per read, and the
    hand-over to the library at a ping and a fragmented message."""
    reader, writer = await upgraded(server.url)

    def request(msg_id: int, pad: int = 0) -> bytes:
        return _init_request(msg_id, pad)

    async def reply_id() -> int:
        opcode, data = await read_frame(reader)
        assert opcode == 1
        return int(json.loads(data)["id"])

    big = _client_frame(request(1, 70000))  # 64-bit length
    for i in range(0, len(big), 4096):  # one frame over many reads
        writer.write(big[i : i + 4096])
        await writer.drain()
    assert await reply_id() == 1
    # Two frames in one write, the second split mid-header.
    two = _client_frame(request(2, 200)) + _client_frame(request(3))
    writer.write(two[:-30])
    await writer.drain()
    assert await reply_id() == 2
    writer.write(two[-30:])
    assert await reply_id() == 3
    # A ping, then a fragmented message, then a plain one: the library takes over.
    text = request(4)
    writer.write(
        _client_frame(b"p", opcode=9)
        + _client_frame(text[:10], fin=False)
        + _client_frame(text[10:], opcode=0)
        + _client_frame(request(5))
    )
    assert await read_frame(reader) == (10, b"p")
    assert await reply_id() == 4
    assert await reply_id() == 5
    writer.close()


async def test_lossless_bulk_output_byte_exact_via_notifications(
    server_factory: Callable[..., Any], rpc: Rpc, tmp_path: Any
) -> None:
    """Lossless mode over a real socket: the reader callback's sends, the hand-off to the
    capture task when the write buffer fills, and back; every byte once, in order."""
    import base64
    import os

    payload = os.urandom(8 << 20)
    (tmp_path / "big").write_bytes(payload)
    srv = server_factory("--lossless-output")
    client = await rpc(srv.url)
    await client.initialize()
    await client.call(
        "process/start",
        {
            "processId": "bulk",
            "argv": ["/bin/cat", str(tmp_path / "big")],
            "cwd": str(tmp_path),
            "env": {"PATH": "/usr/bin:/bin"},
            "tty": False,
            "sandbox": None,
        },
    )
    parts: list[bytes] = []
    seqs: list[int] = []
    while True:
        note = await client.notification(timeout=30)
        params = note["params"]
        seqs.append(params["seq"])
        if note["method"] == "process/output":
            parts.append(base64.b64decode(params["chunk"]))
        elif note["method"] == "process/closed":
            break
    assert seqs == list(range(1, len(seqs) + 1))
    assert b"".join(parts) == payload


async def _read_message(reader: asyncio.StreamReader, first: bytes) -> bytes:
    """The rest of a message whose first frame's two header bytes were read:
    its fragments, joined; only continuation frames may come between."""
    parts: list[bytes] = []
    b0, b1 = first
    while True:
        size = b1 & 0x7F
        if size == 126:
            size = int.from_bytes(await reader.readexactly(2), "big")
        elif size == 127:
            size = int.from_bytes(await reader.readexactly(8), "big")
        parts.append(await asyncio.wait_for(reader.readexactly(size), TIMEOUT))
        if b0 & 0x80:
            return b"".join(parts)
        b0, b1 = await asyncio.wait_for(reader.readexactly(2), TIMEOUT)
        assert b0 & 0x0F == 0, f"opcode {b0 & 0x0F} inside a fragmented message"


def _init_request(msg_id: int, pad: int = 0) -> bytes:
    return json.dumps(
        {"id": msg_id, "method": "initialize", "params": {"clientName": "x" * pad}}
    ).encode()


async def test_ping_between_fragments_is_answered_and_message_completes(server: Any) -> None:
    """RFC 6455 allows control frames between fragments: pong first, then the reply;
    fragmented messages keep working afterwards (also across reads)."""
    reader, writer = await upgraded(server.url)
    text = _init_request(1, 300)
    writer.write(
        _client_frame(text[:100], fin=False)
        + _client_frame(b"mid", opcode=9)
        + _client_frame(text[100:200], opcode=0, fin=False)
        + _client_frame(text[200:], opcode=0)
    )
    assert await read_frame(reader) == (10, b"mid")
    opcode, data = await read_frame(reader)
    assert (opcode, json.loads(data)["id"]) == (1, 1)
    # A second fragmented message split mid-frame over two writes.
    text = _init_request(2, 5000)
    frames = _client_frame(text[:3000], opcode=2, fin=False) + _client_frame(text[3000:], opcode=0)
    writer.write(frames[:3100])
    await writer.drain()
    writer.write(frames[3100:])
    opcode, data = await read_frame(reader)
    assert json.loads(data)["id"] == 2
    writer.close()


@pytest.mark.parametrize(
    "frames",
    [
        # a new Text frame while a fragmented message is open
        _client_frame(b'{"id":', fin=False) + _client_frame(b"{}"),
        # a continuation frame with no message to continue
        _client_frame(b"{}", opcode=0),
    ],
    ids=["text-inside-fragments", "orphan-continuation"],
)
async def test_fragmentation_violations_close_with_1002(server: Any, frames: bytes) -> None:
    reader, writer = await upgraded(server.url)
    writer.write(frames)
    opcode, data = await read_frame(reader)
    assert opcode == 8
    assert int.from_bytes(data[:2], "big") == 1002
    writer.close()


async def test_output_made_while_a_big_reply_is_sent_follows_it_whole(
    server: Any, tmp_path: Any
) -> None:
    """A client starts receiving a 32 MiB reply (a fragmented message) and, before
    reading the rest, makes a process print: its notifications queue behind the
    reply and arrive whole after it (messages never interleave)."""
    import base64
    import os

    data = os.urandom(24 << 20)
    (tmp_path / "big").write_bytes(data)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def message(msg_id: int, method: str, params: dict[str, Any]) -> bytes:
        text = json.dumps({"id": msg_id, "method": method, "params": params})
        return _client_frame(text.encode())

    reader, writer = await upgraded(server.url)
    writer.write(_client_frame(_init_request(1)))
    assert json.loads((await read_frame(reader))[1])["id"] == 1
    writer.write(_client_frame(b'{"method":"initialized","params":{}}'))
    writer.write(message(2, "process/start", {
        "processId": "p", "argv": ["/bin/cat", str(fifo)], "cwd": str(tmp_path),
        "env": {"PATH": "/usr/bin:/bin"}, "tty": False, "sandbox": None,
    }))
    assert json.loads((await read_frame(reader))[1])["result"]["processId"] == "p"
    writer.write(message(10, "fs/readFile", {"path": (tmp_path / "big").as_uri(), "sandbox": None}))
    first = await asyncio.wait_for(reader.readexactly(2), TIMEOUT)  # the reply has begun
    assert first[0] in (0x01, 0x81)  # a Text frame, the first of several or the only one

    def feed_fifo() -> None:
        with open(fifo, "wb") as pipe:  # cat has it open for reading
            pipe.write(b"tick\n")

    await asyncio.wait_for(asyncio.to_thread(feed_fifo), TIMEOUT)
    reply = json.loads(await _read_message(reader, first))
    assert base64.b64decode(reply["result"]["dataBase64"]) == data
    output = b""
    while True:
        opcode, payload = await read_frame(reader)
        assert opcode == 1
        note = json.loads(payload)
        if note["method"] == "process/output":
            output += base64.b64decode(note["params"]["chunk"])
        elif note["method"] == "process/closed":
            break
    assert output == b"tick\n"
    writer.close()
