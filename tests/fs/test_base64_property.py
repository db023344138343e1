"""Property tests of the ``dataBase64`` decoder (it parses client input)."""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exec_server.exceptions import InvalidParamsError, InvalidRequestError
from exec_server.fs import direct as ops
from exec_server.protocol import base64_text
from exec_server.protocol.codec import SPAN_MIN, ProtocolError, decode_message
from exec_server.protocol.json_span import StringSpan
from exec_server.protocol.messages import Request
from exec_server.protocol.types import fs as t
from exec_server.server.handlers.fs import (
    decode_data_base64,
    read_text,
    read_text_pieces,
    span_payload,
)

B64_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="


@given(st.binary(max_size=4096))
def test_round_trip(data: bytes) -> None:
    token = msgspec.json.encode(base64.b64encode(data).decode())
    assert decode_data_base64(msgspec.Raw(token)) == data
    assert msgspec.json.encode(read_text(data)) == b'{"dataBase64":' + token + b"}"


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


@pytest.mark.parametrize("case", _CORPUS["cases"][::5], ids=lambda c: repr(c["dataBase64"])[:40])
@pytest.mark.parametrize("piece", [4096, base64_text.DECODE_SLICE])
def test_big_requests_give_the_same_answers(
    case: dict[str, str], piece: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind 1 MiB of valid text the request takes the big path (the payload
    decoded where it lies, a slice at a time): same acceptance, same text."""
    monkeypatch.setattr(base64_text, "DECODE_SLICE", piece)
    lead = "QUJD" * (SPAN_MIN // 4)
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
    try:
        if msg.span is not None:
            got = bytes(ops.payload_bytes(span_payload(msg.span)))
        else:
            raw = msgspec.json.decode(msg.params or b"{}", type=t.WriteFileParams).data_base64
            got = decode_data_base64(raw)
    except InvalidRequestError as exc:
        assert case["error"] is not None, exc.message
        assert exc.message == (
            "fs/writeFile requires valid base64 dataBase64: " + _shifted(case["error"], len(lead))
        )
        return
    assert case["error"] is None
    assert got == b"ABC" * (len(lead) // 4) + bytes.fromhex(case["hex"])


@pytest.mark.parametrize("size", [0, 1, 2, 3, 3 * 100_000 + 1, (3 << 18) * 2 + 5])
def test_a_big_read_is_the_json_string_of_its_base64(size: int) -> None:
    data = os.urandom(size)
    reply = msgspec.json.encode(read_text(data))
    assert json.loads(reply) == {"dataBase64": base64.b64encode(data).decode()}


@given(
    st.binary(min_size=1, max_size=3000),
    st.integers(min_value=0),
    st.sampled_from(["*", "=", "-", "_", " ", "A", "é", "\x7f"]),
    st.integers(1, 30).map(lambda n: 4 * n),
)
def test_slices_answer_as_the_exact_decoder_wherever_the_text_breaks(
    data: bytes, where: int, char: str, piece: int
) -> None:
    """A big write's text decoded a slice at a time, with one character replaced
    anywhere - at a slice's edge or inside: the same bytes as the exact decoder,
    or its very error text."""
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
        mp.setattr(base64_text, "DECODE_SLICE", piece)
        try:
            got: bytes | str = bytes(ops.payload_bytes(span_payload(span)))
        except InvalidRequestError as exc:
            got = exc.message
    assert got == expected


@pytest.mark.parametrize("where", ["first", "before chunk end", "at chunk start", "last of body"])
def test_a_bad_symbol_is_named_at_its_offset_across_scan_chunks(where: str) -> None:
    """The body is scanned a chunk at a time in C; the first bad byte is found
    wherever it falls, and a bad byte in the last group is judged there."""
    chunk = base64_text._SCAN_CHUNK
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
    assert base64_text.error_text(bytes(text)) == f"Invalid symbol 33, offset {offset}."


@pytest.mark.parametrize("change", [0, -1, 1, -1000], ids=["same", "grew", "shrank", "grew-more"])
def test_a_big_read_sends_the_file_as_it_is_when_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: int
) -> None:
    """A big file is read a piece at a time into its text, for the size its ``fstat``
    said: one that is longer or shorter by then is read again whole, and the
    reply holds exactly what it holds; the descriptor is closed either way."""
    from exec_server.fs import service

    data = os.urandom(3 * 100_000 + 1)
    path = tmp_path / "f"
    path.write_bytes(data)
    opened: list[int] = []
    real_open = ops.open_for_read

    def open_for_read(name: str, **kwargs: Any) -> tuple[int, int | None]:
        fd, size = real_open(name, **kwargs)
        opened.append(fd)
        assert size is not None
        return fd, size + change

    monkeypatch.setattr(ops, "open_for_read", open_for_read)
    monkeypatch.setattr(service, "PIECES_MIN", 1)
    monkeypatch.setattr(service, "READ_PIECE", 3 * 1000)
    pieces_used: list[int] = []

    def read_pieces(pieces: Any, size: int) -> t.ReadFileText:
        pieces_used.append(size)
        return read_text_pieces(pieces, size)

    result = service._read_direct(str(path), False, read_text, 1000, read_pieces)
    assert isinstance(result, t.ReadFileText)
    text = base64.b64encode(data).decode()
    assert json.loads(msgspec.json.encode(result)) == {"dataBase64": text}
    assert pieces_used == [len(data) + change]
    with pytest.raises(OSError):
        os.fstat(opened[0])
