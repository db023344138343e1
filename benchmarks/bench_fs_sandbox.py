#!/usr/bin/env python3
"""Sandboxed filesystem benchmark: ours vs upstream ``codex exec-server``, side by side.

Both servers are started (one after the other) with a temp workspace as cwd and
driven by the harness's raw WebSocket client with ``file://`` URIs and the
current client's workspace-write ``permissions`` context on every call
(CLIENT_COMPAT.md §1.4, as codex 0.163 sends for apply_patch):

  sandboxed writeFile 1 KiB     fs/writeFile into the workspace (confined on both)
  sandboxed readFile 1 KiB      fs/readFile of that file (contents checked)
  sandboxed getMetadata         of the same file
  sandboxed read, restricted    fs/readFile under a context *without* ``root: read``
                                (reads limited to the workspace), so neither server
                                can take a direct read path
  unsandboxed readFile 1 KiB    ``sandbox: null`` for reference

Target: ours/upstream <= 0.1 for the sandboxed rows. Medians in ms over N calls
(after warm-up: the first call starts our zygote).

Usage: python benchmarks/bench_fs_sandbox.py [--n N] [--no-upstream] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (  # noqa: E402
    RawClient,
    Report,
    ServerTarget,
    available_targets,
    start_server,
    time_many,
)

KIB = 1024


def _special(kind: str, **extra: str) -> dict[str, Any]:
    return {"type": "special", "value": {"kind": kind, **extra}}


def permissions_context(workspace: str, *, full_read: bool = True) -> dict[str, Any]:
    """What codex 0.163 sends on fs calls under ``--sandbox workspace-write``."""
    uri = "file://" + workspace
    entries: list[dict[str, Any]] = []
    if full_read:
        entries.append({"path": _special("root"), "access": "read"})
    else:
        entries.append({"path": _special("minimal"), "access": "read"})
    entries += [
        {"path": _special("project_roots"), "access": "write"},
        {"path": _special("slash_tmp"), "access": "write"},
        {"path": _special("tmpdir"), "access": "write"},
    ]
    entries += [
        {
            "path": _special("project_roots", subpath=name),
            "access": "read",
            "missing_path_behavior": "skip",
        }
        for name in (".git", ".agents", ".codex", ".aws")
    ]
    return {
        "permissions": {
            "type": "managed",
            "file_system": {"type": "restricted", "entries": entries},
            "network": "restricted",
        },
        "cwd": uri,
        "policyContext": {"cwd": uri, "workspaceRoots": [uri]},
        "workspaceRoots": [uri],
        "userHomeDir": "file://" + os.path.expanduser("~"),
        "windowsSandboxLevel": "disabled",
        "useLegacyLandlock": False,
    }


async def bench_target(target: ServerTarget, n: int) -> dict[str, Any]:
    workspace = os.path.realpath(tempfile.mkdtemp(prefix="fs-sandbox-bench-"))
    payload = os.urandom(KIB)
    b64 = base64.b64encode(payload).decode()
    ctx = permissions_context(workspace)
    restricted = permissions_context(workspace, full_read=False)
    out: dict[str, Any] = {}
    async with start_server(target, cwd=workspace) as server:
        async with await RawClient.connect(server.url, quickack=True) as c:
            await c.handshake()
            path = c.path(os.path.join(workspace, "bench.bin"))

            async def write() -> None:
                await c.call("fs/writeFile", {"path": path, "dataBase64": b64, "sandbox": ctx})

            async def read_with(sandbox: Any) -> None:
                res = await c.call("fs/readFile", {"path": path, "sandbox": sandbox})
                assert base64.b64decode(res["dataBase64"]) == payload

            async def read() -> None:
                await read_with(ctx)

            async def read_restricted() -> None:
                await read_with(restricted)

            async def read_direct() -> None:
                await read_with(None)

            async def metadata() -> None:
                res = await c.call("fs/getMetadata", {"path": path, "sandbox": ctx})
                assert res["isFile"] is True

            for _ in range(3):  # warm-up (our zygote starts on the first call)
                await write()
                await read()
                await read_restricted()
            out["sandboxed writeFile 1 KiB"] = await time_many(n, write)
            out["sandboxed readFile 1 KiB"] = await time_many(n, read)
            out["sandboxed getMetadata"] = await time_many(n, metadata)
            out["sandboxed read, restricted"] = await time_many(n, read_restricted)
            out["unsandboxed readFile 1 KiB"] = await time_many(n, read_direct)
    return out


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=60, help="calls per metric")
    parser.add_argument("--no-upstream", action="store_true")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    targets = available_targets(upstream=not args.no_upstream)
    report = Report("sandboxed fs (current-client permissions context, file:// URIs)",
                    [t.name for t in targets])
    for metric in (
        "sandboxed writeFile 1 KiB",
        "sandboxed readFile 1 KiB",
        "sandboxed getMetadata",
        "sandboxed read, restricted",
    ):
        report.metric(metric, "ms", target=0.1)
    report.metric("unsandboxed readFile 1 KiB", "ms")
    for target in targets:
        for metric, summary in (await bench_target(target, args.n)).items():
            report.add(target.name, metric, summary)
    report.print()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.as_dict(), f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
