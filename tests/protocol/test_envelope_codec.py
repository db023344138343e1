"""Envelope codec: feed text, assert structs (PROTOCOL.md §3.1-§3.2, §3.6)."""

from __future__ import annotations

import contextlib
import json

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exec_server.protocol.codec import (
    ProtocolError,
    decode_message,
    decode_params,
    decode_result,
    encode_error,
    encode_notification,
    encode_request,
    encode_result,
)
from exec_server.protocol.messages import (
    MALFORMED_ID,
    ErrorObject,
    ErrorResponse,
    InitializeParams,
    InitializeResult,
    Notification,
    Request,
    Response,
)


class PidParams(msgspec.Struct, rename="camel"):
    process_id: str


class Empty(msgspec.Struct):
    pass


def test_request_with_int_id_and_params() -> None:
    msg = decode_message(b'{"id":7,"method":"fs/getMetadata","params":{"path":"/a"}}')
    assert isinstance(msg, Request)
    assert msg.id == 7 and type(msg.id) is int
    assert msg.method == "fs/getMetadata"
    assert msg.params is not None and json.loads(bytes(msg.params)) == {"path": "/a"}


def test_request_with_string_id_keeps_type() -> None:
    msg = decode_message('{"id":"req-8","method":"x"}')
    assert isinstance(msg, Request)
    assert msg.id == "req-8"
    assert msg.params is None
    assert encode_result(msg.id, Empty()) == b'{"id":"req-8","result":{}}'


def test_jsonrpc_member_and_unknown_members_are_ignored() -> None:
    msg = decode_message(b'{"jsonrpc":"2.0","id":1,"method":"m","trace":{"t":1},"x":[]}')
    assert msg == Request(1, "m", None)


def test_explicit_null_params_is_present() -> None:
    msg = decode_message(b'{"id":1,"method":"m","params":null}')
    assert isinstance(msg, Request)
    assert msg.params is not None and bytes(msg.params) == b"null"


def test_notification() -> None:
    msg = decode_message(b'{"method":"initialized","params":{}}')
    assert isinstance(msg, Notification)
    assert msg.method == "initialized"


def test_id_that_is_not_int_or_string_is_malformed() -> None:
    # upstream 0.163 refuses an id member that is no RequestId (id -1, -32600);
    # it is no notification (tests/protocol/test_request_id_shapes.py)
    for text in (
        b'{"id":null,"method":"m"}',
        b'{"id":1.5,"method":"m"}',
        b'{"id":true,"method":"m"}',
    ):
        with pytest.raises(ProtocolError, match="untagged enum RequestId"):
            decode_message(text)


