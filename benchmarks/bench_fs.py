#!/usr/bin/env python3
"""Filesystem benchmarks: this project's exec-server side by side with upstream's.

Starts our server and, when installed (``pip install openai-codex-cli-bin``), the
upstream Rust ``codex exec-server``, one after the other, and measures ``fs/*``
round trips over the harness's raw WebSocket JSON-RPC client (TCP_QUICKACK
client, ``file://`` URIs, which both servers accept):

  write/read 1 KiB, 1 MiB, 16 MiB   fs/writeFile then fs/readFile (contents checked)
  getMetadata                       of a small file
  readDirectory 1000                a directory of 1000 files (count checked)
  copy 1 MiB file                   fs/copy recursive=false
  copy tree                         fs/copy of 10 dirs x 20 files x 4 KiB
  remove tree                       fs/remove recursive of the same tree (rebuilt untimed)
  40 / 64 MiB round trip            one fs/writeFile + fs/readFile on a fresh server; its
                                    VmRSS when idle and its VmHWM (peak RSS) afterwards.
                                    Upstream refuses messages over 64 MiB (tungstenite's
                                    default), so its 64 MiB round trip fails (noted).

Writes over 1 MiB are sent as fragmented WebSocket messages (1 MiB fragments) to
both servers: upstream refuses single frames over 16 MiB.

Medians in ms; ``ours/up`` is the ratio of medians (target <= 1.0).

Usage: python benchmarks/bench_fs.py [--quick] [--no-upstream] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (  # noqa: E402
    MIB,
    UPSTREAM,
    RawClient,
    Report,
    ServerTarget,
    Summary,
    available_targets,
    ours_target,
    start_server,
    summarize,
)

KIB = 1024


@dataclass(frozen=True)
class Counts:
    small: int = 200
    medium: int = 30
    large: int = 5
    metadata: int = 300
    readdir: int = 30
    copy_file: int = 30
    tree: int = 10
    round_trips: tuple[int, ...] = (40, 64)


QUICK = Counts(small=5, medium=3, large=1, metadata=5, readdir=2, copy_file=2, tree=1,
               round_trips=(8,))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def _timed(n: int, fn: Callable[[int], Awaitable[Any]]) -> Summary:
    samples = []
    for i in range(n):
        t0 = time.perf_counter()
        await fn(i)
        samples.append((time.perf_counter() - t0) * 1000)
    return summarize(samples)


#: Writes larger than this are sent as a fragmented WebSocket message: upstream
#: (tungstenite defaults) refuses single frames over 16 MiB and messages over 64 MiB.
FRAGMENT = 1 * MIB


async def call_large(c: RawClient, method: str, params: dict[str, Any],
                     limit_s: float = 300.0) -> Any:
    """``RawClient.call`` that sends the request as 1 MiB WebSocket fragments."""
    c._next_id += 1
    mid = c._next_id
    fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    c._pending[mid] = fut
    text = json.dumps({"id": mid, "method": method, "params": params})
    try:
        await c.ws.send([text[i : i + FRAGMENT] for i in range(0, len(text), FRAGMENT)])
        reply = await asyncio.wait_for(fut, limit_s)
    finally:
        c._pending.pop(mid, None)
    if "error" in reply:
        raise RuntimeError(f"{method}: {reply['error']}")
    return reply["result"]


def vm_hwm_mib(pid: int) -> float | None:
    """Peak resident set (VmHWM) of ``pid`` in MiB, Linux only."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def vm_rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def build_tree(root: str) -> None:
    for d in range(10):
        sub = os.path.join(root, f"d{d}")
        os.makedirs(sub, exist_ok=True)
        for f in range(20):
            with open(os.path.join(sub, f"f{f}.bin"), "wb") as fh:
                fh.write(b"t" * (4 * KIB))


async def bench_rw(c: RawClient, work: str, size: int, n: int) -> tuple[Summary, Summary]:
    data = os.urandom(size)
    encoded = _b64(data)
    path = c.path(os.path.join(work, f"rw-{size}.bin"))

    async def write(_: int) -> None:
        params = {"path": path, "dataBase64": encoded, "sandbox": None}
        if len(encoded) > FRAGMENT:
            await call_large(c, "fs/writeFile", params)
        else:
            await c.call("fs/writeFile", params)

    async def read(_: int) -> None:
        r = await c.call("fs/readFile", {"path": path, "sandbox": None})
        if r["dataBase64"] != encoded:
            raise AssertionError("readFile returned different bytes")

    return await _timed(n, write), await _timed(n, read)


