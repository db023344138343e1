#!/usr/bin/env python3
"""Sandboxed filesystem benchmark: ours vs upstream ``codex exec-server``, side by side.

Both servers run at the same time (each with its own temp workspace as cwd) and
calls alternate between them, so load swings on a shared machine hit both
equally. They are driven by the harness's raw WebSocket client with ``file://`` URIs and the
current client's workspace-write ``permissions`` context on every call
(CLIENT_COMPAT.md §1.4, as codex 0.163 sends for apply_patch):

  sandboxed writeFile 1 KiB          fs/writeFile into the workspace (confined on both)
  sandboxed readFile 1 KiB, restr.   fs/readFile under a context *without* ``root: read``
                                     (reads limited to the workspace + platform
                                     defaults): confined on both
  sandboxed getMetadata, restr.      the same for fs/getMetadata
  readFile 1 KiB, root:read          fs/readFile under codex's profile (``root: read``):
                                     both servers read directly (equivalent, no helper)
  getMetadata, root:read             the same for fs/getMetadata
  unsandboxed readFile 1 KiB         ``sandbox: null`` for reference

The budget's target: ours/upstream <= 0.15 for the confined rows, met when the
ratio's 95 % interval reaches it. Medians in ms over N calls per server (after
warm-up: the first call starts our helper). ``--alt DIR`` adds another build of
this server (``PYTHONPATH=DIR``) to the same alternation.

Usage: python benchmarks/bench_fs_sandbox.py [--n N] [--no-upstream] [--json FILE]
                                           [--alt DIR ...]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (
    RawClient,
    Report,
    ServerTarget,
    Summary,
    alt_targets,
    available_targets,
    connect_client,
    publish,
    start_in_temp_dir,
    summarize,
)

from exec_server.client.sandbox_contexts import to_wire, workspace_write

KIB = 1024


def permissions_context(workspace: str, *, full_read: bool = True) -> dict[str, Any]:
    """What codex 0.163 sends on fs calls under ``--sandbox workspace-write``."""
    return to_wire(workspace_write(workspace, full_read=full_read))


Call = Callable[[], Awaitable[None]]


class Side:
    """One server under test: its client, workspace and the calls to time."""

    def __init__(self, name: str, client: RawClient, workspace: str) -> None:
        self.name = name
        payload = os.urandom(KIB)
        b64 = base64.b64encode(payload).decode()
        ctx = permissions_context(workspace)
        restricted = permissions_context(workspace, full_read=False)
        path = client.path(os.path.join(workspace, "bench.bin"))

        async def write() -> None:
            await client.call("fs/writeFile", {"path": path, "dataBase64": b64, "sandbox": ctx})

        def read(sandbox: Any) -> Call:
            async def call() -> None:
                res = await client.call("fs/readFile", {"path": path, "sandbox": sandbox})
                assert base64.b64decode(res["dataBase64"]) == payload

            return call

        def metadata(sandbox: Any) -> Call:
            async def call() -> None:
                res = await client.call("fs/getMetadata", {"path": path, "sandbox": sandbox})
                assert res["isFile"] is True

            return call

        self.calls: dict[str, Call] = {
            "sandboxed writeFile 1 KiB": write,
            "sandboxed readFile 1 KiB, restr.": read(restricted),
            "sandboxed getMetadata, restr.": metadata(restricted),
            "readFile 1 KiB, root:read": read(ctx),
            "getMetadata, root:read": metadata(ctx),
            "unsandboxed readFile 1 KiB": read(None),
        }


async def _timed(call: Call) -> float:
    t0 = time.perf_counter()
    await call()
    return (time.perf_counter() - t0) * 1000.0


async def bench(targets: list[ServerTarget], n: int) -> dict[str, dict[str, Summary]]:
    """All servers run at once; calls alternate between them so load swings hit both."""
    async with contextlib.AsyncExitStack() as stack:
        sides: list[Side] = []
        for target in targets:
            server, workspace = await start_in_temp_dir(stack, target, "fs-sandbox-bench-")
            client = await connect_client(stack, server.url)
            sides.append(Side(target.name, client, workspace))
        for side in sides:  # warm-up (our zygote starts on the first call)
            for _ in range(3):
                for call in side.calls.values():
                    await call()
        out: dict[str, dict[str, Summary]] = {side.name: {} for side in sides}
        for metric in sides[0].calls:
            samples: dict[str, list[float]] = {side.name: [] for side in sides}
            for _ in range(n):
                for side in sides:
                    samples[side.name].append(await _timed(side.calls[metric]))
            for name, xs in samples.items():
                out[name][metric] = summarize(xs)
        return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=60, help="calls per metric")
    parser.add_argument("--no-upstream", action="store_true")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--alt", action="append", default=[], metavar="DIR",
                        help="another build of this server, run with PYTHONPATH=DIR; repeatable")
    args = parser.parse_args()
    targets = available_targets(upstream=not args.no_upstream)
    targets[1:1] = alt_targets(args.alt)
    report = Report(
        "sandboxed fs (current-client permissions context, file:// URIs)", [t.name for t in targets]
    )
    for metric in (
        "sandboxed writeFile 1 KiB",
        "sandboxed readFile 1 KiB, restr.",
        "sandboxed getMetadata, restr.",
    ):
        report.metric(metric, "ms", target=0.15)
    for metric in ("readFile 1 KiB, root:read", "getMetadata, root:read"):
        report.metric(metric, "ms")
    report.metric("unsandboxed readFile 1 KiB", "ms")
    for name, metrics in asyncio.run(bench(targets, args.n)).items():
        for metric, summary in metrics.items():
            report.add(name, metric, summary)
    return publish(report, args.json)


if __name__ == "__main__":
    sys.exit(main())
