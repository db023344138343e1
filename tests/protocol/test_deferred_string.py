"""Big ``fs/writeFile`` requests: the base64 member is located in the text
(:mod:`json_span`), left undecoded by the codec, and decoded a slice at a time
(:mod:`base64_text`) with exactly the answers of the whole-token path."""

from __future__ import annotations

import base64
import json
import os
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exec_server.exceptions import InvalidRequestError
from exec_server.fs import direct as ops
from exec_server.protocol import base64_text, json_span
from exec_server.protocol.codec import SPAN_MIN, decode_message
from exec_server.protocol.json_span import find_string_member
from exec_server.protocol.messages import Request
from exec_server.protocol.types import fs as t
from exec_server.server.handlers.fs import decode_data_base64, span_payload

# ------------------------------------------------------------- json_span


def span_text(data: bytes) -> bytes | None:
    span = find_string_member(data, b"params", b"dataBase64")
    return None if span is None else data[span[0] : span[1]]


def test_finds_the_member_in_any_order_and_spacing() -> None:
    assert span_text(b'{"id":1,"params":{"path":"/x","dataBase64":"QUJD"}}') == b"QUJD"
    assert span_text(b' { "params" : { "dataBase64" : "QUJD" , "x" : [1, {"a": "}"}] } } ') == (
        b"QUJD"
    )
    assert span_text(b'{"params":{"dataBase64":""},"method":"m"}') == b""


def test_the_key_elsewhere_never_matches() -> None:
    # inside another string, in a nested object, at the top level
    assert span_text(b'{"params":{"path":"\\"dataBase64\\":\\"AAAA\\"","dataBase64":"QUJD"}}') == (
        b"QUJD"
    )
    assert span_text(b'{"params":{"sandbox":{"dataBase64":"AAAA"},"dataBase64":"QUJD"}}') == (
        b"QUJD"
    )
    assert span_text(b'{"dataBase64":"AAAA","params":{"dataBase64":"QUJD"}}') == b"QUJD"
    assert span_text(b'{"x\\"dataBase64":"AAAA","params":{"dataBase64":"QUJD"}}') is None
    assert span_text(b'{"params":{"p":"a\\\\","dataBase64":"QUJD"}}') == b"QUJD"


@pytest.mark.parametrize(
    "text",
    [
        b'{"params":{"dataBase64":"QU\\/D"}}',  # an escape inside the value
        b'{"params":{"data\\u0042ase64":"QUJD"}}',  # an escaped key
        b'{"params":{"dataBase64":"AAAA","dataBase64":"QUJD"}}',  # a repeated key
        b'{"params":{"dataBase64":"QUJD"},"params":{}}',
        b'{"params":{"dataBase64":5}}',  # not a string
        b'{"params":"dataBase64"}',
        b'["params"]',
        b'{"params":{"dataBase64":"QUJD"',  # cut short
        b'{"params":{"dataBase64" "QUJD"}}',
        b"",
        b"   ",
    ],
)
def test_unusual_text_is_left_to_the_real_decoder(text: bytes) -> None:
    assert span_text(text) is None


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@given(
    top=st.dictionaries(st.text(), _json_values, max_size=4),
    params=st.dictionaries(st.text(), _json_values, max_size=4),
    value=st.text(alphabet=st.characters(codec="ascii", exclude_characters='"\\')),
    indent=st.sampled_from([None, 1]),
)
def test_span_matches_what_a_json_decoder_reads(
    top: dict[str, Any], params: dict[str, Any], value: str, indent: int | None
) -> None:
    params["dataBase64"] = value
    top["params"] = params
    data = json.dumps(top, indent=indent).encode()
    span = find_string_member(data, b"params", b"dataBase64")
    if span is None:  # only when something needed escaping or the key was unusual
        assert any("\\" in json.dumps(k) for k in [*top, *params]) or any(
            c < " " or c == "\x7f" for c in value
        )
        return
    assert data[span[0] : span[1]].decode() == value


