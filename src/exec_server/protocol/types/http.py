"""Wire structs of ``http/request`` and ``http/request/bodyDelta`` (PROTOCOL_CURRENT.md §9).

Bodies travel as base64; a body delta's ``error`` is always sent (``null`` when clean)."""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec

__all__ = [
    "BUFFERED_REQUEST_ID",
    "METHOD_HTTP_REQUEST",
    "NOTIFY_BODY_DELTA",
    "BodyDelta",
    "HttpHeader",
    "HttpRequestParams",
    "HttpRequestResult",
    "RequestHeader",
]

METHOD_HTTP_REQUEST: Final = "http/request"
NOTIFY_BODY_DELTA: Final = "http/request/bodyDelta"
#: the id the 0.163 client gives every buffered request (they reserve none).
BUFFERED_REQUEST_ID: Final = "buffered-request"

#: >= 0; the handler checks the u64 bound (msgspec's bounds stop at int64).
U64 = Annotated[int, msgspec.Meta(ge=0)]


class RequestHeader(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    """A header to send; ``valueEnvVar`` appends an executor environment variable."""

    name: str
    value: str
    value_env_var: str | None = None


class HttpRequestParams(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    method: str
    url: str
    request_id: str
    headers: list[RequestHeader] = msgspec.field(default_factory=list)
    body_base64: bytes | None = None
    timeout_ms: U64 | None = None
    redirect_policy: Literal["follow", "stop"] = "follow"
    stream_response: bool = False


class HttpHeader(msgspec.Struct, frozen=True):
    name: str
    value: str


class HttpRequestResult(msgspec.Struct, frozen=True, rename="camel"):
    status: int
    headers: list[HttpHeader]
    body_base64: bytes


class BodyDelta(msgspec.Struct, frozen=True, rename="camel"):
    """One piece of a streamed body; the last has ``done`` and an empty delta."""

    request_id: str
    seq: int
    delta_base64: bytes
    done: bool
    error: str | None
