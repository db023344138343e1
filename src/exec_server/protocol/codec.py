"""Bytes/text <-> envelope structs, with no I/O (PROTOCOL.md §3).

As upstream's untagged enum, the first shape that fits wins; anything else raises
:class:`ProtocolError`, answered with id ``-1`` (§3.6)."""

from __future__ import annotations

import re
from typing import Final, TypeVar

import msgspec
from msgspec import UNSET, Raw, UnsetType

from exec_server.protocol.json_span import StringSpan, find_string_member
from exec_server.protocol.messages import (
    ErrorObject,
    ErrorResponse,
    Message,
    Notification,
    Request,
    RequestId,
    Response,
)

__all__ = [
    "SPAN_MIN",
    "ProtocolError",
    "decode_error_text",
    "decode_message",
    "decode_params",
    "decode_result",
    "encode_error",
    "encode_notification",
    "encode_request",
    "encode_result",
    "lossy_text",
]

T = TypeVar("T")

_NULL: Final = b"null"
_EMPTY_OBJECT: Final = b"{}"
_NO_SHAPE: Final = "data did not match any variant of untagged enum JSONRPCMessage"
_BAD_ID: Final = "data did not match any variant of untagged enum RequestId"
_WIDE_INT: Final = re.compile(rb"-?[0-9]{19,39}")
#: msgspec's (misleading) words for a lone leading surrogate escape.
_TRUNCATED: Final = "Input data was truncated"
#: ``\uD800``-``\uDBFF`` not followed by a trailing one, after an even run of backslashes.
_LONE_LEADING: Final = re.compile(
    rb"(?:^|[^\\])(?:\\\\)*(\\u[dD][89abAB][0-9a-fA-F]{2})(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
)


def decode_error_text(exc: msgspec.DecodeError, data: bytes | bytearray | str) -> str:
    """msgspec's error text, but a lone leading surrogate escape is named, not
    called truncated input (looked for only once decoding failed)."""
    text = str(exc)
    if text != _TRUNCATED:
        return text
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    found = _LONE_LEADING.search(raw)
    if found is None:
        return text
    escape = found.group(1).decode("ascii")
    where = found.start(1)
    return f"JSON is malformed: lone leading surrogate `{escape}` in a string escape (byte {where})"


