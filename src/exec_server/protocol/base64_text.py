"""``dataBase64`` text <-> bytes a ~1 MiB slice at a time (from a worker thread, the
event loop runs between slices), judged by upstream's rules (Rust ``base64`` 0.22),
with msgspec's base64 (1.5-3x ``binascii``'s speed)."""

from __future__ import annotations

import binascii
import mmap
from collections.abc import Iterable, Iterator
from typing import Final

import msgspec

__all__ = [
    "DECODE_SLICE",
    "ENCODE_SLICE",
    "MAPPED_MIN",
    "Undecodable",
    "decode_slices",
    "decoded_size",
    "encode_pieces_quoted",
    "encode_quoted",
    "error_text",
    "stray_bits",
]

#: Characters of text decoded per call (a multiple of 4: whole groups).
DECODE_SLICE: Final = 1 << 20
#: Bytes encoded per call (a multiple of 3: no padding inside the text).
ENCODE_SLICE: Final = 3 << 18
#: Texts from this size on are built in an anonymous mapping (:func:`encode_pieces_quoted`).
MAPPED_MIN: Final = 4 << 20

_VALUES: Final = {
    c: i for i, c in enumerate(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
}
_PAD: Final = 0x3D
#: byte -> 0 for a base64 symbol, 1 for anything else
_SYMBOL_OR_NOT: Final = bytes(0 if c in _VALUES else 1 for c in range(256))
_SCAN_CHUNK: Final = 1 << 20
_json_encode: Final = msgspec.json.Encoder().encode
_bytes_decode: Final = msgspec.json.Decoder(bytes).decode
_QUOTE: Final = 0x22


class Undecodable(ValueError):
    """A slice of the text is not base64 (:func:`decode_slices`)."""


Text = bytes | bytearray | memoryview


def decoded_size(text: Text, start: int, end: int) -> int:
    """Bytes that valid padded ``text[start:end]`` decodes to."""
    n = end - start
    if n < 4:
        return 0
    pad = (text[end - 1] == _PAD) + (text[end - 2] == _PAD)
    return n // 4 * 3 - pad


def decode_slices(text: Text, start: int, end: int) -> Iterator[bytes]:
    """The bytes of ``text[start:end]`` (no JSON escapes), :data:`DECODE_SLICE` characters
    at a time, each read as a JSON string by msgspec (strict ``binascii`` judges a slice it
    refuses). The iterator raises Undecodable at a bad slice (stray bits pass).
    """
    piece = DECODE_SLICE
    view = memoryview(text)
    token = bytearray(min(piece, end - start) + 2)
    token[0] = _QUOTE
    at = start
    while at < end:
        stop = min(at + piece, end)
        n = stop - at
        if stop < end and view[stop - 1] == _PAD:
            raise Undecodable("padding before the end")
        token[1 : n + 1] = view[at:stop]
        token[n + 1] = _QUOTE
        try:
            decoded = _bytes_decode(memoryview(token)[: n + 2])
        except (msgspec.ValidationError, msgspec.DecodeError):
            # upstream's rules judge what msgspec refuses; strict binascii alone
            # would take a lone "=" after a whole group ("DDDQ=")
            error = error_text(view[at:stop])
            if error is not None:
                raise Undecodable(error) from None
            decoded = binascii.a2b_base64(view[at:stop], strict_mode=True)
        yield decoded
        at = stop


def encode_quoted(data: Text) -> bytes | bytearray | mmap.mmap:
    """``data`` as a JSON string of padded base64, quotes included: in one call
    under :data:`MAPPED_MIN` of text, else as :func:`encode_pieces_quoted` does."""
    view = memoryview(data)
    size = len(view)
    if (size + 2) // 3 * 4 + 2 < MAPPED_MIN:
        return _json_encode(data)
    step = ENCODE_SLICE
    return encode_pieces_quoted((view[i : i + step] for i in range(0, size, step)), size)


def encode_pieces_quoted(pieces: Iterable[Text], size: int) -> bytearray | mmap.mmap:
    """``pieces`` (multiples of 3 bytes but the last; ValueError unless ``size`` in all) as
    a quoted base64 JSON string. From :data:`MAPPED_MIN` on in an anonymous mapping, which
    goes back to the system when freed (glibc keeps freed heap blocks up to 32 MiB)."""
    length = (size + 2) // 3 * 4 + 2
    out = mmap.mmap(-1, length) if length >= MAPPED_MIN else bytearray(length)
    out[0:1] = out[-1:] = b'"'
    at = 1
    padded = False
    for piece in pieces:
        if padded:
            raise ValueError("a piece before the last was not a multiple of 3 bytes")
        padded = len(piece) % 3 != 0
        chunk = memoryview(_json_encode(piece))[1:-1]
        if at + len(chunk) > len(out) - 1:
            raise ValueError(f"pieces were more than {size} bytes")
        out[at : at + len(chunk)] = chunk
        at += len(chunk)
    if at != len(out) - 1:
        raise ValueError(f"pieces were fewer than {size} bytes")
    return out


def stray_bits(text: Text, start: int, end: int) -> bool:
    """Whether otherwise valid ``text[start:end]`` sets bits its last symbol does not
    carry (``aR==`` for ``aQ==``), which upstream refuses and msgspec decodes."""
    if end - start < 4 or text[end - 1] != _PAD:
        return False
    if text[end - 2] == _PAD:
        return bool(_VALUES.get(text[end - 3], 0) & 0x0F)
    return bool(_VALUES.get(text[end - 2], 0) & 0x03)


def _first_non_symbol(data: Text, end: int) -> int:
    """Offset of the first byte before ``end`` that is no base64 symbol, or -1."""
    view = memoryview(data)
    for start in range(0, end, _SCAN_CHUNK):
        stop = min(start + _SCAN_CHUNK, end)
        found = bytes(view[start:stop]).translate(_SYMBOL_OR_NOT).find(1)
        if found >= 0:
            return start + found
    return -1


def error_text(data: Text) -> str | None:
    """Upstream's error for base64 text ``data``, or None if it is valid; checked in
    upstream's order (a lone last symbol, the groups before the last, the last)."""
    values = _VALUES
    n = len(data)
    rem = n % 4
    if rem == 1 and data[-1] != _PAD and data[-1] not in values:
        return f"Invalid symbol {data[-1]}, offset {n - 1}."
    body = max(n - rem - (4 if rem == 0 else 0), 0)
    offset = _first_non_symbol(data, body)
    if offset >= 0:
        return f"Invalid symbol {data[offset]}, offset {offset}."
    morsels: list[int] = []
    pads = first_pad = last = 0
    for k in range(body, n):
        byte = data[k]
        if byte == _PAD:
            if k - body < 2:
                return f"Invalid symbol {byte}, offset {k}."
            if not pads:
                first_pad = k
            pads += 1
            continue
        if pads:
            return f"Invalid symbol {_PAD}, offset {first_pad}."
        value = values.get(byte)
        if value is None:
            return f"Invalid symbol {byte}, offset {k}."
        last = byte
        morsels.append(value)
    if n and len(morsels) < 2:
        return f"Invalid input length: {body + len(morsels)}"
    if (pads + len(morsels)) % 4:
        return "Invalid padding"
    bits = 0
    for i, value in enumerate(morsels):
        bits |= value << (18 - 6 * i)
    if bits & (0xFFFFFF >> (len(morsels) * 6 // 8 * 8)):
        return f"Invalid last symbol {last}, offset {body + len(morsels) - 1}."
    return None
