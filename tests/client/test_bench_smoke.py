"""The benchmark script runs end to end (tiny counts, our server only)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_exec.py"


async def test_bench_exec_quick_against_our_server(tmp_path: Path) -> None:
    out_json = tmp_path / "bench.json"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(SCRIPT), "--quick", "--servers", "ours", "--modes", "quickack",
        "--json", str(out_json),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()
    assert b"true start->closed [quickack]" in out
    figures = json.loads(out_json.read_text())
    throughput = figures["1 MiB stdout via notif [quickack]"]
    assert throughput["ours"]["median"] > 0
    assert figures["RSS idle"]["ours"] > 0


SERVER_TIME = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_server_time.py"


async def test_bench_server_time_quick_against_our_server(tmp_path: Path) -> None:
    out_json = tmp_path / "server_time.json"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(SERVER_TIME), "--quick", "--no-upstream", "--dir", str(tmp_path),
        "--json", str(out_json),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()
    assert b"copy 1 MiB file: server time" in out
    figures = json.loads(out_json.read_text())
    for metric in ("getMetadata", "readFile 1 KiB", "writeFile 1 KiB", "copy 1 MiB file"):
        server = figures[f"{metric}: server time"]["ours"]["median"]
        trip = figures[f"{metric}: round trip"]["ours"]["median"]
        assert 0 < server <= trip  # the reply arrived before the client had parsed it
    assert os.listdir(tmp_path) == ["server_time.json"]  # its work directory is gone
