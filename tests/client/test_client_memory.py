"""What a big message costs the client: a write is sent in fragments (not masked and
buffered whole), a read is the text received twice (websockets' reader buffer,
then the message) plus the file."""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

import pytest

from exec_server.client import ExecServerClient
from exec_server.client._transport import SEND_FRAGMENT
from exec_server.client.fs import RemoteFileSystem

MIB = 1 << 20


def _kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(field)


def _reset_peak() -> None:
    """Start ``VmHWM`` again from the current resident size (``clear_refs`` 5)."""
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="Linux /proc only")
async def test_a_big_write_costs_the_client_its_text_once(server: Any, tmp_path: Path) -> None:
    """32 MiB is 43 MiB of JSON text, sent in 1 MiB fragments, each masked and
    written as the socket drains: ~1.4 copies of the file. Sent whole, the
    client peaked 159 MiB over its start (~5 copies)."""
    data = os.urandom(32 * MIB)
    target = tmp_path / "big.bin"
    async with await ExecServerClient.connect(server.url) as client:
        fs = RemoteFileSystem(client)
        await fs.write_file(tmp_path / "warm", b"x" * (2 * SEND_FRAGMENT))  # fragments once
        gc.collect()
        _reset_peak()
        before = _kib("VmRSS")
        await fs.write_file(target, data)
        grown_mib = (_kib("VmHWM") - before) / 1024
    assert target.read_bytes() == data
    assert grown_mib <= 1.75 * 32, f"client peak grew {grown_mib:.0f} MiB for a 32 MiB write"


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="Linux /proc only")
async def test_a_big_read_costs_the_client_its_text_and_the_file(
    server: Any, tmp_path: Path
) -> None:
    """A 32 MiB read's reply is 43 MiB of JSON text in one frame: websockets' reader
    gathers it in its buffer and copies it out as the message, which is decoded
    into the file. After a first read (whose freed memory the second one
    reuses) the client grew ~83 MiB (~2.6 copies of the file); the bound is 3."""
    data = os.urandom(32 * MIB)
    target = tmp_path / "big.bin"
    target.write_bytes(data)
    async with await ExecServerClient.connect(server.url) as client:
        fs = RemoteFileSystem(client)
        await fs.read_file(tmp_path / "big.bin")  # the first big message's allocations
        gc.collect()
        _reset_peak()
        before = _kib("VmRSS")
        got = await fs.read_file(target)
        grown_mib = (_kib("VmHWM") - before) / 1024
    assert got == data
    assert grown_mib <= 3 * 32, f"client peak grew {grown_mib:.0f} MiB for a 32 MiB read"
