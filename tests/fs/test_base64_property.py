"""Property tests of the ``dataBase64`` decoder (it parses client input)."""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exec_server.exceptions import InvalidParamsError, InvalidRequestError
from exec_server.fs import ops
from exec_server.protocol import fs_types as t
from exec_server.protocol import native_base64
from exec_server.protocol.codec import ONE_PASS_MIN, ProtocolError, decode_message
from exec_server.protocol.json_span import StringSpan
from exec_server.protocol.messages import Request
from exec_server.server import fs_handlers
from exec_server.server.fs_handlers import (
    data_span_payload,
    decode_data_base64,
    decode_data_span,
    encode_read_reply,
    read_into_reply,
    receive_into_reply,
)
from exec_server.server.router import Router

B64_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="


@given(st.binary(max_size=4096))
def test_round_trip(data: bytes) -> None:
    token = msgspec.json.encode(base64.b64encode(data).decode())
    assert decode_data_base64(msgspec.Raw(token)) == data
    encoded = encode_read_reply(7, data)
    # Written by libcrypto outside the GIL when it is there (a bytearray), else by msgspec.
    assert isinstance(encoded.payload, bytearray) == native_base64.encoder_available()
    reply = json.loads(encoded.payload)
    assert reply == {"id": 7, "result": {"dataBase64": json.loads(token)}}


@given(st.one_of(st.text(alphabet=B64_CHARS, max_size=64), st.text(max_size=64)))
def test_arbitrary_strings_decode_or_fail_cleanly(text: str) -> None:
    """Accepted exactly when the text is the canonical padded encoding of its bytes
    (the only form upstream's decoder accepts), refused with the prefix otherwise."""
    token = msgspec.Raw(msgspec.json.encode(text))
    try:
        expected: bytes | None = binascii.a2b_base64(text.encode("utf-8"), strict_mode=True)
    except (binascii.Error, ValueError):
        expected = None
    if expected is not None and base64.b64encode(expected).decode() != text:
        expected = None  # stray bits in the last symbol: not canonical
    try:
        got = decode_data_base64(token)
    except InvalidRequestError as exc:
        assert exc.message.startswith("fs/writeFile requires valid base64 dataBase64: ")
        assert expected is None
        return
    assert got == expected


@given(st.one_of(st.integers(), st.booleans(), st.none(), st.lists(st.integers(), max_size=3)))
def test_non_strings_are_invalid_params(value: object) -> None:
    try:
        decode_data_base64(msgspec.Raw(msgspec.json.encode(value)))
    except InvalidParamsError as exc:
        assert "dataBase64" in exc.message
    else:
        raise AssertionError("a non-string decoded")


_CORPUS = json.loads((Path(__file__).parent / "data" / "upstream_base64.json").read_text())


@pytest.mark.parametrize("case", _CORPUS["cases"], ids=lambda c: repr(c["dataBase64"])[:40])
def test_upstream_answers_are_reproduced(case: dict[str, str]) -> None:
    """Each ``dataBase64`` upstream 0.163.0 was sent (recorded in
    ``data/upstream_base64.json``): the same bytes, or the same error text."""
    token = msgspec.Raw(msgspec.json.encode(case["dataBase64"]))
    if case["error"] is None:
        assert decode_data_base64(token).hex() == case["hex"]
        return
    with pytest.raises(InvalidRequestError) as exc:
        decode_data_base64(token)
    assert exc.value.message == f"fs/writeFile requires valid base64 dataBase64: {case['error']}"


def _shifted(error: str, by: int) -> str:
    """Upstream's error for the same text after ``by`` more leading characters."""
    return re.sub(r"(offset |length: )(\d+)", lambda m: f"{m[1]}{int(m[2]) + by}", error)


@pytest.fixture
def big_paths(fresh_codec: None) -> None:
    """The server's registrations for big writes (undone afterwards)."""
    fs_handlers.register(Router())