class ProtocolError(Exception):
    """The peer sent bytes that are not a JSON-RPC message; ``message`` is the
    parser's text, which the transport prefixes with the connection (§3.6)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _Envelope(msgspec.Struct):
    """Every member we look at, still raw; an empty Raw means "absent"."""

    id: Raw = Raw()
    method: Raw = Raw()
    params: Raw = Raw()
    result: Raw = Raw()
    error: Raw = Raw()


class _OutRequest(msgspec.Struct, omit_defaults=True):
    id: RequestId
    method: str
    params: object = UNSET


class _OutNotification(msgspec.Struct, omit_defaults=True):
    method: str
    params: object = UNSET


class _OutResult(msgspec.Struct):
    id: RequestId
    result: object


class _OutError(msgspec.Struct):
    id: RequestId
    error: ErrorObject


#: ``fs/writeFile`` messages from this size on have their ``params.dataBase64``
#: left in place (:func:`decode_message`).
SPAN_MIN: Final = 1 << 20
_SPAN_METHOD: Final = "fs/writeFile"

_envelope_decoder: Final = msgspec.json.Decoder(_Envelope)
_id_decoder: Final = msgspec.json.Decoder(RequestId)
_str_decoder: Final = msgspec.json.Decoder(str)
_error_decoder: Final = msgspec.json.Decoder(ErrorObject)
_encoder: Final = msgspec.json.Encoder()


def _member(raw: Raw, decoder: msgspec.json.Decoder[T]) -> T | UnsetType:
    """UNSET when absent or not fitting; ProtocolError when no JSON text (bad UTF-8)."""
    if not raw:
        return UNSET
    try:
        return decoder.decode(raw)
    except msgspec.ValidationError:
        return UNSET
    except msgspec.DecodeError as exc:
        raise ProtocolError(decode_error_text(exc, raw)) from None


def _bad_id(raw: Raw) -> ProtocolError:
    """Upstream's error for an ``id`` that is no RequestId: its buffering refuses an
    integer that fits a u128/i128 first, with these words."""
    text = bytes(raw)
    if _WIDE_INT.fullmatch(text):
        value = int(text)
        if 2**64 <= value < 2**128:
            return ProtocolError(f"invalid type: integer `{value}` as u128, expected any value")
        if -(2**127) <= value < -(2**63):
            return ProtocolError(f"invalid type: integer `{value}` as i128, expected any value")
    return ProtocolError(_BAD_ID)


def decode_message(data: bytes | bytearray | str) -> Message:
    """Decode one inbound frame or line. An ``fs/writeFile`` of :data:`SPAN_MIN` bytes or
    more keeps its ``dataBase64`` in place (``span``) for the handler to decode in slices."""
    try:
        if len(data) >= SPAN_MIN and not isinstance(data, str):
            request = _decode_with_span(data)
            if request is not None:
                return request
        return _decode_message(data)
    except RecursionError as exc:
        raise ProtocolError(str(exc)) from None


def _decode_with_span(data: bytes | bytearray) -> Request | None:
    span = find_string_member(data, b"params", b"dataBase64")
    if span is None:
        return None
    start, end = span
    try:
        head = _decode_message(data[:start] + data[end:])
    except ProtocolError:
        return None  # the whole message gets its own error
    if not isinstance(head, Request) or head.method != _SPAN_METHOD:
        return None
    return Request(head.id, head.method, head.params, StringSpan(data, start, end))


def _decode_message(data: bytes | bytearray | str) -> Message:
    try:
        env = _envelope_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise ProtocolError(decode_error_text(exc, data)) from None
    msg_id = _member(env.id, _id_decoder)
    if env.id and isinstance(msg_id, UnsetType):
        # neither a notification (no id at all) nor a response: malformed (§3.6)
        raise _bad_id(env.id)
    method = _member(env.method, _str_decoder)
    params = env.params if env.params else None
    if not isinstance(method, UnsetType):
        if not isinstance(msg_id, UnsetType):
            return Request(msg_id, method, params)
        return Notification(method, params)
    if not isinstance(msg_id, UnsetType):
        if env.result:
            return Response(msg_id, env.result)
        error = _member(env.error, _error_decoder)
        if not isinstance(error, UnsetType):
            return ErrorResponse(msg_id, error)
    raise ProtocolError(_NO_SHAPE)


def decode_params(raw: Raw | None, decoder: msgspec.json.Decoder[T]) -> T:
    """Decode request params the upstream way (§3.2): missing params are ``null``, and
    ``{}`` that does not fit is tried as ``null``; msgspec.ValidationError if they do not fit.
    """
    data: Raw | bytes = raw if raw else _NULL  # no copy: params may be hundreds of MiB
    try:
        return decoder.decode(data)
    except msgspec.ValidationError:
        if len(data) <= 16 and b"".join(bytes(data).split()) == _EMPTY_OBJECT:
            try:
                return decoder.decode(_NULL)
            except msgspec.ValidationError:
                pass
        raise


def decode_result(raw: Raw, result_type: type[T]) -> T:
    """Decode a Response's ``result`` (client side); ValidationError if it does not fit."""
    return msgspec.json.decode(raw, type=result_type)


def encode_request(
    request_id: RequestId, method: str, params: msgspec.Struct | Raw | None = None
) -> bytes:
    """``{"id":..,"method":..,"params":..}``; ``params`` omitted when None."""
    return _encoder.encode(_OutRequest(request_id, method, UNSET if params is None else params))


def encode_notification(method: str, params: msgspec.Struct | Raw | None = None) -> bytes:
    """``{"method":..,"params":..}``; ``params`` omitted when None."""
    return _encoder.encode(_OutNotification(method, UNSET if params is None else params))


def encode_result(request_id: RequestId, result: msgspec.Struct | Raw) -> bytes:
    return _encoder.encode(_OutResult(request_id, result))


def encode_error(request_id: RequestId, code: int, message: str) -> bytes:
    """``{"id":..,"error":{"code":..,"message":..}}``; a name's non-UTF-8 bytes (surrogate
    escapes, which JSON cannot carry) are sent as U+FFFD, as upstream shows them."""
    try:
        return _encoder.encode(_OutError(request_id, ErrorObject(code, message)))
    except UnicodeEncodeError:
        return _encoder.encode(_OutError(request_id, ErrorObject(code, lossy_text(message))))


def lossy_text(text: str) -> str:
    """``text`` with the bytes it holds as surrogate escapes (a name's bytes that are
    not UTF-8) as U+FFFD, and any other lone surrogate as ``?``."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
