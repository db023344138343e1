"""``http/request`` and ``http/request/bodyDelta`` against a local HTTP peer
(PROTOCOL_CURRENT.md §9), through a real server subprocess and WebSocket."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

_ENV_EXTRA = {"PEER_TOKEN": "tok-123", "EMPTY_VAR": "", "OPENAI_API_KEY": "sk-secret"}


@pytest.fixture
async def conn(
    server_factory: Callable[..., Any], rpc: Callable[[str], Awaitable[Any]]
) -> Any:
    srv = server_factory(env={**os.environ, **_ENV_EXTRA})
    client = await rpc(srv.url)
    await client.initialize()
    client.server = srv
    return client


def _req(url: str, **extra: Any) -> dict[str, Any]:
    return {"method": "GET", "url": url, "headers": [], "requestId": "r1", **extra}


async def _body(
    client: Any, request_id: str, first_seq: int = 1
) -> tuple[bytes, list[dict[str, Any]]]:
    """Collect a streamed body's deltas up to ``done``; checks numbering and framing."""
    frames = []
    while True:
        note = await client.notification("http/request/bodyDelta", timeout=60)
        params = note["params"]
        assert params["requestId"] == request_id
        frames.append(params)
        if params["done"]:
            break
    assert [f["seq"] for f in frames] == list(range(first_seq, first_seq + len(frames)))
    assert frames[-1]["deltaBase64"] == ""
    assert all(f["error"] is None for f in frames[:-1])
    data = b"".join(base64.b64decode(f["deltaBase64"]) for f in frames)
    return data, frames


async def test_buffered_request_keeps_header_order_and_repeats(conn: Any, http_peer: Any) -> None:
    headers = [
        {"name": "X-A", "value": "1"},
        {"name": "x-a", "value": "2"},
        {"name": "x-b", "value": "caf\u00e9"},
        {"name": "authorization", "value": "Bearer ", "valueEnvVar": "PEER_TOKEN"},
    ]
    body = base64.b64encode(b"payload").decode()
    result = await conn.call(
        "http/request",
        _req(http_peer.base + "/echo", method="post", headers=headers, bodyBase64=body),
    )
    assert result["status"] == 200
    names = [(h["name"], h["value"]) for h in result["headers"]]
    # lower-case names, repeats in order, the non-ASCII value left out
    assert [n for n in names if n[0] == "x-multi"] == [("x-multi", "a"), ("x-multi", "b")]
    assert "x-bin" not in {n for n, _ in names}
    echoed = json.loads(base64.b64decode(result["bodyBase64"]))
    assert echoed["method"] == "post"  # the caller's case goes out
    assert echoed["body"] == "payload"
    sent = [(k.lower(), v) for k, v in echoed["headers"]]
    mine = [h for h in sent if h[0] in ("x-a", "x-b", "authorization")]
    assert mine == [
        ("x-a", "1"),
        ("x-a", "2"),
        ("x-b", "caf\u00e9".encode().decode("latin-1")),  # UTF-8 bytes on the wire
        ("authorization", "Bearer tok-123"),
    ]
    assert ("accept", "*/*") in sent
    assert not any(k == "user-agent" for k, _ in sent)


async def test_any_status_is_a_result(conn: Any, http_peer: Any) -> None:
    for status in (404, 500):
        result = await conn.call("http/request", _req(f"{http_peer.base}/status/{status}"))
        assert result["status"] == status and result["bodyBase64"] == ""


async def test_redirect_policy(conn: Any, http_peer: Any) -> None:
    followed = await conn.call("http/request", _req(http_peer.base + "/redirect"))
    assert followed["status"] == 200
    assert json.loads(base64.b64decode(followed["bodyBase64"]))["method"] == "GET"
    stopped = await conn.call(
        "http/request", _req(http_peer.base + "/redirect", redirectPolicy="stop")
    )
    assert stopped["status"] == 302
    assert {"name": "location", "value": "/echo"} in stopped["headers"]


@pytest.mark.parametrize(
    ("var", "message"),
    [
        ("OPENAI_API_KEY", "cannot use executor environment variable OPENAI_API_KEY"),
        ("openai_api_key", "cannot use executor environment variable openai_api_key"),
        ("AWS_SECRET_ACCESS_KEY", "cannot use executor environment variable AWS_SECRET_ACCESS_KEY"),
        ("NO_SUCH_VAR_E29", "requires executor environment variable NO_SUCH_VAR_E29"),
        ("", "requires executor environment variable "),
        ("EMPTY_VAR", "requires a non-empty executor environment variable EMPTY_VAR"),
    ],
)
async def test_value_env_var_refusals(conn: Any, http_peer: Any, var: str, message: str) -> None:
    headers = [{"name": "authorization", "value": "Bearer ", "valueEnvVar": var}]
    reply = await conn.request("http/request", _req(http_peer.base + "/echo", headers=headers))
    assert reply["error"] == {
        "code": -32602,
        "message": f"http/request header authorization {message}",
    }
    assert http_peer.requests == []  # nothing was sent


