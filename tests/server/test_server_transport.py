"""Line framing and the in-memory pair (rpc/transport.py), fed by hand."""

from __future__ import annotations

import asyncio

from exec_server.rpc.transport import OversizedMessage, StreamTransport, memory_pair


class _NullWriter:
    def is_closing(self) -> bool:
        return False


def _transport(chunks: list[bytes], limit: int = 1 << 20) -> StreamTransport:
    reader = asyncio.StreamReader()
    for chunk in chunks:
        reader.feed_data(chunk)
    reader.feed_eof()
    return StreamTransport(reader, _NullWriter(), label="t", max_message_size=limit)  # type: ignore[arg-type]


async def _all(t: StreamTransport) -> list[object]:
    out: list[object] = []
    while (item := await t.receive()) is not None:
        out.append(item)
    return out


async def test_lines_split_and_joined_across_chunks() -> None:
    t = _transport([b'{"a":1}\n{"b"', b':2}\n\n  \n{"c":3}\r\n', b'{"d":4}'])
    assert await _all(t) == [b'{"a":1}', b'{"b":2}', b'{"c":3}\r', b'{"d":4}']


async def test_oversized_line_is_reported_then_reading_continues() -> None:
    big = b'{"id":7,"x":"' + b"y" * 5000 + b'"}'
    t = _transport([big[:3000], big[3000:] + b"\n" + b'{"ok":1}\n'], limit=1000)
    first, second = await _all(t)
    assert isinstance(first, OversizedMessage)
    assert first.head.startswith(b'{"id":7') and first.size >= 5000 and first.limit == 1000
    assert second == b'{"ok":1}'


async def test_oversized_complete_line_in_one_chunk() -> None:
    t = _transport([b"x" * 50 + b"\n" + b"ok\n"], limit=10)
    first, second = await _all(t)
    assert isinstance(first, OversizedMessage) and first.size == 50
    assert second == b"ok"


async def test_long_line_in_many_small_chunks_is_linear() -> None:
    payload = b"z" * (8 << 20)
    chunks = [payload[i : i + 4096] for i in range(0, len(payload), 4096)] + [b"\n"]
    t = _transport(chunks, limit=16 << 20)
    (line,) = await _all(t)
    assert line == payload


async def test_memory_pair_round_trip_and_close() -> None:
    a, b = memory_pair()
    await a.send(b"one")
    assert await b.receive() == b"one"
    await a.aclose()
    assert await b.receive() is None
    assert await a.receive() is None
