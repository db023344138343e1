"""Big files cost the server a bounded number of copies, not more (issue 3: memory
proportional to one file). Measured on a fresh server process: its peak resident
memory (``VmHWM``) over its resident memory before the request."""

from __future__ import annotations

import asyncio
import base64
import os
import weakref
from pathlib import Path
from typing import Any

from exec_server.fs.workers import WorkerPool

MIB = 1 << 20


def _status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


async def test_a_big_read_holds_at_most_four_copies(server: Any, rpc: Any, tmp_path: Path) -> None:
    """A 32 MiB file goes out as ~43 MiB of base64: the file, its base64 body and
    the reply frame are ~3.2 copies of the file at peak; before the eighth
    session a finished worker future kept the body alive while the reply was
    built and sent, and the transport copied the unsent rest twice (~5.2)."""
    data = os.urandom(32 * MIB)
    (tmp_path / "big.bin").write_bytes(data)
    client = await rpc(server.url)
    await client.initialize()
    before = _status_kib(server.pid, "VmRSS")
    result = await client.call(
        "fs/readFile", {"path": f"file://{tmp_path}/big.bin", "sandbox": None}, timeout=120
    )
    assert base64.b64decode(result["dataBase64"]) == data
    grown_mib = (_status_kib(server.pid, "VmHWM") - before) / 1024
    assert grown_mib <= 4 * 32, f"peak grew {grown_mib:.0f} MiB for a 32 MiB file"


class _Result:
    """A stand-in for a big job result (weak-referenceable, unlike ``bytes``)."""


async def test_pool_does_not_keep_a_result_the_caller_took() -> None:
    """The finished future outlives ``run`` until the task next yields; the result
    must not, or every big reply is built and sent beside a second copy."""
    pool = WorkerPool(max_workers=1)
    async with asyncio.timeout(30):  # no wrapping task (that would hold the result)
        value = await pool.run(_Result)
    ref = weakref.ref(value)
    del value
    assert ref() is None  # gone at once, before this task yields to the loop
