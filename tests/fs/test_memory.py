"""Big files cost the server a bounded number of copies, not more (issue 3: memory
proportional to one file). Measured on a fresh server process: its peak resident
memory (``VmHWM``) over its resident memory before the request."""

from __future__ import annotations

import asyncio
import base64
import json
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


async def test_a_big_read_holds_the_file_and_its_text_once(
    server: Any, rpc: Any, tmp_path: Path
) -> None:
    """A 32 MiB file goes out as ~43 MiB of base64: the file and the reply holding
    its text are ~2.35 copies of the file at peak. Before the ninth session the
    transport also copied the reply's unsent rest into its own buffer (~3.2
    copies); before the eighth, a finished worker future kept another (~5.2)."""
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
    assert grown_mib <= 2.75 * 32, f"peak grew {grown_mib:.0f} MiB for a 32 MiB file"


async def test_a_big_write_holds_its_text_once_and_lets_it_go(
    server: Any, rpc: Any, tmp_path: Path
) -> None:
    """A 32 MiB write in 1 MiB fragments (as big clients send it): the fragments
    grow one buffer, so the peak is the text plus the decoded file, ~2.35 copies
    (joined at the end, the text was held twice: ~2.7). And an idle connection
    does not keep the 43 MiB message until its next one."""
    data = os.urandom(32 * MIB)
    target = tmp_path / "big.bin"
    message = json.dumps({
        "id": 7,
        "method": "fs/writeFile",
        "params": {"path": target.as_uri(), "dataBase64": base64.b64encode(data).decode(),
                   "sandbox": None},
    })
    client = await rpc(server.url)
    await client.initialize()
    before = _status_kib(server.pid, "VmRSS")
    await client.ws.send(message[i : i + MIB] for i in range(0, len(message), MIB))
    reply = await client.response(7, timeout=120)
    assert reply.get("result") == {}, reply
    assert target.read_bytes() == data
    grown_mib = (_status_kib(server.pid, "VmHWM") - before) / 1024
    held_mib = (_status_kib(server.pid, "VmRSS") - before) / 1024
    assert grown_mib <= 2.55 * 32, f"peak grew {grown_mib:.0f} MiB for a 32 MiB file"
    assert held_mib <= 8, f"{held_mib:.0f} MiB still held after the write"


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
