"""Property tests of the ``dataBase64`` decoder (it parses client input)."""

from __future__ import annotations

import base64
import binascii

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from exec_server.exceptions import InvalidParamsError, InvalidRequestError
from exec_server.server.fs_handlers import decode_data_base64, encode_data_base64

B64_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="


@given(st.binary(max_size=4096))
def test_round_trip(data: bytes) -> None:
    token = msgspec.json.encode(base64.b64encode(data).decode())
    assert decode_data_base64(msgspec.Raw(token)) == data
    assert bytes(encode_data_base64(data)) == token


@given(st.one_of(st.text(alphabet=B64_CHARS, max_size=64), st.text(max_size=64)))
def test_arbitrary_strings_decode_or_fail_cleanly(text: str) -> None:
    token = msgspec.Raw(msgspec.json.encode(text))
    try:
        expected: bytes | None = binascii.a2b_base64(text.encode("utf-8"), strict_mode=True)
    except (binascii.Error, ValueError):
        expected = None
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
