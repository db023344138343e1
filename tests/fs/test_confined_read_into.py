"""A big confined read is received straight into its reply
(``FileSystemService.read_file_mapped``'s ``receive_large``), and every other
case keeps the bytes path: small contents, a helper that ignores the buffer
(the one-shot helper), a caller that offers none."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from exec_server.fs import ops
from exec_server.fs.service import FileSystemService, FsRoute

WAIT = 30.0
CONFINED = FsRoute(confined=True, context="ctx")


class _Confined:
    """Just what ``read_file_mapped`` uses of a confined service; ``honours`` says
    whether it receives into the buffer offered (the zygote does, the one-shot
    helper does not)."""

    def __init__(self, data: bytes, honours: bool = True) -> None:
        self.data = data
        self.honours = honours
        self.calls: list[str] = []

    def reads_directly(self, context: object) -> bool:
        return False

    async def read_file(self, context: object, path: str) -> bytes:
        self.calls.append("read_file")
        return self.data

    async def read_file_into(
        self, context: object, path: str, into: ops.ReceiveInto
    ) -> bytes | None:
        self.calls.append("read_file_into")
        view = into(len(self.data)) if self.honours else None
        if view is None:
            return self.data
        view[:] = self.data
        return None


def _service(confined: _Confined) -> FileSystemService:
    return FileSystemService(confined)  # type: ignore[arg-type]


def _receiver(seen: list[Any]) -> Any:
    def receive_large(size: int) -> tuple[memoryview, Any]:
        buffer = bytearray(size)

        def finish() -> tuple[str, bytes, int]:
            return ("received", bytes(buffer), threading.get_ident())

        seen.append(size)
        return memoryview(buffer), finish

    return receive_large


async def test_big_contents_are_received_into_the_given_buffer_and_finished_in_a_worker() -> None:
    confined = _Confined(b"x" * 100)
    seen: list[Any] = []
    result = await asyncio.wait_for(
        _service(confined).read_file_mapped(
            "/f", lambda b: ("mapped", b), 10, CONFINED, receive_large=_receiver(seen)
        ),
        WAIT,
    )
    assert seen == [100] and confined.calls == ["read_file_into"]
    assert isinstance(result, tuple) and result[:2] == ("received", b"x" * 100)
    assert result[2] != threading.get_ident()  # encoded in a worker, not on the loop


@pytest.mark.parametrize(
    ("data", "honours", "expected"),
    [
        (b"small", True, b"small"),  # not over large_over: plain bytes
        (b"y" * 100, False, ("mapped", b"y" * 100)),  # the helper kept its bytes: mapped
    ],
    ids=["small", "helper-ignores-buffer"],
)
async def test_other_confined_reads_keep_the_bytes_path(
    data: bytes, honours: bool, expected: Any
) -> None:
    confined = _Confined(data, honours)
    seen: list[Any] = []
    result = await asyncio.wait_for(
        _service(confined).read_file_mapped(
            "/f", lambda b: ("mapped", b), 10, CONFINED, receive_large=_receiver(seen)
        ),
        WAIT,
    )
    assert result == expected
    assert seen == []  # no reply buffer was made
    assert confined.calls == ["read_file_into"]


async def test_without_receive_large_the_confined_read_returns_bytes() -> None:
    confined = _Confined(b"z" * 100)
    result = await asyncio.wait_for(
        _service(confined).read_file_mapped("/f", lambda b: ("mapped", b), 10, CONFINED), WAIT
    )
    assert result == ("mapped", b"z" * 100)
    assert confined.calls == ["read_file"]
