#!/usr/bin/env python3
"""Sandboxed filesystem benchmark: ours vs upstream ``codex exec-server``, side by side.

Both servers are started (one after the other) with a temp workspace as cwd and
driven by the harness's raw WebSocket client with ``file://`` URIs and the
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

Target: ours/upstream <= 0.1 for the confined rows. Medians in ms over N calls
(after warm-up: the first call starts our zygote).

Usage: python benchmarks/bench_fs_sandbox.py [--n N] [--no-upstream] [--json FILE]
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
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (
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


def _workspace() -> str:
    return os.path.realpath(tempfile.mkdtemp(prefix="fs-sandbox-bench-"))


async def bench_target(target: ServerTarget, n: int) -> dict[str, Any]:
    workspace = _workspace()
    try:
        return await _bench_in(target, n, workspace)
    finally:
        shutil.rmtree(workspace, ignore_errors=True)


async def _bench_in(target: ServerTarget, n: int, workspace: str) -> dict[str, Any]:
    payload = os.urandom(KIB)
    b64 = base64.b64encode(payload).decode()
    ctx = permissions_context(workspace)
    restricted = permissions_context(workspace, full_read=False)
    out: dict[str, Any] = {}
    async with (
        start_server(target, cwd=workspace) as server,
        await RawClient.connect(server.url, quickack=True) as c,
    ):
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

        async def metadata_with(sandbox: Any) -> None:
            res = await c.call("fs/getMetadata", {"path": path, "sandbox": sandbox})
            assert res["isFile"] is True

        async def metadata() -> None:
            await metadata_with(ctx)

        async def metadata_restricted() -> None:
            await metadata_with(restricted)

        for _ in range(3):  # warm-up (our zygote starts on the first call)
            await write()
            await read()
            await read_restricted()
        out["sandboxed writeFile 1 KiB"] = await time_many(n, write)
        out["sandboxed readFile 1 KiB, restr."] = await time_many(n, read_restricted)
        out["sandboxed getMetadata, restr."] = await time_many(n, metadata_restricted)
        out["readFile 1 KiB, root:read"] = await time_many(n, read)
        out["getMetadata, root:read"] = await time_many(n, metadata)
        out["unsandboxed readFile 1 KiB"] = await time_many(n, read_direct)
    return out


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=60, help="calls per metric")
    parser.add_argument("--no-upstream", action="store_true")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    targets = available_targets(upstream=not args.no_upstream)
    report = Report(
        "sandboxed fs (current-client permissions context, file:// URIs)", [t.name for t in targets]
    )
    for metric in (
        "sandboxed writeFile 1 KiB",
        "sandboxed readFile 1 KiB, restr.",
        "sandboxed getMetadata, restr.",
    ):
        report.metric(metric, "ms", target=0.1)
    for metric in ("readFile 1 KiB, root:read", "getMetadata, root:read"):
        report.metric(metric, "ms")
    report.metric("unsandboxed readFile 1 KiB", "ms")
    for target in targets:
        for metric, summary in (await bench_target(target, args.n)).items():
            report.add(target.name, metric, summary)
    report.print()
    if args.json:
        _write_json(args.json, report.as_dict())
    return 0


def _write_json(path: str, data: Any) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=2)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