@pytest.mark.parametrize(
    ("params", "code", "message"),
    [
        ({"url": "nope"}, -32602, "http/request url is invalid: relative URL without a base"),
        ({"url": "http://"}, -32602, "http/request url is invalid: empty host"),
        ({"url": "ftp://x/"}, -32602, "http/request only supports http and https URLs, got ftp"),
        ({"url": "file:///etc/passwd"}, -32602,
         "http/request only supports http and https URLs, got file"),
        ({"method": "a b"}, -32602, "http/request method is invalid: invalid HTTP method"),
        ({"method": ""}, -32602, "http/request method is invalid: invalid HTTP method"),
        ({"headers": [{"name": "bad name", "value": "x"}]}, -32602,
         "http/request header name is invalid: invalid HTTP header name"),
        ({"headers": [{"name": "x", "value": "a\nb"}]}, -32602,
         "http/request header value is invalid for x: failed to parse header value"),
        ({"url": "http://127.0.0.1:1/"}, -32603,
         "http/request failed: error sending request for url (http://127.0.0.1:1/)"),
        ({"timeoutMs": 0}, -32603, "http/request failed: route-aware request timed out"),
    ],
)
async def test_refused_and_failed_requests(
    conn: Any, http_peer: Any, params: dict[str, Any], code: int, message: str
) -> None:
    reply = await conn.request("http/request", {**_req(http_peer.base + "/echo"), **params})
    assert reply["error"] == {"code": code, "message": message}


@pytest.mark.parametrize(
    "params",
    [
        {"headers": None},
        {"headers": {"a": "b"}},
        {"streamResponse": None},
        {"redirectPolicy": "never"},
        {"bodyBase64": "!!"},
        {"timeoutMs": -1},
        {"requestId": None},
    ],
)
async def test_params_that_do_not_decode(conn: Any, http_peer: Any, params: dict[str, Any]) -> None:
    reply = await conn.request("http/request", {**_req(http_peer.base + "/echo"), **params})
    assert reply["error"]["code"] == -32602


async def test_missing_request_id_is_refused_even_buffered(conn: Any, http_peer: Any) -> None:
    params = _req(http_peer.base + "/echo")
    del params["requestId"]
    reply = await conn.request("http/request", params)
    assert reply["error"] == {"code": -32602, "message": "missing field `requestId`"}


async def test_before_initialize(server: Any, rpc: Callable[[str], Awaitable[Any]]) -> None:
    client = await rpc(server.url)
    reply = await client.request("http/request", _req("http://127.0.0.1:1/"))
    assert reply["error"] == {
        "code": -32600,
        "message": "client must call initialize before using http methods",
    }


async def test_streamed_head_comes_before_the_body(conn: Any, http_peer: Any) -> None:
    result = await conn.call("http/request", _req(http_peer.base + "/hold", streamResponse=True))
    assert result["status"] == 200 and result["bodyBase64"] == ""
    first = await conn.notification("http/request/bodyDelta")
    assert first["params"] == {
        "requestId": "r1", "seq": 1, "deltaBase64": "YWJj", "done": False, "error": None,
    }
    assert not http_peer.release.is_set()  # the rest is still withheld by the peer
    http_peer.release.set()
    data, frames = await _body(conn, "r1", first_seq=2)
    assert b"abc" + data == b"abcdef"
    assert frames[-1]["error"] is None
    # the answer preceded every delta on the wire
    kinds = [m.get("method", "reply") for m in conn.all_messages if m.get("id") != 1001]
    assert kinds.index("reply") < kinds.index("http/request/bodyDelta")


async def test_empty_streamed_body_is_one_done_frame(conn: Any, http_peer: Any) -> None:
    result = await conn.call(
        "http/request", _req(http_peer.base + "/status/204", streamResponse=True)
    )
    assert result["status"] == 204
    data, frames = await _body(conn, "r1")
    assert data == b"" and len(frames) == 1


async def test_streamed_64_mib_body(conn: Any, http_peer: Any) -> None:
    size = 64 << 20
    await conn.call("http/request", _req(f"{http_peer.base}/bytes/{size}", streamResponse=True))
    digest = hashlib.sha256()
    total = 0
    seq = 0
    while True:
        params = (await conn.notification("http/request/bodyDelta", timeout=60))["params"]
        seq += 1
        assert params["seq"] == seq
        if params["done"]:
            assert params["error"] is None
            break
        chunk = base64.b64decode(params["deltaBase64"])
        assert 0 < len(chunk) <= 1 << 20
        digest.update(chunk)
        total += len(chunk)
    assert total == size
    assert digest.digest() == hashlib.sha256(http_peer.pattern(size)).digest()


async def test_buffered_64_mib_body(conn: Any, http_peer: Any) -> None:
    size = 64 << 20
    result = await conn.call(
        "http/request", _req(f"{http_peer.base}/bytes/{size}"), timeout=60
    )
    body = base64.b64decode(result["bodyBase64"])
    assert len(body) == size
    assert hashlib.sha256(body).digest() == hashlib.sha256(http_peer.pattern(size)).digest()