def test_finds_are_bounded_to_windows_with_the_same_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No ``bytes.find`` call looks past its window (so a worker walking a GiB
    gives the GIL back between calls), and the span found is the same."""
    text = base64.b64encode(os.urandom(3000)).decode()
    message = json.dumps({"id": 1, "params": {"p": "a\\", "dataBase64": text}}).encode()
    whole = find_string_member(message, b"params", b"dataBase64")
    monkeypatch.setattr(json_span, "WINDOW", 64)
    looked: list[int] = []

    class Spy(bytes):
        def find(self, sub: Any, start: Any = 0, end: Any = None) -> int:
            looked.append((len(self) if end is None else end) - start)
            return super().find(sub, start, end)

    assert find_string_member(Spy(message), b"params", b"dataBase64") == whole
    assert whole is not None and whole[1] - whole[0] == len(text)
    assert looked and max(looked) <= 64


# ----------------------------------------------------------- base64_text


@given(st.binary(max_size=400), st.sampled_from([4, 8, 12, 400]))
def test_slices_join_to_what_base64_decodes(data: bytes, piece: int) -> None:
    text = b"xx" + base64.b64encode(data) + b"yy"
    end = len(text) - 2
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(base64_text, "DECODE_SLICE", piece)
        slices = list(base64_text.decode_slices(text, 2, end))
    assert b"".join(slices) == data
    assert all(len(s) <= piece // 4 * 3 for s in slices)
    assert base64_text.decoded_size(text, 2, end) == len(data)


@given(st.binary(max_size=300), st.sampled_from([3, 6, 300]), st.sampled_from([0, 1 << 30]))
def test_encoded_text_is_the_json_string_of_the_base64(
    data: bytes, piece: int, mapped_min: int
) -> None:
    """Whole or in pieces, in a mapping or not: the same text."""
    expected = b'"' + base64.b64encode(data) + b'"'
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(base64_text, "MAPPED_MIN", mapped_min)
        assert bytes(base64_text.encode_quoted(data)) == expected
        pieces = (data[i : i + piece] for i in range(0, len(data), piece))
        assert bytes(base64_text.encode_pieces_quoted(pieces, len(data))) == expected


def test_pieces_that_do_not_add_up_are_refused() -> None:
    with pytest.raises(ValueError, match="fewer"):
        base64_text.encode_pieces_quoted([b"abc"], 6)
    with pytest.raises(ValueError, match="more"):
        base64_text.encode_pieces_quoted([b"abc", b"def"], 3)
    with pytest.raises(ValueError, match="multiple of 3"):
        base64_text.encode_pieces_quoted([b"ab", b"cd"], 4)


@given(st.text(alphabet="QUJDab+/=\n!", max_size=24), st.sampled_from([4, 8, 64]))
def test_slices_accept_exactly_what_upstream_accepts(chars: str, piece: int) -> None:
    """Slices never take text the whole-text rules refuse (``=`` inside, a bad
    length, stray bits are checked by the caller) and never refuse valid text."""
    text = chars.encode()
    valid = base64_text.error_text(text) is None
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(base64_text, "DECODE_SLICE", piece)
            decoded = b"".join(base64_text.decode_slices(text, 0, len(text)))
    except base64_text.Undecodable:
        assert not valid
    else:
        assert valid or base64_text.stray_bits(text, 0, len(text)), text
        if valid:
            assert decoded == base64.b64decode(text, validate=True)


@pytest.mark.parametrize("text", [b"DDDQ=", b"QUJDQUJDQ=", b"QUJD="])
def test_a_lone_pad_after_whole_groups_is_refused(text: bytes) -> None:
    """Python's strict binascii decodes these; upstream refuses them."""
    assert base64_text.error_text(text) is not None
    with pytest.raises(base64_text.Undecodable):
        list(base64_text.decode_slices(text, 0, len(text)))


def test_padding_at_the_end_of_a_middle_slice_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base64_text, "DECODE_SLICE", 4)
    text = b"QQ==QUJD"  # each 4-character slice alone is valid
    with pytest.raises(base64_text.Undecodable):
        list(base64_text.decode_slices(text, 0, len(text)))


# ----------------------------------------------------------------- codec


def big_write(data_text: str, **extra: object) -> bytes:
    params = {"path": "/x", "dataBase64": data_text, **extra}
    return msgspec.json.encode({"id": 7, "method": "fs/writeFile", "params": params})


def written(payload: ops.Payload) -> bytes:
    return bytes(ops.payload_bytes(payload))