async def round_trip(target: ServerTarget, workdir: str, mib: int, report: Report) -> None:
    """A fresh server, one ``mib`` MiB write + read; its idle RSS and its peak (VmHWM)."""
    name = target.name
    label = f"{mib} MiB"
    async with start_server(target, cwd=workdir) as srv, await RawClient.connect(
        srv.url, quickack=True
    ) as c:
        await c.handshake()
        idle = vm_rss_mib(srv.pid)
        if idle is not None:
            report.add(name, "RSS idle (fresh server)", idle, unit="MiB")
        encoded = _b64(os.urandom(mib * MIB))
        path = c.path(os.path.join(workdir, "round-trip.bin"))
        t0 = time.perf_counter()
        try:
            await call_large(c, "fs/writeFile", {"path": path, "dataBase64": encoded,
                                                 "sandbox": None})
            r = await c.call("fs/readFile", {"path": path, "sandbox": None}, limit_s=300)
        except Exception as exc:  # upstream drops the connection over 64 MiB
            report.notes.append(f"{name}: {label} round trip failed: {type(exc).__name__}")
            return
        elapsed = (time.perf_counter() - t0) * 1000
        if r["dataBase64"] != encoded:
            raise AssertionError("round trip changed the bytes")
        del r
        peak = vm_hwm_mib(srv.pid)
        report.add(name, f"{label} write+read", elapsed)
        if peak is not None:
            report.add(name, f"peak RSS, {label} round trip", peak, unit="MiB")


async def bench_server(target: ServerTarget, counts: Counts, report: Report) -> None:
    name = target.name
    workdir = tempfile.mkdtemp(prefix="bench_fs_")
    try:
        async with start_server(target, cwd=workdir) as srv, await RawClient.connect(
            srv.url, quickack=True
        ) as c:
            await c.handshake()
            for size, n, label in (
                (KIB, counts.small, "1 KiB"),
                (MIB, counts.medium, "1 MiB"),
                (16 * MIB, counts.large, "16 MiB"),
            ):
                w, r = await bench_rw(c, workdir, size, n)
                report.add(name, f"writeFile {label}", w, target=1.0)
                report.add(name, f"readFile {label}", r, target=1.0)

            meta_path = c.path(os.path.join(workdir, "rw-1024.bin"))

            async def metadata(_: int) -> None:
                r = await c.call("fs/getMetadata", {"path": meta_path, "sandbox": None})
                assert r["isFile"] is True

            report.add(name, "getMetadata", await _timed(counts.metadata, metadata), target=1.0)

            listing = os.path.join(workdir, "listing")
            os.mkdir(listing)
            for i in range(1000):
                with open(os.path.join(listing, f"entry-{i:04d}.txt"), "wb"):
                    pass
            listing_uri = c.path(listing)

            async def readdir(_: int) -> None:
                r = await c.call("fs/readDirectory", {"path": listing_uri, "sandbox": None})
                assert len(r["entries"]) == 1000

            report.add(name, "readDirectory 1000", await _timed(counts.readdir, readdir),
                       target=1.0)

            src_file = c.path(os.path.join(workdir, f"rw-{MIB}.bin"))

            async def copy_file(i: int) -> None:
                dst = c.path(os.path.join(workdir, f"copy-{i}.bin"))
                await c.call("fs/copy", {"sourcePath": src_file, "destinationPath": dst,
                                         "recursive": False, "sandbox": None})

            report.add(name, "copy 1 MiB file", await _timed(counts.copy_file, copy_file),
                       target=1.0)

            tree = os.path.join(workdir, "tree")
            build_tree(tree)
            tree_uri = c.path(tree)

            async def copy_tree(i: int) -> None:
                dst = c.path(os.path.join(workdir, f"tree-copy-{i}"))
                await c.call("fs/copy", {"sourcePath": tree_uri, "destinationPath": dst,
                                         "recursive": True, "sandbox": None})

            report.add(name, "copy tree (200 files)", await _timed(counts.tree, copy_tree),
                       target=1.0)

            samples = []
            for i in range(counts.tree):
                victim = os.path.join(workdir, f"victim-{i}")
                build_tree(victim)
                t0 = time.perf_counter()
                await c.call("fs/remove", {"path": c.path(victim), "recursive": True,
                                           "force": True, "sandbox": None})
                samples.append((time.perf_counter() - t0) * 1000)
                assert not os.path.exists(victim)
            report.add(name, "remove tree (200 files)", summarize(samples), target=1.0)

        for mib in counts.round_trips:
            await round_trip(target, workdir, mib, report)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)




async def run(args: argparse.Namespace) -> Report:
    counts = QUICK if args.quick else Counts()
    targets = [ours_target()] if args.no_upstream else available_targets()
    report = Report("exec-server filesystem benchmarks (medians)", [t.name for t in targets])
    if UPSTREAM not in report.servers:
        report.notes.append("upstream codex not installed: pip install openai-codex-cli-bin")
    report.notes.append("client: harness RawClient with TCP_QUICKACK, file:// URIs, sandbox null")
    for target in targets:
        print(f"[bench_fs] {target.name}: {' '.join(target.argv)}", file=sys.stderr, flush=True)
        await bench_server(target, counts, report)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny iteration counts (smoke test)")
    ap.add_argument("--no-upstream", action="store_true", help="benchmark only our server")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args(argv)
    report = asyncio.run(run(args))
    report.print()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.as_dict(), f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
