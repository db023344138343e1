"""Find where one string member of a JSON message lies, without decoding it: a JSON
decoder walks a big ``fs/writeFile``'s base64 in one GIL-holding call (~2 s a GiB).
Anything unusual gives None, and the caller uses the ordinary decoder."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

__all__ = ["WINDOW", "StringSpan", "find_string_member"]

#: Bytes one ``bytes.find`` call looks at (~0.1 ms): the GIL goes back between them.
WINDOW: Final = 1 << 20

_BACKSLASH: Final = 0x5C
_QUOTE: Final = 0x22
_OPEN: Final = frozenset(b"{[")
_NOT_WHITESPACE: Final = re.compile(rb"[^ \t\r\n]")
_STRUCTURAL: Final = re.compile(rb'["{}\[\]]')
_SCALAR_END: Final = re.compile(rb"[,}\]\s]")


class _Unusual(Exception):
    """The text is not the plain shape this scanner handles."""


def _find(data: bytes | bytearray, byte: bytes, start: int, end: int) -> int:
    while start < end:
        stop = min(start + WINDOW, end)
        found = data.find(byte, start, stop)
        if found >= 0:
            return found
        start = stop
    return -1


def _skip_ws(data: bytes | bytearray, i: int) -> int:
    m = _NOT_WHITESPACE.search(data, i)
    if m is None:
        raise _Unusual
    return m.start()


def _string_end(data: bytes | bytearray, i: int) -> int:
    j = i + 1
    n = len(data)
    while True:
        j = _find(data, b'"', j, n)
        if j < 0:
            raise _Unusual
        k = j
        while data[k - 1] == _BACKSLASH:
            k -= 1
        if (j - k) % 2 == 0:
            return j + 1
        j += 1


def _value_end(data: bytes | bytearray, i: int) -> int:
    c = data[i]
    if c == _QUOTE:
        return _string_end(data, i)
    if c in _OPEN:
        depth = 0
        j = i
        while True:
            m = _STRUCTURAL.search(data, j)
            if m is None:
                raise _Unusual
            j = m.start()
            if data[j] == _QUOTE:
                j = _string_end(data, j)
                continue
            depth += 1 if data[j] in _OPEN else -1
            j += 1
            if depth == 0:
                return j
    m = _SCALAR_END.search(data, i)
    if m is None or m.start() == i:
        raise _Unusual
    return m.start()


def _members(data: bytes | bytearray, i: int) -> dict[bytes, tuple[int, int]]:
    """Raw key -> value span of the members of the object opening at ``data[i]``."""
    if data[i] != ord("{"):
        raise _Unusual
    found: dict[bytes, tuple[int, int]] = {}
    i = _skip_ws(data, i + 1)
    if data[i] == ord("}"):
        return found
    while True:
        if data[i] != _QUOTE:
            raise _Unusual
        key_end = _string_end(data, i)
        key = bytes(data[i + 1 : key_end - 1])  # hashable, also from a bytearray
        if b"\\" in key or key in found:
            raise _Unusual  # an escaped or repeated key: leave it to the real decoder
        i = _skip_ws(data, key_end)
        if data[i] != ord(":"):
            raise _Unusual
        start = _skip_ws(data, i + 1)
        end = _value_end(data, start)
        found[key] = (start, end)
        i = _skip_ws(data, end)
        if data[i] == ord("}"):
            return found
        if data[i] != ord(","):
            raise _Unusual
        i = _skip_ws(data, i + 1)


def find_string_member(
    data: bytes | bytearray, outer: bytes, inner: bytes
) -> tuple[int, int] | None:
    """Span (without quotes) of the string ``message[outer][inner]`` if it has no
    escapes; walked member by member, so a key in a string or deeper never matches."""
    try:
        outer_span = _members(data, _skip_ws(data, 0)).get(outer)
        value = None if outer_span is None else _members(data, outer_span[0]).get(inner)
    except (_Unusual, IndexError):
        return None
    if value is None or data[value[0]] != _QUOTE:
        return None
    start, end = value[0] + 1, value[1] - 1
    if _find(data, b"\\", start, end) != -1:
        return None
    return start, end


@dataclass(slots=True, eq=False)
class StringSpan:
    """A JSON string member left undecoded: its text (no escapes) is ``data[start:end]``."""

    data: bytes | bytearray
    start: int
    end: int
