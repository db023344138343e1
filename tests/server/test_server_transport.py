"""Line framing (transport/stdio.py) and the in-memory pair (transport/memory.py), fed by hand."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from exec_server.transport.base import OversizedMessage
from exec_server.transport.memory import memory_pair
from exec_server.transport.stdio import StreamTransport


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


# -- big lines: handed over on receipt, fed in pieces on send ---------------------


async def test_a_long_line_is_handed_over_and_what_follows_it_kept() -> None:
    """A line that is most of the buffer comes back in that buffer (no copy of it);
    the short line after it, read in the same chunk, still comes next."""
    big = b'{"x":"' + b"y" * (256 << 10) + b'"}'
    t = _transport([big + b"\n" + b'{"next":1}\n', b" \n" + b'{"last":2}'])
    first, second, third = await _all(t)
    assert isinstance(first, bytearray) and first == big
    assert second == b'{"next":1}' and isinstance(second, bytes)
    assert third == b'{"last":2}'


async def test_a_long_line_behind_more_than_itself_is_copied_out() -> None:
    """When more follows a long line than the line itself, the line is copied out
    (the cheaper of the two); the order and content are the same."""
    line = b"a" * (80 << 10)
    rest = b"b" * (100 << 10)
    t = _transport([line + b"\n" + rest + b"\n"])
    assert await _all(t) == [line, rest]


@settings(max_examples=60, deadline=None)
@given(
    lines=st.lists(
        st.one_of(
            st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")),
            st.integers(64 << 10, 200 << 10).map(lambda n: b"{" + b"x" * n + b"}"),
        ),
        min_size=1,
        max_size=6,
    ),
    cuts=st.lists(st.integers(1, 300 << 10), max_size=8),
)
def test_lines_of_any_size_and_chunking_come_back_whole_and_in_order(
    lines: list[bytes], cuts: list[int]
) -> None:
    """Short and long lines (the long ones handed over in their buffer) in any
    chunking: the non-blank ones come back byte for byte, in order."""
    stream = b"".join(line + b"\n" for line in lines)
    chunks, start = [], 0
    for cut in sorted(set(cuts)):
        if start < cut < len(stream):
            chunks.append(stream[start:cut])
            start = cut
    chunks.append(stream[start:])

    async def read_all() -> list[object]:
        return await _all(_transport(chunks, limit=1 << 20))

    got = asyncio.run(read_all())
    assert got == [line for line in lines if line and not line.isspace()]


async def _pipe_pair() -> tuple[StreamTransport, asyncio.StreamReader, list[object]]:
    """A transport writing into a real pipe (as stdio's), and a reader of its other end."""
    import os

    loop = asyncio.get_running_loop()
    rfd, wfd = os.pipe()
    reader = asyncio.StreamReader(limit=1 << 30)
    r_transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(rfd, "rb", buffering=0)
    )
    w_transport, w_protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(wfd, "wb", buffering=0)
    )
    writer = asyncio.StreamWriter(w_transport, w_protocol, None, loop)
    transport = StreamTransport(
        asyncio.StreamReader(), writer, label="pipe", max_message_size=1 << 30
    )
    return transport, reader, [r_transport, w_transport]


async def _read_lines(reader: asyncio.StreamReader, n: int) -> list[bytes]:
    return [(await reader.readline()).rstrip(b"\n") for _ in range(n)]


async def test_a_big_line_is_fed_whole_and_lines_sent_meanwhile_follow_it() -> None:
    transport, reader, ends = await _pipe_pair()
    try:
        big = bytes(range(11, 256)) * ((9 << 20) // 245)  # ~9 MiB, no newline: fed in pieces
        async with asyncio.timeout(30):
            sending = asyncio.ensure_future(transport.send(big))
            await asyncio.sleep(0)  # the feed has started and waits for the pipe
            assert transport._feeding is not None
            small = [asyncio.ensure_future(transport.send(b'{"n":%d}' % i)) for i in range(3)]
            lines = await _read_lines(reader, 4)
            await asyncio.gather(sending, *small)
        assert lines[0] == big
        assert lines[1:] == [b'{"n":0}', b'{"n":1}', b'{"n":2}']
        assert transport._feeding is None
    finally:
        for end in ends:
            end.close()  # type: ignore[attr-defined]


async def test_a_cancelled_sender_does_not_cut_its_line() -> None:
    """The feed runs in its own task: a sender cancelled halfway (its request
    cancelled, say) leaves a whole line on the stream, then the next one."""
    transport, reader, ends = await _pipe_pair()
    try:
        big = b"q" * (6 << 20)
        async with asyncio.timeout(30):
            sending = asyncio.ensure_future(transport.send(big))
            # Until the first piece filled the pipe (nobody reads it yet): mid-line.
            while not transport.writer.transport.get_write_buffer_size():  # noqa: ASYNC110 - a transport, no event
                await asyncio.sleep(0)
            sending.cancel()
            after = asyncio.ensure_future(transport.send(b"after"))
            lines = await _read_lines(reader, 2)
            await after
        assert sending.cancelled()
        assert lines == [big, b"after"]
    finally:
        for end in ends:
            end.close()  # type: ignore[attr-defined]
