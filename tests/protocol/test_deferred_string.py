"""Big ``fs/writeFile`` requests: the base64 member is located in the text
(:mod:`json_span`), left undecoded by the codec, and decoded natively
(:mod:`native_base64`) with exactly msgspec's results and errors."""

from __future__ import annotations

import base64
import json
import os
import threading
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exec_server.exceptions import InvalidRequestError
from exec_server.protocol import fs_types as t
from exec_server.protocol import native_base64
from exec_server.protocol.codec import (
    ONE_PASS_MIN,
    decode_message,
    register_deferred_string,
)
from exec_server.protocol.json_span import StringSpan, find_string_member
from exec_server.protocol.messages import Request
from exec_server.server.fs_handlers import decode_data_base64, decode_data_span

needs_native = pytest.mark.skipif(not native_base64.available(), reason="no libcrypto")

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


# --------------------------------------------------------- native_base64


@needs_native
@given(st.binary(max_size=300))
def test_native_decodes_what_msgspec_decodes(data: bytes) -> None:
    text = base64.b64encode(data)
    decoded = native_base64.decode_strict(b"xx" + text + b"yy", 2, 2 + len(text))
    assert decoded is not None and bytes(decoded) == data


@pytest.mark.skipif(not native_base64.encoder_available(), reason="no libcrypto")
@given(st.binary(max_size=300), st.integers(0, 7))
def test_native_encodes_what_base64_encodes(data: bytes, offset: int) -> None:
    length = native_base64.encoded_length(len(data))
    out = bytearray(b"?" * (offset + length + 1))
    native_base64.encode_into(data, out, offset)
    assert bytes(out[offset : offset + length]) == base64.b64encode(data)
    assert out[:offset] == b"?" * offset  # nothing before the offset is touched
    with pytest.raises(ValueError, match="too short"):
        native_base64.encode_into(data, bytearray(offset + length), offset)


@pytest.mark.skipif(not native_base64.encoder_available(), reason="no libcrypto")
@given(st.binary(max_size=400), st.integers(1, 50).map(lambda n: 3 * n), st.integers(0, 7))
def test_native_encodes_the_tail_of_its_own_buffer(data: bytes, piece: int, offset: int) -> None:
    """The bytes wait at the back of the text's place; the text comes out in front."""
    length = native_base64.encoded_length(len(data))
    out = bytearray(b"<" * offset + b"?" * (length - len(data)) + data + b">")
    native_base64.encode_tail_in_place(out, offset, len(data), piece)
    assert bytes(out[offset : offset + length]) == base64.b64encode(data)
    assert out[:offset] == b"<" * offset
    assert len(out) == offset + length + 1


@pytest.mark.skipif(not native_base64.encoder_available(), reason="no libcrypto")
def test_native_in_place_encoding_refuses_what_does_not_fit() -> None:
    with pytest.raises(ValueError, match="too short"):
        native_base64.encode_tail_in_place(bytearray(8), 0, 6)  # 8 characters, no spare byte
    with pytest.raises(ValueError, match="multiple of 3"):
        native_base64.encode_tail_in_place(bytearray(9), 0, 6, piece=4)


def _msgspec_bytes(text: bytes) -> bytes | None:
    try:
        return msgspec.json.decode(b'"' + text + b'"', type=bytes)
    except msgspec.DecodeError:
        return None


@needs_native
@given(
    st.one_of(
        st.binary(max_size=40),
        st.text(alphabet="ABCDQRSTabc+/= \t\n-_", max_size=40).map(str.encode),
    )
)
def test_native_never_accepts_more_than_msgspec(text: bytes) -> None:
    got = native_base64.decode_strict(text, 0, len(text))
    if got is not None:
        assert bytes(got) == _msgspec_bytes(text)


@needs_native
@pytest.mark.parametrize(
    "text", [b" QUJD", b"QUJD\n", b"\tQUJD", b"QQ==QUJD", b"QU=D", b"=QUJ", b"Q===", b"QUJ-"]
)
def test_native_refuses_what_evp_would_bend(text: bytes) -> None:
    assert native_base64.decode_strict(text, 0, len(text)) is None


@needs_native
def test_native_trailing_padding() -> None:
    for raw in (b"A", b"AB", b"ABC", b"ABCD"):
        text = base64.b64encode(raw)
        assert bytes(native_base64.decode_strict(text, 0, len(text)) or b"?") == raw
    # msgspec accepts stray bits in the last group; so do we, with its result.
    assert bytes(native_base64.decode_strict(b"QR==", 0, 4) or b"?") == b"A"


def _joined(pieces: Any) -> bytes:
    out = bytearray()
    for piece in pieces():
        out += piece  # used before the next piece reuses the buffer
    return bytes(out)