def test_response_and_error() -> None:
    resp = decode_message(b'{"id":3,"result":{"running":false}}')
    assert isinstance(resp, Response)
    assert json.loads(bytes(resp.result)) == {"running": False}
    err = decode_message(b'{"id":"a","error":{"code":-32004,"message":"nope"}}')
    assert err == ErrorResponse("a", ErrorObject(-32004, "nope"))


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("not-json", "JSON is malformed"),
        ("[]", "Expected `object`, got `array`"),
        ('[{"id":1,"method":"m"}]', "Expected `object`, got `array`"),
        ('"x"', "Expected `object`, got `str`"),
        ("{}", "did not match any variant"),
        ('{"id":1}', "did not match any variant"),
        ('{"id":1,"error":{"code":"x"}}', "did not match any variant"),
        ('{"id":1', "truncated"),
        ("", "truncated"),
    ],
)
def test_malformed_raises_protocol_error_with_parser_text(text: str, fragment: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_message(text)
    assert fragment in info.value.message


@pytest.mark.parametrize("where", ["params", "id", "unclosed"])
def test_nesting_deeper_than_the_decoder_goes_is_malformed(where: str) -> None:
    """msgspec stops at Python's recursion limit; that was a RecursionError out of
    the decoder, which dropped the connection (upstream's serde stops at 128)."""
    deep = b"[" * 5000 + (b"" if where == "unclosed" else b"]" * 5000)
    if where == "id":
        text = b'{"id":' + deep + b',"method":"m"}'
    else:
        text = b'{"id":1,"method":"m","params":{"x":' + deep + b"}}"
    with pytest.raises(ProtocolError, match="recursion"):
        decode_message(text)


@pytest.mark.parametrize(
    ("text", "fits"),
    [
        ("9223372036854775807", Request),
        ("-9223372036854775808", Request),
        ("9223372036854775808", ProtocolError),
        ("-9223372036854775809", ProtocolError),
        ("1180591620717411303424", ProtocolError),
        ("1.0", ProtocolError),
    ],
)
def test_integer_ids_are_64_bit(text: str, fits: type) -> None:
    """An id is an i64 or a string (upstream's type): a bigger integer is no id, so
    the message is malformed, like one with a float id."""
    if fits is ProtocolError:
        with pytest.raises(ProtocolError):
            decode_message(f'{{"id":{text},"method":"m"}}'.encode())
        return
    msg = decode_message(f'{{"id":{text},"method":"m"}}'.encode())
    assert isinstance(msg, Request) and msg.id == int(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # msgspec calls these "Input data was truncated": the message was whole.
        (b'{"id":1,"method":"m","params":{"p":"/tmp/\\ud800x"}}', "`\\ud800` in a string escape"),
        (b'{"id":1,"method":"m","params":{"p":"\\uDBFF"}}', "`\\uDBFF` in a string escape"),
        (b'{"id":1,"method":"m\\ud83d"}', "`\\ud83d` in a string escape (byte 19)"),
        ('{"id":1,"method":"m","params":{"p":"é\\ud800"}}', "`\\ud800` in a string escape"),
        # Text that does end early keeps msgspec's words, even with an escaped
        # backslash before a "ud800" or a pair further on.
        (b'{"id":1,"method":"m","params":{"p":"\\\\ud800', "Input data was truncated"),
        (b'{"id":1,"method":"m","params":{"p":"\\ud83d\\ude00', "Input data was truncated"),
    ],
)
def test_lone_leading_surrogate_is_named(text: bytes | str, expected: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_message(text)
    assert expected in info.value.message
    assert info.value.message.startswith(
        "JSON is malformed: lone leading surrogate"
        if "escape" in expected
        else "Input data was truncated"
    )


def test_invalid_utf8_is_malformed() -> None:
    with pytest.raises(ProtocolError):
        decode_message(b'{"id":1,"method":"\xff"}')


_PID = msgspec.json.Decoder(PidParams)


def test_params_missing_decodes_as_null() -> None:
    assert decode_params(None, msgspec.json.Decoder(Empty | None)) is None
    with pytest.raises(msgspec.ValidationError, match="got `null`"):
        decode_params(None, _PID)


def test_empty_object_params_retry_as_null() -> None:
    null = msgspec.json.Decoder(None)
    assert decode_params(msgspec.Raw(b"{}"), null) is None
    assert decode_params(msgspec.Raw(b" { } "), null) is None


def test_params_errors_carry_msgspec_text() -> None:
    with pytest.raises(msgspec.ValidationError, match="missing required field `processId`"):
        decode_params(msgspec.Raw(b"{}"), _PID)
    with pytest.raises(
        msgspec.ValidationError, match=r"Expected `str`, got `int` - at `\$.processId`"
    ):
        decode_params(msgspec.Raw(b'{"processId":1}'), _PID)


def test_params_unknown_members_ignored() -> None:
    got = decode_params(msgspec.Raw(b'{"processId":"p","extra":1}'), _PID)
    assert got.process_id == "p"


def test_encoders_match_upstream_shapes() -> None:
    assert encode_request(1, "initialize", InitializeParams("c")) == (
        b'{"id":1,"method":"initialize","params":{"clientName":"c","resumeSessionId":null}}'
    )
    assert encode_request("x", "m") == b'{"id":"x","method":"m"}'
    assert encode_notification("initialized") == b'{"method":"initialized"}'
    assert encode_notification("initialized", Empty()) == b'{"method":"initialized","params":{}}'
    assert encode_error(MALFORMED_ID, -32600, "bad") == (
        b'{"id":-1,"error":{"code":-32600,"message":"bad"}}'
    )
    assert encode_result(5, InitializeResult("s")) == b'{"id":5,"result":{"sessionId":"s"}}'


def test_result_round_trip_through_raw() -> None:
    resp = decode_message(encode_result(9, InitializeResult("abc")))
    assert isinstance(resp, Response)
    assert decode_result(resp.result, InitializeResult) == InitializeResult("abc")


_ids = st.one_of(st.integers(min_value=-(2**63), max_value=2**63 - 1), st.text(max_size=20))


@given(msg_id=_ids, method=st.text(max_size=30))
def test_request_round_trip(msg_id: int | str, method: str) -> None:
    msg = decode_message(encode_request(msg_id, method, Empty()))
    assert isinstance(msg, Request)
    assert msg.id == msg_id and type(msg.id) is type(msg_id)
    assert msg.method == method


@given(msg_id=_ids, code=st.integers(min_value=-(2**31), max_value=2**31), text=st.text())
def test_error_round_trip(msg_id: int | str, code: int, text: str) -> None:
    msg = decode_message(encode_error(msg_id, code, text))
    assert msg == ErrorResponse(msg_id, ErrorObject(code, text))


@given(st.binary(max_size=64))
def test_arbitrary_bytes_never_crash(data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        decode_message(data)