@pytest.mark.usefixtures("big_paths")
@pytest.mark.parametrize("case", _CORPUS["cases"][::5], ids=lambda c: repr(c["dataBase64"])[:40])
@pytest.mark.parametrize("way", ["whole", "pieces", "paired"])
def test_big_requests_give_the_same_answers(
    case: dict[str, str], way: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind 64 KiB of valid text the request takes the big paths (the payload
    decoded where it lies, natively when it can be): same acceptance, same text.
    ``pieces``: as a confined write decodes it; ``paired``: as a worker does, two
    pieces at a time on two threads."""
    lead = "QUJD" * (ONE_PASS_MIN // 4)
    text = lead + case["dataBase64"]
    message = msgspec.json.encode(
        {"id": 1, "method": "fs/writeFile", "params": {"path": "/x", "dataBase64": text}}
    )
    try:
        msg = decode_message(message)
    except ProtocolError:
        assert case["error"] is not None and case["error"].startswith("Invalid symbol")
        return  # not JSON text at all (a raw control character): the framing error
    assert isinstance(msg, Request)
    params = msg.decoded
    try:
        if isinstance(params, t.WriteFileParamsSpan):
            if way != "whole":
                # The writer's way: in 4 KiB pieces, sent back to the exact decoder
                # when a piece is refused.
                monkeypatch.setattr(native_base64, "PIECE", 4096)
                monkeypatch.setattr(native_base64, "PAIR_MIN", 8)
                payload = data_span_payload(params.data_base64)
                paired = way == "paired"
                got = bytes(_paired_bytes(payload) if paired else ops.payload_bytes(payload))
            else:
                got = bytes(decode_data_span(params.data_base64))
        else:
            raw = (
                params.data_base64
                if isinstance(params, t.WriteFileParams)
                else (msgspec.json.decode(msg.params or b"{}", type=t.WriteFileParams).data_base64)
            )
            got = decode_data_base64(raw)
    except InvalidRequestError as exc:
        assert case["error"] is not None, exc.message
        assert exc.message == (
            "fs/writeFile requires valid base64 dataBase64: " + _shifted(case["error"], len(lead))
        )
        return
    assert case["error"] is None
    assert got == b"ABC" * (len(lead) // 4) + bytes.fromhex(case["hex"])


def _run_in_turn(tasks: Sequence[Callable[[], object]]) -> None:
    """A ``run_pair``: every task, then the first error raised."""
    errors: list[BaseException] = []
    for task in tasks:
        try:
            task()
        except BaseException as exc:
            errors.append(exc)
    if errors:
        raise errors[0]


def _paired_bytes(payload: ops.Payload) -> bytes:
    """:func:`ops.payload_bytes`, with the pieces made two at a time (``produce_paired``)."""
    if not isinstance(payload, ops.Pieces):
        return bytes(payload)
    assert payload.produce_paired is not None
    whole = bytearray()
    try:
        for piece in payload.produce_paired(_run_in_turn):
            whole += piece
    except ops.WriteInstead as instead:
        return bytes(instead.data)
    return bytes(whole)


def _reply_data(encoded: Any) -> bytes:
    reply = json.loads(encoded.payload)
    assert set(reply) == {"id", "result"} and reply["id"] == 9
    return base64.b64decode(reply["result"]["dataBase64"], validate=True)


@pytest.mark.parametrize("change", [0, -1, 1, -1000], ids=["same", "grew", "shrank", "grew-more"])
@pytest.mark.parametrize("native", [True, False], ids=["native", "msgspec"])
def test_read_into_reply_sends_the_file_as_it_is_when_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: int, native: bool
) -> None:
    """``size`` is what ``fstat`` said: a file read straight into its reply comes out
    whole even if it is longer or shorter by then, and the descriptor is closed."""
    if native and not native_base64.encoder_available():
        pytest.skip("no libcrypto")
    if not native:
        monkeypatch.setattr(native_base64, "encoder_available", lambda: False)
    data = os.urandom(3 * 100_000 + 1)
    path = tmp_path / "f"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    encoded = read_into_reply(9, fd, len(data) + change)
    assert _reply_data(encoded) == data
    with pytest.raises(OSError):
        os.fstat(fd)


@pytest.mark.parametrize("size", [0, 1, 2, 3, 3 * 100_000 + 1, (3 << 18) * 2 + 5])
def test_receive_into_reply_turns_the_received_bytes_into_the_reply(size: int) -> None:
    """A confined read's bytes are received into the view ``receive_into_reply``
    gives (the back of the reply's buffer), then encoded there: the reply
    carries exactly those bytes, pieces of ``ENCODE_PIECE`` included."""
    if not native_base64.encoder_available():
        pytest.skip("no libcrypto")
    data = os.urandom(size)
    view, finish = receive_into_reply(9, size)
    assert len(view) == size
    view[:] = data
    assert _reply_data(finish()) == data


@given(
    st.binary(min_size=1, max_size=3000),
    st.integers(min_value=0),
    st.sampled_from(["*", "=", "-", "_", " ", "A", "é", "\x7f"]),
    st.integers(1, 30).map(lambda n: 4 * n),
)
def test_paired_pieces_answer_as_the_exact_decoder_wherever_the_text_breaks(
    data: bytes, where: int, char: str, piece: int
) -> None:
    """A big write's text decoded two pieces at a time (as a worker does it), with
    one character replaced anywhere - in either lane of any pair: the same bytes
    as the exact decoder, or its very error text."""
    text = base64.b64encode(data).decode()
    where %= len(text)
    text = text[:where] + char + text[where + 1 :]
    token = msgspec.json.encode(text)
    try:
        expected: bytes | str = decode_data_base64(msgspec.Raw(token))
    except InvalidRequestError as exc:
        expected = exc.message
    message = b'{"a":' + token + b"}"
    span = StringSpan(message, 6, len(message) - 2)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(native_base64, "PIECE", piece)
        mp.setattr(native_base64, "PAIR_MIN", 8)
        try:
            got: bytes | str = _paired_bytes(data_span_payload(span))
        except InvalidRequestError as exc:
            got = exc.message
    assert got == expected


@pytest.mark.parametrize("where", ["first", "before chunk end", "at chunk start", "last of body"])
def test_a_bad_symbol_is_named_at_its_offset_across_scan_chunks(where: str) -> None:
    """The body is scanned a chunk at a time in C; the first bad byte is found
    wherever it falls, and a bad byte in the last group is judged there."""
    chunk = fs_handlers._SCAN_CHUNK
    text = bytearray(base64.b64encode(os.urandom(3 * chunk // 4 * 2 + 300)))
    body = len(text) - 4  # the last group is checked apart (padding rules)
    offset = {
        "first": 0,
        "before chunk end": chunk - 1,
        "at chunk start": chunk,
        "last of body": body - 1,
    }[where]
    text[offset] = ord("!")
    text[-1] = ord("?")  # a later bad byte (last group) must not be the one named
    assert fs_handlers._base64_error_text(bytes(text)) == f"Invalid symbol 33, offset {offset}."
