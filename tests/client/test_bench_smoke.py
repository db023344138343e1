"""The benchmark scripts run end to end (tiny counts, mostly our server only)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
RECORDINGS = BENCHMARKS.parent / "tests" / "compat" / "codex-0.163-recordings"


async def _run(script: str, json_path: Path, *args: str) -> tuple[bytes, Any]:
    """Run ``benchmarks/<script>`` with ``args`` and ``--json``; its stdout and figures."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(BENCHMARKS / script), *args, "--json", str(json_path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()
    return out, json.loads(await asyncio.to_thread(json_path.read_text))


async def test_bench_exec_quick_against_our_server(tmp_path: Path) -> None:
    out, figures = await _run(
        "bench_exec.py", tmp_path / "bench.json",
        "--quick", "--servers", "ours", "--modes", "quickack",
    )
    assert b"true start->closed [quickack]" in out
    throughput = figures["1 MiB stdout via notif [quickack]"]
    assert throughput["ours"]["median"] > 0
    assert figures["RSS idle"]["ours"] > 0


async def test_bench_server_time_quick_with_an_alternate_build(tmp_path: Path) -> None:
    src = BENCHMARKS.parent / "src"
    out, figures = await _run(
        "bench_server_time.py", tmp_path / "server_time.json",
        "--quick", "--no-upstream", "--alt", str(src), "--dir", str(tmp_path),
    )
    assert b"copy 1 MiB file: server time" in out
    for metric in ("getMetadata", "readFile 1 KiB", "writeFile 1 KiB", "copy 1 MiB file"):
        for server_name in ("ours", "alt1"):
            server = figures[f"{metric}: server time"][server_name]["median"]
            trip = figures[f"{metric}: round trip"][server_name]["median"]
            assert 0 < server <= trip  # the reply arrived before the client had parsed it
    assert os.listdir(tmp_path) == ["server_time.json"]  # its work directory is gone


async def test_bench_fs_copy_quick_with_an_alternate_build(tmp_path: Path) -> None:
    src = BENCHMARKS.parent / "src"
    out, figures = await _run(
        "bench_fs_copy.py", tmp_path / "copy.json",
        "--quick", "--no-upstream", "--size", "4096", "--alt", str(src), "--dir", str(tmp_path),
    )
    assert b"copy 4096 B file" in out
    row = figures["copy 4096 B file"]
    assert row["ours"]["median"] > 0 and row["alt1"]["median"] > 0
    assert row["ours"]["n"] == row["alt1"]["n"] == 4
    assert os.listdir(tmp_path) == ["copy.json"]  # its work directory is gone


async def test_bench_http_quick_against_our_server(tmp_path: Path) -> None:
    out, figures = await _run("bench_http.py", tmp_path / "http.json", "--quick", "--no-upstream")
    assert b"http/request streamed body 1 MiB" in out
    assert figures["http/request streamed body 1 MiB"]["ours"]["median"] > 0
    assert figures["server CPU per streamed MiB"]["ours"]["median"] >= 0


async def test_bench_replay_quick_completes_every_recording(tmp_path: Path) -> None:
    out, figures = await _run("bench_replay.py", tmp_path / "replay.json", "--quick")
    assert b"total (all sessions)" in out
    assert figures["failed"] == {}
    recorded = sorted(p.name.removesuffix(".rpc.jsonl") for p in RECORDINGS.glob("*.rpc.jsonl"))
    assert recorded and sorted(figures["sessions"]["ours"]) == recorded
    for server, sessions in figures["sessions"].items():  # ours, and upstream when installed
        for name, outcome in sessions.items():
            assert outcome == {"completed": 1, "differences": []}, (server, name)
    assert figures["rows"]["total (all sessions)"]["ours"]["n"] == 1


