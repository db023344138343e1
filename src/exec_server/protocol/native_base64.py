"""Decode big base64 payloads with OpenSSL's ``EVP_DecodeBlock`` (through ctypes).

Why: an ``fs/writeFile`` of 1 MiB carries 1.4 MB of base64. msgspec decodes it
at ~1 ms/MiB while holding the GIL (it scans the string, then decodes);
``binascii`` takes ~3 ms. ``EVP_DecodeBlock`` takes ~0.5 ms and, being a
foreign call, runs without the GIL, so the event loop keeps serving while a
worker decodes. libcrypto is already in the process (Python's ``ssl`` and
``hashlib`` link it); when it cannot be found, :func:`available` is False and
callers keep msgspec.

``EVP_DecodeBlock`` is laxer than the wire format (it trims whitespace at the
ends and reads ``=`` anywhere as a zero digit), so :func:`decode_strict`
accepts only what msgspec's decoder accepts and returns None for anything else:
the caller then takes the msgspec path, which gives the exact error.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Final, Protocol, cast

__all__ = [
    "ENCODE_PIECE",
    "PAIR_MIN",
    "PIECE",
    "PieceSource",
    "RunPair",
    "Undecodable",
    "available",
    "decode_pieces",
    "decode_strict",
    "encode_into",
    "encode_tail_in_place",
    "encoded_length",
    "encoder_available",
]

#: ``EVP_DecodeBlock`` takes an ``int`` length: decode in chunks below it.
_CHUNK: Final = 1 << 30
#: Characters of base64 text :func:`decode_pieces` decodes at a time (1 MiB).
PIECE: Final = 1 << 20
#: Texts at least this long are decoded on two threads when a caller offers them
#: (512 KiB: below it, waking the second thread costs about what it saves).
PAIR_MIN: Final = 1 << 19

#: ``run_pair(tasks)``: run the (two) tasks at once, raise the first error after both.
RunPair = Callable[[Sequence[Callable[[], object]]], None]


class PieceSource(Protocol):
    """What :func:`decode_pieces` returns: each call decodes the text anew."""

    def __call__(self, run_pair: RunPair | None = None) -> Iterator[memoryview]: ...


class Undecodable(ValueError):
    """A piece of the text turned out not to be plain padded base64."""


def _load(name: str) -> Callable[[int, int, int], int] | None:
    """``name`` (``EVP_DecodeBlock``, ``EVP_EncodeBlock``) from the libcrypto Python
    itself uses, if any."""
    for path in _candidate_paths():
        try:
            lib = ctypes.CDLL(path)
            fn = getattr(lib, name)
        except (OSError, AttributeError):
            continue
        fn.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)
        fn.restype = ctypes.c_int
        return cast("Callable[[int, int, int], int]", fn)
    return None


def _candidate_paths() -> list[str]:
    paths: list[str] = []
    try:
        import _hashlib  # noqa: F401  (maps the libcrypto this Python links)

        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                name = line.rpartition(" ")[2].strip()
                if "/libcrypto" in name and name not in paths:
                    paths.append(name)
    except (ImportError, OSError):
        pass
    if sys.platform == "darwin":
        paths.append("libcrypto.dylib")
    else:
        paths += ["libcrypto.so.3", "libcrypto.so.1.1"]
    return paths


_decode_block: Final = _load("EVP_DecodeBlock")
_encode_block: Final = _load("EVP_EncodeBlock")
#: ``EVP_EncodeBlock`` takes an ``int`` length: encode in chunks below it, whole groups.
_ENCODE_CHUNK: Final = 3 << 28


def available() -> bool:
    return _decode_block is not None


def _padding(data: bytes | bytearray, start: int, end: int) -> int | None:
    """The ``=`` count ending ``data[start:end]``, or None where the text cannot be plain
    padded base64 by its length or its ``=`` (or libcrypto is missing)."""
    n = end - start
    if _decode_block is None or n % 4 or start < 0 or end > len(data):
        return None
    if not n:
        return 0
    # '=' only as the last one or two characters (EVP reads it anywhere).
    if data.find(b"=", start, end - 2) != -1:
        return None
    if data[end - 1] == 0x3D:
        return 2 if data[end - 2] == 0x3D else 1
    return None if data[end - 2] == 0x3D else 0


def _address(data: bytes | bytearray) -> tuple[int, object]:
    """Where ``data``'s bytes are, and an object to keep while that address is used
    (for a ``bytearray``, an export that stops it from being resized meanwhile)."""
    if isinstance(data, bytearray):  # a message gathered from fragments
        keep = (ctypes.c_char * len(data)).from_buffer(data)
        return ctypes.addressof(keep), keep
    address = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value
    assert address is not None
    return address, data


def decode_pieces(
    data: bytes | bytearray, start: int, end: int, piece: int = PIECE
) -> PieceSource | None:
    """:func:`decode_strict` a piece at a time: a function whose every call decodes
    ``data[start:end]`` anew, yielding the bytes of ``piece`` characters at a time
    in a reused buffer (use each before taking the next), or None where
    :func:`decode_strict` would be.

    Why: a writer can then hold the text and one piece, not the text and all of
    its decoding (a 64 MiB write: 85 MiB of text and 64 MiB of bytes before).
    The iterator raises :class:`Undecodable` at a piece libcrypto refuses,
    after the pieces before it.

    Called as ``pieces(run_pair)``, with ``run_pair(tasks)`` running two tasks at
    once (a thread that would wait anyway, and a helper), a text of
    :data:`PAIR_MIN` characters or more is decoded two pieces at a time, each
    into its own buffer, the pieces at most half the text: libcrypto's decoder
    is the bulk of a big write's time (~0.7 ms of a 1 MiB write's worker job on
    this project's machine, half that on two threads). ``run_pair`` must raise
    the first error of its tasks once both stopped; an :class:`Undecodable`
    piece may then stop the iterator before the piece beside it is yielded.
    """
    pad = _padding(data, start, end)
    if pad is None or piece <= 0 or piece % 4:
        return None
    decode = _decode_block
    assert decode is not None
    n = end - start

    def into(dst: int, src: int, at: int, take: int) -> None:
        if decode(dst, src + at, take) != take // 4 * 3:
            where = at - start
            raise Undecodable(f"not plain base64 in characters {where}-{where + take}")

    def pieces(run_pair: RunPair | None = None) -> Iterator[memoryview]:
        lanes = 2 if run_pair is not None and n >= PAIR_MIN else 1
        step = min(piece, -(-n // 8) * 4) if lanes == 2 else piece  # <= half, whole groups
        src, keep = _address(data)
        buffers = [bytearray(min(step, n) // 4 * 3) for _ in range(lanes)]
        dsts = [ctypes.addressof((ctypes.c_char * len(b)).from_buffer(b)) if b else 0
                for b in buffers]
        views = [memoryview(b) for b in buffers]
        at = start
        while at < end:
            batch: list[tuple[int, int, int]] = []  # (lane, first character, characters)
            for lane in range(lanes):
                if at < end:
                    take = min(step, end - at)
                    batch.append((lane, at, take))
                    at += take
            if run_pair is not None and len(batch) == 2:
                run_pair([functools.partial(into, dsts[lane], src, first, take)
                          for lane, first, take in batch])
            else:
                for lane, first, take in batch:
                    into(dsts[lane], src, first, take)
            for lane, first, take in batch:
                size = take // 4 * 3
                yield views[lane][: size - pad] if first + take == end else views[lane][:size]
        del keep

    return pieces


def decode_strict(data: bytes | bytearray, start: int, end: int) -> memoryview | None:
    """Decode ``data[start:end]`` (padded standard base64), or None if it is not
    exactly that (or libcrypto is missing): the caller then decodes the slow way."""
    pad = _padding(data, start, end)
    if pad is None:
        return None
    decode = _decode_block
    assert decode is not None  # else no padding was found
    n = end - start
    out = bytearray(n // 4 * 3)
    if not n:
        return memoryview(out)
    src, keep = _address(data)
    dst = ctypes.addressof((ctypes.c_char * len(out)).from_buffer(out))
    done = 0
    while done < n:
        take = min(_CHUNK, n - done)
        # A shorter result means EVP trimmed whitespace at an end; -1 a bad character.
        if decode(dst + done // 4 * 3, src + start + done, take) != take // 4 * 3:
            return None
        done += take
    del keep
    return memoryview(out)[: len(out) - pad]


def encoder_available() -> bool:
    return _encode_block is not None


def encoded_length(size: int) -> int:
    """Length of the padded base64 of ``size`` bytes."""
    return (size + 2) // 3 * 4


def encode_into(data: bytes, out: bytearray, offset: int) -> None:
    """Write the padded base64 of ``data`` into ``out`` at ``offset``, without the GIL.

    Why: msgspec encodes a 32 MiB file's base64 in ~40 ms holding the GIL, and
    the event loop waited that long to answer anyone else; a foreign call
    releases it. ``out`` needs room for :func:`encoded_length` bytes and one
    more (``EVP_EncodeBlock`` ends with a NUL, which the caller overwrites or drops).

    Raises:
        RuntimeError: libcrypto is missing (check :func:`encoder_available`).
        ValueError: ``out`` is too short.
    """
    if _encode_block is None:
        raise RuntimeError("EVP_EncodeBlock is not available")
    size = len(data)
    if offset < 0 or offset + encoded_length(size) + 1 > len(out):
        raise ValueError("base64 output buffer too short")
    if not size:
        out[offset] = 0
        return
    src = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value
    dst = ctypes.addressof((ctypes.c_char * (len(out) - offset)).from_buffer(out, offset))
    assert src is not None
    done = 0
    while done < size:
        take = min(_ENCODE_CHUNK, size - done)
        _encode_block(dst + done // 3 * 4, src + done, take)
        done += take


#: Bytes :func:`encode_tail_in_place` encodes at a time (768 KiB: 1 MiB of text).
ENCODE_PIECE: Final = 3 << 18


def encode_tail_in_place(out: bytearray, offset: int, size: int, piece: int = ENCODE_PIECE) -> None:
    """Replace the ``size`` bytes that end ``out[offset : offset + encoded_length(size)]``
    with their padded base64, which starts at ``offset``, without the GIL.

    Why: a reader can then read a file straight into the reply that will carry
    its text and hold that one buffer, not the file and its text (a 64 MiB
    read: 64 + 85 MiB before). The text grows from the front while the bytes
    wait at the back; each ``piece`` of bytes is copied out to a scratch buffer
    before its text is written, and the text written never reaches bytes not yet
    copied (the text ends, at most, where the next piece begins: it is a third
    of the bytes behind). ``out`` needs one byte after the text, as for
    :func:`encode_into`.

    Raises:
        RuntimeError: libcrypto is missing (check :func:`encoder_available`).
        ValueError: ``out`` is too short, or ``piece`` is not a positive multiple of 3.
    """
    encode = _encode_block
    if encode is None:
        raise RuntimeError("EVP_EncodeBlock is not available")
    length = encoded_length(size)
    if offset < 0 or offset + length + 1 > len(out):
        raise ValueError("base64 output buffer too short")
    if piece <= 0 or piece % 3:
        raise ValueError("piece must be a positive multiple of 3")
    if not size:
        out[offset] = 0
        return
    keep = (ctypes.c_char * len(out)).from_buffer(out)
    base = ctypes.addressof(keep)
    scratch = ctypes.create_string_buffer(min(piece, size))
    tail = offset + length - size  # where the bytes start
    done = 0
    while done < size:
        take = min(piece, size - done)
        ctypes.memmove(scratch, base + tail + done, take)
        encode(base + offset + done // 3 * 4, ctypes.addressof(scratch), take)
        done += take
    del keep
