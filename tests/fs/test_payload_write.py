"""``ops.write_file`` of data given piece by piece (``ops.Payload``): written as it
comes, and a payload that fails half way leaves the target as it was."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from exec_server.exceptions import InvalidRequestError
from exec_server.fs import direct as ops
from exec_server.fs import fdops


def _pieces(
    parts: list[bytes], fail_at: int | None = None, error: BaseException | None = None
) -> ops.Pieces:
    return ops.Pieces(sum(map(len, parts)), _Parts(parts, fail_at, error))


class _Parts:
    """The pieces of ``parts``; ``fail_at`` raises that error before that part."""

    def __init__(
        self, parts: list[bytes], fail_at: int | None = None, error: BaseException | None = None
    ) -> None:
        self.parts = parts
        self.fail_at = fail_at
        self.error = error or InvalidRequestError("bad piece")
        self.calls = 0

    def __call__(self) -> Iterator[memoryview]:
        self.calls += 1
        buffer = bytearray(max(map(len, self.parts), default=0))
        for i, part in enumerate(self.parts):
            if i == self.fail_at:
                raise self.error
            buffer[: len(part)] = part  # one buffer, reused, as the decoder does
            yield memoryview(buffer)[: len(part)]


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.parametrize("existing", [False, True])
def test_pieces_are_written_in_order(tdir: Path, existing: bool) -> None:
    target = tdir / "f"
    if existing:
        target.write_bytes(b"old contents")
    parts = [os.urandom(n) for n in (1000, 1, 0, 4096, 77)]
    parts_of = _Parts(parts)
    payload = ops.Pieces(sum(map(len, parts)), parts_of)
    ops.write_file(str(target), payload)
    assert target.read_bytes() == b"".join(parts)
    assert parts_of.calls == 1
    assert _names(tdir) == ["f"]


@pytest.mark.parametrize("existing", [False, True])
def test_a_payload_failing_half_way_leaves_the_target_as_it_was(tdir: Path, existing: bool) -> None:
    target = tdir / "f"
    if existing:
        target.write_bytes(b"old contents")
    payload = _pieces([b"a" * 5000, b"b" * 5000, b"c"], fail_at=2)
    with pytest.raises(InvalidRequestError, match="bad piece"):
        ops.write_file(str(target), payload)
    if existing:
        assert target.read_bytes() == b"old contents"
        assert _names(tdir) == ["f"]
    else:
        assert _names(tdir) == []  # no temp file left either


def test_in_place_fallback_gets_the_payload_whole_before_truncating(
    tdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where no temp file can be made (a directory that refuses new entries), the
    target is written in place: a payload that fails must fail before the target
    is truncated, and one that succeeds is written whole."""

    def refuse(dir_fd: int, tmp: str, unnamed: bool) -> tuple[int, bool]:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(fdops, "_create_new", refuse)
    target = tdir / "f"
    target.write_bytes(b"old contents")
    with pytest.raises(InvalidRequestError):
        ops.write_file(str(target), _pieces([b"a" * 100, b"b"], fail_at=1))
    assert target.read_bytes() == b"old contents"
    ops.write_file(str(target), _pieces([b"new ", b"contents"]))
    assert target.read_bytes() == b"new contents"


def test_payload_bytes_joins_the_pieces() -> None:
    assert ops.payload_bytes(b"plain") == b"plain"
    assert bytes(ops.payload_bytes(_pieces([b"ab", b"cd", b"e"]))) == b"abcde"
    with pytest.raises(InvalidRequestError):
        ops.payload_bytes(_pieces([b"ab", b"cd"], fail_at=1))
