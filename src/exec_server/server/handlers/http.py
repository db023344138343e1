"""``http/request``: wire structs ↔ :mod:`exec_server.http` (PROTOCOL_CURRENT.md §9).

A streamed response answers at its head; a task then sends the body as
``http/request/bodyDelta`` notifications, each handed to the transport before
the next piece is read (a slow client slows the HTTP peer, not our memory).
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING

from exec_server.exceptions import InvalidParamsError, u64_param
from exec_server.http.errors import HttpBodyFailed
from exec_server.http.request import HeaderSpec, build_request
from exec_server.protocol.types.http import (
    METHOD_HTTP_REQUEST,
    NOTIFY_BODY_DELTA,
    BodyDelta,
    HttpHeader,
    HttpRequestParams,
    HttpRequestResult,
)
from exec_server.server.router import RequestContext, Router

if TYPE_CHECKING:
    from exec_server.http.client import HttpClient, HttpResponse
    from exec_server.server.session import Attachment

__all__ = ["register"]

_STREAM_KEY = "http:"


def _client(ctx: RequestContext) -> HttpClient:
    services = ctx.services
    client = services.http
    if client is None:
        from exec_server.http.client import HttpClient

        client = services.http = HttpClient()
    return client


def _result(response: HttpResponse, body: bytes) -> HttpRequestResult:
    headers = [HttpHeader(name, value) for name, value in response.headers]
    return HttpRequestResult(status=response.status, headers=headers, body_base64=body)


async def handle_http_request(ctx: RequestContext, params: HttpRequestParams) -> HttpRequestResult:
    u64_param(params.timeout_ms, "timeoutMs")
    headers = [HeaderSpec(h.name, h.value, h.value_env_var) for h in params.headers]
    follow = params.redirect_policy == "follow"
    request = build_request(
        params.method, params.url, headers, params.body_base64, params.timeout_ms, follow,
        os.environ,
    )
    streams = ctx.attachment.streams
    key = _STREAM_KEY + params.request_id
    stream = params.stream_response
    if stream:
        if key in streams:
            raise InvalidParamsError(
                f"http/request streamResponse requestId `{params.request_id}` is already active"
            )
        # Reserved until the ``done`` frame; the placeholder becomes the body's task.
        streams[key] = asyncio.get_running_loop().create_future()
    ctx.unblock()
    try:
        response = await _client(ctx).send(request)
    except BaseException:
        if stream:
            streams.pop(key, None)
        raise
    if not stream:
        try:
            body = await response.read()
        finally:
            await response.aclose()
        return _result(response, body)
    replied = ctx.replied
    assert replied is not None  # a may_block route
    streams[key] = asyncio.create_task(
        _send_body(ctx.attachment, params.request_id, key, response, replied),
        name=f"http-body-{params.request_id}",
    )
    return _result(response, b"")


async def _send_body(
    attachment: Attachment, request_id: str, key: str, response: HttpResponse,
    replied: asyncio.Event,
) -> None:
    def release_id() -> None:
        if attachment.streams.get(key) is asyncio.current_task():
            del attachment.streams[key]

    try:
        await replied.wait()
        seq = 0
        error: str | None = None
        try:
            async for chunk in response.chunks():
                seq += 1
                delivered = await attachment.sink(
                    NOTIFY_BODY_DELTA, BodyDelta(request_id, seq, chunk, False, None)
                )
                if delivered is False:
                    return  # the connection is gone: nobody reads the rest
        except HttpBodyFailed as exc:
            error = exc.cause
        # Free the id before the ``done`` frame can reach the client, which may
        # reuse it at once.
        release_id()
        await attachment.sink(NOTIFY_BODY_DELTA, BodyDelta(request_id, seq + 1, b"", True, error))
    finally:
        release_id()
        await response.aclose()


def register(router: Router) -> None:
    router.add(METHOD_HTTP_REQUEST, HttpRequestParams, handle_http_request, "http", may_block=True)

