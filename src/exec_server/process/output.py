"""Sequence-numbered, bounded output buffer of one process (pure; PROTOCOL.md §8.2, §8.4):
one counter numbers chunks, exit and close from 1; past the cap the oldest chunks go.
Lossless mode (our extension) drops only *delivered* chunks, else reports :attr:`full`."""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import KW_ONLY, dataclass, field
from operator import attrgetter

from exec_server.protocol.types.process import OutputChunk, ProcessStream

__all__ = ["RETAINED_OUTPUT_CAP", "OutputBuffer"]

#: Retained output per process (PROTOCOL.md §14).
RETAINED_OUTPUT_CAP = 1024 * 1024
_seq_of = attrgetter("seq")


@dataclass(slots=True, eq=False)
class OutputBuffer:
    """Events of one process: output chunks, exit code, close flag."""

    cap: int = RETAINED_OUTPUT_CAP
    _: KW_ONLY
    lossless: bool = False
    next_seq: int = field(default=1, init=False)
    exit_code: int | None = field(default=None, init=False)
    closed: bool = field(default=False, init=False)
    retained: int = field(default=0, init=False)
    #: Highest seq known to have reached the client (lossless bookkeeping).
    delivered_seq: int = field(default=0, init=False)
    _chunks: deque[OutputChunk] = field(default_factory=deque, init=False, repr=False)

    def append(self, stream: ProcessStream, data: bytes) -> OutputChunk:
        chunk = OutputChunk(seq=self.next_seq, stream=stream, chunk=data)
        self.next_seq += 1
        self._chunks.append(chunk)
        self.retained += len(data)
        self._trim()
        return chunk

    def record_exit(self, code: int) -> int:
        self.exit_code = code
        self.next_seq += 1
        return self.next_seq - 1

    def record_close(self) -> int:
        self.closed = True
        self.next_seq += 1
        return self.next_seq - 1

    def mark_delivered(self, seq: int) -> None:
        """Everything up to ``seq`` reached the client; lossless mode may now drop it."""
        if seq > self.delivered_seq:
            self.delivered_seq = seq
            if self.lossless:
                self._trim()

    def mark_notified(self, seq: int) -> None:
        """A notification carried chunk ``seq``: that acknowledges earlier chunks only if each
        reached the client too (after a resume, unsent ones wait for a read's ``afterSeq``)."""
        if seq <= self.delivered_seq:
            return
        chunks = self._chunks
        first = bisect.bisect_right(chunks, self.delivered_seq, key=_seq_of)
        if first < len(chunks) and chunks[first].seq < seq:
            return  # an earlier chunk is still undelivered
        self.mark_delivered(seq)

    @property
    def full(self) -> bool:
        """Lossless mode: undelivered output fills the cap, stop reading the child (a
        delivered oldest chunk goes with the next append: at most cap + one chunk)."""
        if not self.lossless or self.retained < self.cap:
            return False
        chunks = self._chunks
        return bool(chunks) and chunks[0].seq > self.delivered_seq

    def _trim(self) -> None:
        chunks = self._chunks
        limit = self.delivered_seq if self.lossless else self.next_seq
        while self.retained > self.cap and chunks and chunks[0].seq <= limit:
            self.retained -= len(chunks.popleft().chunk)

    def snapshot(self, after_seq: int, max_bytes: int | None) -> tuple[list[OutputChunk], int]:
        """Chunks after ``after_seq`` within ``max_bytes`` (at least one, if any), and the
        ``nextSeq`` hint."""
        chunks = self._chunks
        budget = math.inf if max_bytes is None else max_bytes
        taken: list[OutputChunk] = []
        total = 0
        for i in range(bisect.bisect_right(chunks, after_seq, key=_seq_of), len(chunks)):
            size = len(chunks[i].chunk)
            if taken and total + size > budget:
                break
            taken.append(chunks[i])
            total += size
            if total >= budget:
                break
        next_seq = taken[-1].seq + 1 if taken else self.next_seq
        return taken, next_seq

    def ready(self, after_seq: int, taken: list[OutputChunk]) -> bool:
        """Whether a read with this snapshot returns now (§8.4 step 3, minus the deadline)."""
        if taken or self.closed:
            return True
        return self.exit_code is not None and after_seq < self.next_seq - 1