async def test_peer_closing_mid_body(conn: Any, http_peer: Any) -> None:
    reply = await conn.request("http/request", _req(http_peer.base + "/trunc"))
    assert reply["error"] == {
        "code": -32603,
        "message": "failed to read http/request response body: error decoding response body",
    }
    await conn.call("http/request", _req(http_peer.base + "/trunc", streamResponse=True))
    data, frames = await _body(conn, "r1")
    assert data == b"abc"
    assert frames[-1]["error"] == "error decoding response body"


async def test_timeouts(conn: Any, http_peer: Any) -> None:
    url = http_peer.base + "/nohead"
    reply = await conn.request("http/request", _req(url, timeoutMs=1500))
    assert reply["error"] == {
        "code": -32603,
        "message": f"http/request failed: error sending request for url ({url})",
    }
    # the deadline covers the body too: buffered, and streamed (a final error frame);
    # long enough for the headers and "abc" to arrive first on a loaded machine
    reply = await conn.request("http/request", _req(http_peer.base + "/hold", timeoutMs=1500))
    assert reply["error"]["message"] == (
        "failed to read http/request response body: error decoding response body"
    )
    await conn.call(
        "http/request", _req(http_peer.base + "/hold", timeoutMs=1500, streamResponse=True)
    )
    data, frames = await _body(conn, "r1")
    assert data == b"abc" and frames[-1]["error"] == "error decoding response body"


async def test_active_stream_id_is_reserved_until_done(conn: Any, http_peer: Any) -> None:
    await conn.call("http/request", _req(http_peer.base + "/hold", streamResponse=True))
    reply = await conn.request("http/request", _req(http_peer.base + "/echo", streamResponse=True))
    assert reply["error"] == {
        "code": -32602,
        "message": "http/request streamResponse requestId `r1` is already active",
    }
    # buffered requests reserve nothing and are not refused
    assert (await conn.call("http/request", _req(http_peer.base + "/echo")))["status"] == 200
    http_peer.release.set()
    await _body(conn, "r1")
    await conn.call("http/request", _req(http_peer.base + "/echo", streamResponse=True))
    await _body(conn, "r1")


async def test_a_held_body_blocks_no_one(
    conn: Any, http_peer: Any, rpc: Callable[[str], Awaitable[Any]]
) -> None:
    """While one request waits on a slow peer (buffered and streamed), later
    requests of the same connection and other connections are answered."""
    buffered = asyncio.ensure_future(
        conn.request("http/request", {**_req(http_peer.base + "/nohead"), "requestId": "b"})
    )
    await conn.call("http/request", _req(http_peer.base + "/hold", streamResponse=True))
    await conn.notification("http/request/bodyDelta")  # "abc"; "def" is held
    assert (await conn.call("environment/status", {}))["status"] == "ready"
    other = await rpc(conn.server.url)
    await other.initialize()
    assert (await other.call("environment/status", {}))["status"] == "ready"
    assert (await other.call("http/request", _req(http_peer.base + "/echo")))["status"] == 200
    assert not buffered.done()
    http_peer.release.set()
    assert (await buffered)["result"]["status"] == 200
    await _body(conn, "r1", first_seq=2)


async def test_body_waits_for_a_client_that_does_not_read(
    conn: Any, http_peer: Any
) -> None:
    """Backpressure: the server reads the peer's body only as fast as the
    client takes the deltas, so a stalled client stalls the peer (bounded memory)."""
    size = 256 << 20
    # Stop reading the WebSocket: the reader task takes no more frames.
    conn._reader.cancel()
    await asyncio.gather(conn._reader, return_exceptions=True)
    await conn.send({"id": 7, "method": "http/request",
                     "params": _req(f"{http_peer.base}/bytes/{size}", streamResponse=True)})
    # The peer cannot finish: its writes wait for the server, which waits for us.
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(http_peer.finished.wait(), 3)
    assert http_peer.written < size // 2
    status = Path(f"/proc/{conn.server.pid}/status").read_text()  # noqa: ASYNC240
    rss_kib = int(next(line.split()[1] for line in status.splitlines() if "VmRSS:" in line))
    assert rss_kib < 200 * 1024, rss_kib


async def test_disconnect_ends_the_http_exchanges(
    server_factory: Callable[..., Any], rpc: Callable[[str], Awaitable[Any]], http_peer: Any
) -> None:
    """A connection's streams and requests in flight end with it: the HTTP
    connection to the peer is closed, nothing keeps reading for nobody."""
    srv = server_factory()
    client = await rpc(srv.url)
    await client.initialize()
    await client.call("http/request", _req(http_peer.base + "/hold", streamResponse=True))
    await client.notification("http/request/bodyDelta")
    await client.aclose()
    async with asyncio.timeout(10):
        await http_peer.dropped.wait()


async def test_streamed_body_over_stdio(
    stdio_rpc: Callable[..., Awaitable[Any]], http_peer: Any
) -> None:
    client = await stdio_rpc()
    await client.initialize()
    size = 3 << 20
    await client.call("http/request", _req(f"{http_peer.base}/bytes/{size}", streamResponse=True))
    data, frames = await _body(client, "r1")
    assert data == http_peer.pattern(size) and frames[-1]["error"] is None
