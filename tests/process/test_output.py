"""OutputBuffer: seq numbering, retention cap, read snapshot and nextSeq (PROTOCOL.md §8.2/§8.4)."""

from __future__ import annotations

from exec_server.process.output import RETAINED_OUTPUT_CAP, OutputBuffer
from exec_server.protocol.types.process import ProcessStream

OUT = ProcessStream.STDOUT
ERR = ProcessStream.STDERR


def seqs(chunks: list) -> list[int]:  # type: ignore[type-arg]
    return [c.seq for c in chunks]


def test_one_counter_for_output_exit_and_close() -> None:
    buf = OutputBuffer()
    assert buf.append(OUT, b"a").seq == 1
    assert buf.append(ERR, b"b").seq == 2
    assert buf.record_exit(0) == 3
    assert buf.append(OUT, b"late").seq == 4  # output may follow the exit event
    assert buf.record_close() == 5
    assert buf.next_seq == 6
    assert buf.exit_code == 0 and buf.closed


def test_default_cap_is_one_mib() -> None:
    assert RETAINED_OUTPUT_CAP == 1_048_576
    assert OutputBuffer().cap == RETAINED_OUTPUT_CAP


def test_cap_drops_oldest_until_within_cap() -> None:
    buf = OutputBuffer(cap=10)
    buf.append(OUT, b"1234")
    buf.append(OUT, b"5678")
    assert buf.retained == 8
    buf.append(OUT, b"90")  # exactly the cap: nothing dropped
    assert buf.retained == 10 and len(buf._chunks) == 3
    buf.append(OUT, b"x")  # 11 > 10: drop the oldest (4 bytes)
    assert buf.retained == 7
    chunks, _ = buf.snapshot(0, None)
    assert seqs(chunks) == [2, 3, 4]


def test_chunk_larger_than_cap_drops_everything_itself_included() -> None:
    buf = OutputBuffer(cap=10)
    buf.append(OUT, b"abc")
    buf.append(OUT, b"x" * 11)
    assert buf.retained == 0 and len(buf._chunks) == 0
    chunks, next_seq = buf.snapshot(0, None)
    assert chunks == [] and next_seq == 3


def test_snapshot_spec_example() -> None:
    # §8.4 example: chunks 1-2 printed, exit at seq 3, close at seq 4.
    buf = OutputBuffer()
    buf.append(OUT, b"first\n")
    buf.append(OUT, b"second\n")
    buf.record_exit(0)
    buf.record_close()
    chunks, next_seq = buf.snapshot(0, None)
    assert seqs(chunks) == [1, 2] and next_seq == 3
    assert buf.ready(0, chunks)
    chunks, next_seq = buf.snapshot(2, None)
    assert chunks == [] and next_seq == 5
    assert buf.ready(2, chunks)  # closed


def test_max_bytes_budget() -> None:
    buf = OutputBuffer()
    for data in (b"aaaa", b"bbbb", b"cccc"):
        buf.append(OUT, data)
    # maxBytes 0: exactly one chunk.
    chunks, next_seq = buf.snapshot(0, 0)
    assert seqs(chunks) == [1] and next_seq == 2
    # A single chunk larger than the budget is still returned.
    chunks, _ = buf.snapshot(0, 2)
    assert seqs(chunks) == [1]
    # Stop before exceeding the budget...
    chunks, next_seq = buf.snapshot(0, 7)
    assert seqs(chunks) == [1] and next_seq == 2
    # ...and stop once it is reached.
    chunks, next_seq = buf.snapshot(0, 8)
    assert seqs(chunks) == [1, 2] and next_seq == 3
    chunks, _ = buf.snapshot(1, None)
    assert seqs(chunks) == [2, 3]


def test_next_seq_counts_events_when_no_chunk_returned() -> None:
    buf = OutputBuffer()
    buf.append(OUT, b"x")
    chunks, next_seq = buf.snapshot(1, None)
    assert chunks == [] and next_seq == 2
    assert not buf.ready(1, chunks)
    buf.record_exit(3)
    chunks, next_seq = buf.snapshot(1, None)
    assert chunks == [] and next_seq == 3
    # exited and the caller has not seen the exit event (afterSeq < nextSeq - 1)
    assert buf.ready(1, chunks)
    assert not buf.ready(2, chunks)


def test_snapshot_after_dropped_chunks_starts_at_oldest_retained() -> None:
    buf = OutputBuffer(cap=4)
    for data in (b"aa", b"bb", b"cc"):
        buf.append(OUT, data)
    chunks, next_seq = buf.snapshot(0, None)
    assert seqs(chunks) == [2, 3] and next_seq == 4  # no gap indicator


def test_lossless_never_drops_undelivered_output() -> None:
    buf = OutputBuffer(cap=4, lossless=True)
    buf.append(OUT, b"aa")
    assert not buf.full
    buf.append(OUT, b"bb")
    assert buf.full
    buf.append(OUT, b"cc")  # over the cap, but nothing was delivered: kept
    assert buf.retained == 6 and buf.full
    assert seqs(buf.snapshot(0, None)[0]) == [1, 2, 3]
    buf.mark_delivered(1)
    assert buf.retained == 4 and buf.full
    assert seqs(buf.snapshot(0, None)[0]) == [2, 3]
    buf.mark_delivered(3)  # delivered chunks are retained up to the cap...
    assert buf.retained == 4
    assert not buf.full  # ...but no longer block reading
    buf.append(OUT, b"d")
    assert buf.retained == 3 and not buf.full


def test_lossless_notification_past_an_undelivered_chunk_acknowledges_nothing() -> None:
    """After a resume, notifications go on past chunks the dead connection never got."""
    buf = OutputBuffer(cap=4, lossless=True)
    buf.append(OUT, b"aa")
    buf.mark_notified(1)
    buf.append(OUT, b"bb")  # its notification failed: the connection died
    buf.append(OUT, b"cc")
    buf.mark_notified(3)  # the resumed connection got 3, not 2
    assert buf.delivered_seq == 1
    assert seqs(buf.snapshot(0, None)[0]) == [2, 3]  # 1 dropped, 2 kept
    assert buf.full
    buf.mark_delivered(3)  # a read with afterSeq 3: the client has 2 and 3
    buf.append(OUT, b"dd")
    buf.mark_notified(4)  # contiguous again
    assert buf.delivered_seq == 4
    assert seqs(buf.snapshot(0, None)[0]) == [3, 4]


def test_lossy_mode_ignores_delivery() -> None:
    buf = OutputBuffer(cap=4)
    buf.append(OUT, b"aaaa")
    buf.mark_delivered(1)
    assert buf.retained == 4 and not buf.full
