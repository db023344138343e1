"""An ``id`` member that is no RequestId makes a malformed message (PROTOCOL.md §3.1, §3.5).

Upstream (codex 0.163) refuses any message whose ``id`` member is present but
neither an i64 nor a string - whatever else it holds - with ``-32600`` under id
``-1``, and goes on serving. We used to read ``{"id":1.5,"method":..}`` as a
notification, and the server closed the connection on it (stdio: exited).
A message with no ``id`` member at all is still a notification, and a response
with a valid id still a response.
"""

from __future__ import annotations

import json

import pytest

from exec_server.protocol.codec import ProtocolError, decode_message
from exec_server.protocol.messages import (
    ErrorObject,
    ErrorResponse,
    Notification,
    Request,
    Response,
)

BAD_ID = "data did not match any variant of untagged enum RequestId"

#: ids upstream refuses with ``BAD_ID``
NO_IDS = [
    "1.5",
    "1.0",
    "-0.0",
    "1e3",
    "1e400",
    "null",
    "true",
    "false",
    "{}",
    '{"a":1}',
    "[]",
    "[1]",
    "9223372036854775808",  # i64::MAX + 1
    "18446744073709551615",  # u64::MAX: still a u64 to serde, no i64
    "340282366920938463463374607431768211456",  # u128::MAX + 1: a float to serde
    "-170141183460469231731687303715884105729",  # i128::MIN - 1: a float to serde
    "1" * 400,
]

#: the rest of a message after its id member: any shape, or none
TAILS = [
    ',"method":"fs/getMetadata","params":{"path":"/tmp"}',
    ',"method":"initialized"',
    ',"method":"initialized","params":{}',
    ',"method":5',
    ',"result":{}',
    ',"result":null',
    ',"error":{"code":1,"message":"x"}',
    ',"error":5',
    "",
]


@pytest.mark.parametrize("tail", TAILS)
@pytest.mark.parametrize("bad", NO_IDS)
def test_id_that_is_no_request_id_is_malformed(bad: str, tail: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_message(f'{{"id":{bad}{tail}}}'.encode())
    assert info.value.message == BAD_ID


@pytest.mark.parametrize("bad", ["1.5", "null", "[]"])
def test_where_the_id_member_is_does_not_matter(bad: str) -> None:
    for text in (
        f'{{"method":"m","id":{bad}}}',
        f'{{"params":{{"x":1}},"method":"initialized","id":{bad}}}',
        f'{{"result":{{}},"id":{bad}}}',
    ):
        with pytest.raises(ProtocolError) as info:
            decode_message(text)  # str as well as bytes
        assert info.value.message == BAD_ID


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        ("18446744073709551616", "integer `18446744073709551616` as u128"),  # u64::MAX + 1
        (str(2**128 - 1), f"integer `{2**128 - 1}` as u128"),
        ("-9223372036854775809", "integer `-9223372036854775809` as i128"),  # i64::MIN - 1
        (str(-(2**64)), f"integer `{-(2**64)}` as i128"),
        (str(-(2**127)), f"integer `{-(2**127)}` as i128"),
    ],
)
def test_integer_ids_that_serde_reads_as_128_bit_use_its_words(bad: str, expected: str) -> None:
    """Upstream buffers the id before it tries RequestId, and its buffer takes no
    128-bit integer: those ids get the buffer's words (checked against 0.163)."""
    with pytest.raises(ProtocolError) as info:
        decode_message(f'{{"id":{bad},"method":"m"}}')
    assert info.value.message == f"invalid type: {expected}, expected any value"


@pytest.mark.parametrize(
    "good", ["0", "-0", "7", "-1", "9223372036854775807", "-9223372036854775808", '"x"', '""']
)
def test_valid_ids_still_make_requests_and_responses(good: str) -> None:
    value = json.loads(good)
    assert decode_message(f'{{"id":{good},"method":"m"}}') == Request(value, "m", None)
    resp = decode_message(f'{{"id":{good},"result":{{}}}}')
    assert isinstance(resp, Response) and resp.id == value and type(resp.id) is type(value)
    assert decode_message(
        f'{{"id":{good},"error":{{"code":-32004,"message":"nope"}}}}'
    ) == ErrorResponse(value, ErrorObject(-32004, "nope"))


@pytest.mark.parametrize(
    "text",
    [
        '{"method":"initialized"}',
        '{"method":"initialized","params":{}}',
        '{"method":"process/output","params":{"id":1.5}}',  # an id inside params is no id
        '{"method":"m","ID":1.5}',  # members are case-sensitive
    ],
)
def test_messages_without_an_id_member_are_still_notifications(text: str) -> None:
    assert isinstance(decode_message(text), Notification)


def test_other_malformed_ids_keep_the_parser_text() -> None:
    """Text that is not JSON in the id is reported as such, not as no RequestId."""
    with pytest.raises(ProtocolError) as info:
        decode_message(b'{"id":"\xff","method":"m"}')
    assert info.value.message == "Invalid UTF-8 encoded string"
    with pytest.raises(ProtocolError) as info:
        decode_message(b'{"id":01,"method":"m"}')
    assert info.value.message.startswith("JSON is malformed: invalid number")