async def test_fuzz_frames_against_our_server_alone(tmp_path: Path) -> None:
    out, figures = await _run(
        "fuzz_frames.py", tmp_path / "fuzz.json", "--no-upstream", "--random", "20"
    )
    assert b"OURS-SILENT" not in out
    cases = figures["cases"]
    assert len(cases) > 400 and {c["verdict"] for c in cases.values()} == {"alone"}

    def ours(name: str) -> tuple[list[str], str]:
        return cases[name]["ours"]["replies"], cases[name]["ours"]["end"]

    assert ours("frame/binary") == (["1:ok"], "open")
    assert ours("frame/fragmented-ping-between") == (["pong 7", "1:ok"], "open")
    assert ours("json/batch-one") == (["-1:-32600"], "open")
    assert ours("frame/rsv-1") == ([], "close 1002 'reserved bits must be 0'")
    assert ours("json/response-from-client") == (
        [], "close 1008 'unexpected response from client'")
    assert ours("size/message-70MiB-in-1MiB-fragments") == (["1:ok"], "open")


async def test_bench_exec_quick_beside_an_alternate_build(tmp_path: Path) -> None:
    src = BENCHMARKS.parent / "src"
    out, figures = await _run(
        "bench_exec.py", tmp_path / "bench.json",
        "--quick", "--servers", "ours", "--modes", "quickack", "--metrics", "true",
        "--alt", str(src),
    )
    assert b"ours/alt1" in out
    assert "pty write->echo [quickack]" not in figures  # rows not measured are not shown
    row = figures["true start->closed [quickack]"]
    assert row["ours"]["n"] == row["alt1"]["n"] == 3
    assert row["ratio_alt1"] == row["ours"]["median"] / row["alt1"]["median"]
    assert row["target"] == 0.5


async def test_bench_fs_only_the_budget_rows(tmp_path: Path) -> None:
    _, figures = await _run(
        "bench_fs.py", tmp_path / "fs.json",
        "--quick", "--no-upstream", "--only", "1 KiB,getMetadata", "--dir", str(tmp_path),
    )
    assert sorted(figures) == ["getMetadata", "readFile 1 KiB", "writeFile 1 KiB"]
    assert {row["target"] for row in figures.values()} == {1.5}
    assert os.listdir(tmp_path) == ["fs.json"]  # its work directory is gone


def test_a_target_is_met_when_the_interval_reaches_it() -> None:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from harness import target_met
    finally:
        sys.path.remove(str(BENCHMARKS))
    assert target_met(0.55, (0.48, 0.62), 0.5, higher_is_better=False)
    assert not target_met(0.55, (0.51, 0.62), 0.5, higher_is_better=False)
    assert target_met(0.75, (0.6, 0.85), 0.8, higher_is_better=True)
    assert not target_met(0.75, (0.6, 0.79), 0.8, higher_is_better=True)
    assert target_met(0.5, None, 0.5, higher_is_better=False)  # no interval: the median decides
    assert not target_met(0.51, None, 0.5, higher_is_better=False)


_HOLD_A_SERVER = """
import asyncio, sys
sys.path.insert(0, sys.argv[1])
import harness

async def main() -> None:
    async with harness.start_server(harness.ours_target()) as server:
        print(server.pid, flush=True)
        await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_a_terminated_benchmark_stops_its_servers() -> None:
    """Servers run in sessions of their own: a SIGTERM to the benchmark (``timeout``)
    must still stop them, not leave them running for good."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _HOLD_A_SERVER, str(BENCHMARKS),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )
    loop = asyncio.get_running_loop()
    exited = asyncio.Event()
    pidfd = -1
    try:
        assert proc.stdout is not None
        server_pid = int(await asyncio.wait_for(proc.stdout.readline(), 60))
        pidfd = os.pidfd_open(server_pid)  # readable once the server has exited
        loop.add_reader(pidfd, exited.set)
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)
        await asyncio.wait_for(exited.wait(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        if pidfd >= 0:
            loop.remove_reader(pidfd)
            if not exited.is_set():
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            os.close(pidfd)