def test_big_requests_leave_the_member_in_place() -> None:
    payload = os.urandom(SPAN_MIN)
    message = big_write(base64.b64encode(payload).decode(), sandbox={"dataBase64": "x"})
    msg = decode_message(message)
    assert isinstance(msg, Request) and (msg.id, msg.method) == (7, "fs/writeFile")
    assert msg.span is not None and msg.span.data is message
    assert msg.params is not None
    params = msgspec.json.decode(msg.params, type=t.WriteFileParams)
    assert params.path == "/x" and bytes(params.data_base64) == b'""'
    assert bytes(t.sandbox_raw(params.sandbox) or b"") == b'{"dataBase64":"x"}'
    assert written(span_payload(msg.span)) == payload
    # Member order does not matter, at either level.
    reordered = msgspec.json.encode(
        {
            "params": {"dataBase64": base64.b64encode(payload).decode(), "path": "/y"},
            "method": "fs/writeFile",
            "id": "s",
        }
    )
    msg2 = decode_message(reordered)
    assert isinstance(msg2, Request) and msg2.id == "s" and msg2.span is not None
    assert written(span_payload(msg2.span)) == payload


def test_a_message_gathered_from_fragments_is_decoded_in_place() -> None:
    """A fragmented message arrives as the bytearray its fragments grew: the member
    is found and decoded there, nothing copied to ``bytes`` first."""
    payload = os.urandom(SPAN_MIN)
    message = bytearray(big_write(base64.b64encode(payload).decode()))
    msg = decode_message(message)
    assert isinstance(msg, Request) and msg.span is not None and msg.span.data is message
    assert written(span_payload(msg.span)) == payload


def test_small_escaped_mistyped_or_other_requests_take_the_whole_path() -> None:
    text = base64.b64encode(b"\xff" * SPAN_MIN).decode()
    small = decode_message(big_write("QUJD"))
    assert isinstance(small, Request) and small.span is None
    escaped = decode_message(big_write(text).replace(b"/", b"\\/"))
    assert isinstance(escaped, Request) and escaped.span is None and escaped.params
    # A mistyped member elsewhere: its params fail as the whole message's would.
    whole = msgspec.json.decode(big_write(text).replace(b'"/x"', b"5"))["params"]
    mistyped = decode_message(big_write(text).replace(b'"/x"', b"5"))
    assert isinstance(mistyped, Request) and mistyped.params is not None
    with pytest.raises(msgspec.ValidationError) as cut:
        msgspec.json.decode(mistyped.params, type=t.WriteFileParams)
    with pytest.raises(msgspec.ValidationError) as full:
        msgspec.convert(whole, type=t.WriteFileParams)
    assert str(cut.value) == str(full.value) == "Expected `str`, got `int` - at `$.path`"
    other = decode_message(big_write(text).replace(b"fs/writeFile", b"fs/other"))
    assert isinstance(other, Request) and other.span is None and other.method == "fs/other"
    assert other.params is not None and len(other.params) > len(text)


@pytest.mark.parametrize(
    "bad",
    [
        b"!!!!",  # a bad symbol
        b"QUJ",  # bad length
        b"QUJD\\n",  # an escape: left whole, same error
        b"QUJD\n",  # a raw control character: not JSON text
        b"QU\xffJD",  # not UTF-8
        b"aR==",  # stray bits in the last symbol
        b"QQ==QUJD",  # padding inside
    ],
)
def test_bad_base64_in_a_big_request_is_invalid_request(bad: bytes) -> None:
    body = base64.b64encode(b"\0" * (SPAN_MIN // 3 * 3 + 3)) + bad  # no padding
    message = b'{"id":1,"method":"fs/writeFile","params":{"path":"/x","dataBase64":"%s"}}' % body
    msg = decode_message(message)
    assert isinstance(msg, Request)
    with pytest.raises(InvalidRequestError) as error:
        if msg.span is not None:
            written(span_payload(msg.span))
        else:
            assert msg.params is not None
            decode_data_base64(msgspec.json.decode(msg.params, type=t.WriteFileParams).data_base64)
    message_text = error.value.message
    assert message_text.startswith("fs/writeFile requires valid base64 dataBase64: ")
    if bad == b"!!!!":
        assert message_text.endswith(f"Invalid symbol 33, offset {len(body) - 4}.")
    if bad == b"aR==":
        assert message_text.endswith(f"Invalid last symbol 82, offset {len(body) - 3}.")
