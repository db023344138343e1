"""``http_request`` on the local and the remote backend: same results, same errors."""

from __future__ import annotations

import json
from typing import Any

import pytest

from exec_server.exceptions import InternalError, InvalidParamsError
from exec_server.protocol.types.http import RequestHeader


@pytest.fixture(autouse=True)
def _token(monkeypatch: pytest.MonkeyPatch) -> None:
    # Set before ``backend`` starts the remote server, which inherits it.
    monkeypatch.setenv("E29_BACKEND_TOKEN", "tok-b")


async def test_buffered(backend: Any, http_peer: Any) -> None:
    response = await backend.http_request(
        "POST",
        http_peer.base + "/echo",
        headers=[("x-a", "1"), ("x-a", "2"), RequestHeader("authorization", "Bearer ",
                                                           "E29_BACKEND_TOKEN")],
        body=b"hi",
    )
    assert response.status == 200
    assert response.header_values("X-Multi") == ["a", "b"]
    echoed = json.loads(await response.read())
    sent = [(k.lower(), v) for k, v in echoed["headers"]]
    assert [h for h in sent if h[0] in ("x-a", "authorization")] == [
        ("x-a", "1"), ("x-a", "2"), ("authorization", "Bearer tok-b"),
    ]
    assert echoed["body"] == "hi"
    assert [chunk async for chunk in response] == [response.body]


async def test_streamed(backend: Any, http_peer: Any) -> None:
    size = 5 << 20
    async with await backend.http_request(
        "GET", f"{http_peer.base}/bytes/{size}", stream=True
    ) as response:
        assert response.status == 200 and response.body == b""
        chunks = [chunk async for chunk in response]
    assert all(0 < len(c) <= 1 << 20 for c in chunks)
    assert b"".join(chunks) == http_peer.pattern(size)


async def test_streamed_head_before_body(backend: Any, http_peer: Any) -> None:
    response = await backend.http_request("GET", http_peer.base + "/hold", stream=True)
    assert response.status == 200
    body = aiter(response)
    assert await anext(body) == b"abc"
    http_peer.release.set()
    assert b"".join([c async for c in body]) == b"def"


async def test_broken_body(backend: Any, http_peer: Any) -> None:
    with pytest.raises(InternalError) as info:
        await backend.http_request("GET", http_peer.base + "/trunc")
    assert info.value.message == (
        "failed to read http/request response body: error decoding response body"
    )
    response = await backend.http_request("GET", http_peer.base + "/trunc", stream=True)
    with pytest.raises(InternalError, match="error decoding response body"):
        await response.read()


@pytest.mark.parametrize(
    ("url", "headers", "error", "text"),
    [
        ("ftp://x/", [], InvalidParamsError, "only supports http and https URLs, got ftp"),
        ("nope", [], InvalidParamsError, "relative URL without a base"),
        ("http://127.0.0.1:1/", [], InternalError, "http/request failed: error sending request"),
        ("{base}/echo", [RequestHeader("a", "", "OPENAI_API_KEY")], InvalidParamsError,
         "cannot use executor environment variable OPENAI_API_KEY"),
    ],
)
async def test_errors(
    backend: Any, http_peer: Any, url: str, headers: Any, error: type, text: str
) -> None:
    with pytest.raises(error, match=text):
        await backend.http_request("GET", url.format(base=http_peer.base), headers=headers)


async def test_timeout(backend: Any, http_peer: Any) -> None:
    with pytest.raises(InternalError, match="error sending request"):
        await backend.http_request("GET", http_peer.base + "/nohead", timeout_ms=1500)
