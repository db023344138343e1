"""Send an :class:`HttpRequest` with httpx; stream its body under one total deadline.

Two httpx clients: one honours the executor's proxy variables, one goes direct
(literal loopback addresses). No default headers beyond ``accept: */*`` and a
redirect's ``referer``; no content decoding; the body is read only as fast as
the caller asks for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ipaddress
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Final

import httpx

from exec_server.http.errors import HttpBodyFailed, HttpRequestFailed
from exec_server.http.request import HttpRequest

__all__ = ["BODY_ERROR_TEXT", "EXPIRED_TEXT", "MAX_REDIRECTS", "HttpClient", "HttpResponse"]

#: reqwest's default redirect limit, which upstream keeps.
MAX_REDIRECTS: Final = 10
#: what a broken body reports (reqwest's wording, which upstream forwards).
BODY_ERROR_TEXT: Final = "error decoding response body"
#: a request whose deadline passed before it is sent (``timeoutMs: 0``), upstream's words.
EXPIRED_TEXT: Final = "route-aware request timed out"
MAX_CHUNK: Final = 1 << 20


#: the URL a followed redirect came from, for its ``referer``.
_REDIRECTED_FROM: contextvars.ContextVar[httpx.URL | None] = contextvars.ContextVar(
    "redirected_from", default=None
)


async def _note_redirect(response: httpx.Response) -> None:
    _REDIRECTED_FROM.set(response.request.url if response.has_redirect_location else None)


async def _add_referer(request: httpx.Request) -> None:
    """A followed redirect carries ``referer`` as reqwest (upstream's client) sends it."""
    previous = _REDIRECTED_FROM.get()
    if previous is None or (previous.scheme == "https" and request.url.scheme == "http"):
        return
    referer = previous.copy_with(username=None, password=None, fragment=None)
    request.headers["referer"] = str(referer)


def _is_loopback_literal(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class HttpResponse:
    """A response whose head has arrived; ``headers`` keep visible-ASCII values only."""

    def __init__(self, response: httpx.Response, deadline: float | None) -> None:
        self._response = response
        self._deadline = deadline
        self.status = response.status_code
        self.headers = [  # ``HeaderValue::to_str``'s rule: tab and 0x20-0x7e only
            (name.decode("ascii", "replace").lower(), value.decode("ascii"))
            for name, value in response.headers.raw
            if all(0x20 <= b < 0x7F or b == 0x09 for b in value)
        ]

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives, in pieces of at most 1 MiB; HttpBodyFailed if it breaks off."""
        raw = aiter(self._response.aiter_raw())
        assert isinstance(raw, AsyncGenerator)
        try:
            while True:
                try:
                    async with asyncio.timeout_at(self._deadline):
                        chunk = await anext(raw)
                except StopAsyncIteration:
                    return
                except (httpx.HTTPError, TimeoutError, OSError):
                    raise HttpBodyFailed(BODY_ERROR_TEXT) from None
                for start in range(0, len(chunk), MAX_CHUNK):
                    yield chunk[start : start + MAX_CHUNK] if len(chunk) > MAX_CHUNK else chunk
        finally:
            await raw.aclose()

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    async def aclose(self) -> None:
        with contextlib.suppress(httpx.HTTPError, OSError):
            await self._response.aclose()


class HttpClient:
    """Sends requests; one per server (its connection pools are shared), then :meth:`aclose`."""

    def __init__(self) -> None:
        #: by "goes direct": literal loopback addresses skip the ambient proxy variables.
        self._clients: dict[bool, httpx.AsyncClient] = {}

    def _client(self, url: httpx.URL) -> httpx.AsyncClient:
        direct = _is_loopback_literal(url.host)
        client = self._clients.get(direct)
        if client is None:
            client = self._clients[direct] = httpx.AsyncClient(
                timeout=None,  # one total deadline instead, applied here
                max_redirects=MAX_REDIRECTS,
                # Long-lived streams (an MCP server's SSE GET) must not starve
                # later requests of pool slots.
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=20),
                trust_env=not direct,
                event_hooks={"request": [_add_referer], "response": [_note_redirect]},
            )
            client.headers.clear()
        return client

    async def send(self, request: HttpRequest) -> HttpResponse:
        """Send ``request`` and wait for the response head; HttpRequestFailed if none comes."""
        loop = asyncio.get_running_loop()
        deadline = None if request.timeout is None else loop.time() + request.timeout
        url = httpx.URL(request.url)
        headers = list(request.headers)
        # What the HTTP library adds comes after the caller's headers, as upstream sends them.
        if not any(name == b"accept" for name, _ in headers):
            headers.append((b"accept", b"*/*"))
        if not any(name == b"host" for name, _ in headers):
            headers.append((b"host", url.netloc))
        client = self._client(url)
        built = client.build_request("GET", url, headers=headers, content=request.body)
        built.method = request.method  # httpx upper-cases; the caller's case is sent
        _REDIRECTED_FROM.set(None)
        try:
            if deadline is not None and deadline <= loop.time():
                raise HttpRequestFailed(EXPIRED_TEXT)
            async with asyncio.timeout_at(deadline):
                response = await client.send(
                    built, stream=True, follow_redirects=request.follow_redirects
                )
        except (httpx.HTTPError, TimeoutError, OSError):
            raise HttpRequestFailed(f"error sending request for url ({url})") from None
        return HttpResponse(response, deadline)

    async def aclose(self) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            await client.aclose()