@needs_native
@given(st.binary(max_size=300), st.integers(1, 40).map(lambda n: 4 * n), st.booleans())
def test_native_pieces_join_to_what_decode_strict_gives(
    data: bytes, piece: int, gathered: bool
) -> None:
    text = b"xx" + base64.b64encode(data) + b"yy"
    source: bytes | bytearray = bytearray(text) if gathered else text
    pieces = native_base64.decode_pieces(source, 2, len(text) - 2, piece)
    assert pieces is not None
    assert _joined(pieces) == data
    assert _joined(pieces) == data  # each call decodes anew
    # One buffer, reused: never bigger than a piece's bytes.
    assert all(len(p) <= piece // 4 * 3 for p in pieces())


@needs_native
@given(
    st.one_of(
        st.binary(max_size=40),
        st.text(alphabet="ABCDQRSTabc+/= \t\n-_", max_size=40).map(str.encode),
    ),
    st.integers(1, 4).map(lambda n: 4 * n),
)
def test_native_pieces_accept_exactly_what_decode_strict_accepts(text: bytes, piece: int) -> None:
    whole = native_base64.decode_strict(text, 0, len(text))
    pieces = native_base64.decode_pieces(text, 0, len(text), piece)
    if pieces is None:
        assert whole is None
        return
    try:
        got = _joined(pieces)
    except native_base64.Undecodable:
        assert whole is None
    else:
        assert whole is not None and got == bytes(whole)


@needs_native
def test_native_pieces_stop_at_the_piece_evp_refuses() -> None:
    good = base64.b64encode(os.urandom(3 * 1000))  # 4000 characters
    text = good[:2500] + b"!" + good[2501:]
    pieces = native_base64.decode_pieces(text, 0, len(text), 1000)
    assert pieces is not None
    seen = []
    with pytest.raises(native_base64.Undecodable, match="characters 2000-3000"):
        for piece in pieces():
            seen.append(bytes(piece))
    assert b"".join(seen) == base64.b64decode(good[:2000])
    assert native_base64.decode_pieces(text, 0, len(text), 6) is None  # not whole groups


class _Pairs:
    """A ``run_pair`` that runs each pair on two real threads, the second task
    first, and records the pairs it was given."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def __call__(self, tasks: Any) -> None:
        self.sizes.append(len(tasks))
        errors: list[BaseException] = []

        def run(task: Any) -> None:
            try:
                task()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(task,)) for task in reversed(tasks)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]


def _joined_paired(pieces: Any, pairs: _Pairs) -> bytes:
    out = bytearray()
    for piece in pieces(pairs):
        out += piece
    return bytes(out)


@needs_native
@given(st.binary(max_size=600), st.integers(1, 40).map(lambda n: 4 * n))
def test_native_pieces_decoded_two_at_a_time_join_to_the_same_bytes(
    data: bytes, piece: int
) -> None:
    text = b"xx" + base64.b64encode(data) + b"yy"
    pieces = native_base64.decode_pieces(text, 2, len(text) - 2, piece)
    assert pieces is not None
    pairs = _Pairs()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(native_base64, "PAIR_MIN", 8)
        assert _joined_paired(pieces, pairs) == data
        # Never more than half the text in one piece, so both threads get work.
        n = len(text) - 4
        assert all(len(p) <= max(1, -(-n // 8)) * 3 for p in pieces(_Pairs()))
    if len(text) - 4 >= 8:
        assert pairs.sizes and set(pairs.sizes) == {2}  # only whole pairs go to run_pair
    else:
        assert pairs.sizes == []  # below PAIR_MIN: decoded on the calling thread


@needs_native
def test_native_pieces_two_at_a_time_only_from_pair_min() -> None:
    text = base64.b64encode(os.urandom(3 * (native_base64.PAIR_MIN // 4)))
    below = text[: native_base64.PAIR_MIN - 4]
    for source, paired in ((text, True), (below, False)):
        pieces = native_base64.decode_pieces(source, 0, len(source))
        assert pieces is not None
        pairs = _Pairs()
        assert _joined_paired(pieces, pairs) == base64.b64decode(source)
        assert (pairs.sizes == [2]) is paired


@needs_native
@pytest.mark.parametrize("bad_at", [100, 2600], ids=["first-lane", "second-lane"])
def test_native_pieces_two_at_a_time_stop_at_a_refused_piece(bad_at: int) -> None:
    good = base64.b64encode(os.urandom(3 * 1000))  # 4000 characters: pieces of 2000
    text = good[:bad_at] + b"!" + good[bad_at + 1 :]
    pieces = native_base64.decode_pieces(text, 0, len(text), 4000)
    assert pieces is not None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(native_base64, "PAIR_MIN", 8)
        where = "0-2000" if bad_at < 2000 else "2000-4000"
        with pytest.raises(native_base64.Undecodable, match=f"characters {where}"):
            _joined_paired(pieces, _Pairs())


# ------------------------------------------------------------------ codec


@pytest.fixture
def deferred(fresh_codec: None) -> None:
    """The server's registration, undone afterwards."""
    register_deferred_string(
        t.METHOD_WRITE_FILE, "dataBase64", t.WriteFileParamsHead, t.WriteFileParamsSpan.from_head
    )


def big_write(data_text: str, **extra: object) -> bytes:
    params = {"path": "/x", "dataBase64": data_text, **extra}
    return msgspec.json.encode({"id": 7, "method": "fs/writeFile", "params": params})


@pytest.mark.usefixtures("deferred")
def test_big_requests_leave_the_member_in_place() -> None:
    payload = os.urandom(ONE_PASS_MIN)
    message = big_write(base64.b64encode(payload).decode(), sandbox={"dataBase64": "x"})
    msg = decode_message(message)
    assert isinstance(msg, Request) and (msg.id, msg.method) == (7, "fs/writeFile")
    params = msg.decoded
    assert isinstance(params, t.WriteFileParamsSpan) and params.path == "/x"
    assert bytes(t.sandbox_raw(params.sandbox) or b"") == b'{"dataBase64":"x"}'
    assert isinstance(params.data_base64, StringSpan) and params.data_base64.data is message
    assert bytes(decode_data_span(params.data_base64)) == payload
    # Member order does not matter, at either level.
    reordered = msgspec.json.encode(
        {
            "params": {"dataBase64": base64.b64encode(payload).decode(), "path": "/y"},
            "method": "fs/writeFile",
            "id": "s",
        }
    )
    msg2 = decode_message(reordered)
    assert isinstance(msg2, Request) and msg2.id == "s"
    assert isinstance(msg2.decoded, t.WriteFileParamsSpan) and msg2.decoded.path == "/y"
    assert bytes(decode_data_span(msg2.decoded.data_base64)) == payload


@needs_native
@pytest.mark.usefixtures("deferred")
def test_a_message_gathered_from_fragments_is_decoded_in_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fragmented message arrives as the bytearray its fragments grew: the member
    is found and decoded natively there, nothing copied to ``bytes`` first."""
    payload = os.urandom(ONE_PASS_MIN)
    message = bytearray(big_write(base64.b64encode(payload).decode()))
    msg = decode_message(message)
    assert isinstance(msg, Request) and isinstance(msg.decoded, t.WriteFileParamsSpan)
    span = msg.decoded.data_base64
    assert isinstance(span, StringSpan) and span.data is message
    monkeypatch.setattr(
        "exec_server.server.fs_handlers.decode_data_base64",
        lambda raw: pytest.fail("took the slow path"),
    )
    assert bytes(decode_data_span(span)) == payload


@pytest.mark.usefixtures("deferred")
def test_small_escaped_or_mistyped_requests_take_the_other_paths() -> None:
    text = base64.b64encode(b"\xff" * ONE_PASS_MIN).decode()
    small = decode_message(big_write("QUJD"))
    assert isinstance(small, Request) and small.decoded is None
    escaped = decode_message(big_write(text).replace(b"/", b"\\/"))
    assert isinstance(escaped, Request) and escaped.decoded is None and escaped.params
    mistyped = decode_message(big_write(text).replace(b'"/x"', b"5"))
    assert isinstance(mistyped, Request) and mistyped.decoded is None


@pytest.mark.usefixtures("deferred")
@pytest.mark.parametrize(
    "bad",
    [
        b"!!!!",  # a bad symbol
        b"QUJ",  # bad length
        b"QUJD\\n",  # an escape: not deferred, same error
        b"QUJD\n",  # a raw control character: not JSON text
        b"QU\xffJD",  # not UTF-8
    ],
)
def test_bad_base64_in_a_big_request_is_invalid_request(bad: bytes) -> None:
    body = base64.b64encode(b"\0" * (ONE_PASS_MIN // 3 * 3 + 3)) + bad  # no padding
    message = b'{"id":1,"method":"fs/writeFile","params":{"path":"/x","dataBase64":"%s"}}' % body
    msg = decode_message(message)
    assert isinstance(msg, Request)
    params = msg.decoded
    if isinstance(params, t.WriteFileParamsSpan):
        with pytest.raises(InvalidRequestError) as span_error:
            decode_data_span(params.data_base64)
        message_text = span_error.value.message
    else:
        if isinstance(params, t.WriteFileParams):  # one pass, the member kept raw
            raw = params.data_base64
        else:
            assert msg.params is not None
            raw = msgspec.json.decode(msg.params, type=t.WriteFileParams).data_base64
        with pytest.raises(InvalidRequestError) as raw_error:
            decode_data_base64(raw)
        message_text = raw_error.value.message
    assert message_text.startswith("fs/writeFile requires valid base64 dataBase64: ")
    if bad == b"!!!!":
        assert message_text.endswith(f"Invalid symbol 33, offset {len(body) - 4}.")
