#!/usr/bin/env python3
"""``fs/walk`` and ``fs/readBlock`` side by side with upstream's exec-server.

  walk 10k entries      fs/walk of a tree of 10,000 entries (100 directories x 99
                        files, depth 2), the options Codex uses for skills but
                        limits big enough for the whole tree (entry count checked);
                        ms per walk, target <= 1.0x upstream
  readBlock 64 MiB      fs/open + fs/readBlock of a 64 MiB file in 1 MiB blocks (the
                        Codex client's stream reader) + fs/close; MiB/s, target
                        >= 1.0x upstream (contents' length checked)

Both servers run at once in one work directory and samples are taken in
alternating batches (ours, upstream, ours, ...), as in bench_fs.py.

Usage: python benchmarks/bench_fs_walk.py [--quick] [--no-upstream] [--json FILE] [--dir DIR]
                                          [--samples N] [--batch N] [--reads N]
                                          [--alt DIR ...]
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (
    MIB,
    RawClient,
    Report,
    connect_client,
    fs_parser,
    fs_targets,
    publish,
    start_server,
    summarize,
    temp_dir,
)

WALK = "walk 10k entries"
READ = "readBlock 64 MiB (1 MiB blocks)"
DIRS, FILES = 100, 99  # 100 + 100 * 99 = 10,000 entries
READ_SIZE = 64 * MIB


def make_tree(root: str) -> None:
    for d in range(DIRS):
        sub = os.path.join(root, f"dir{d:03d}")
        os.makedirs(sub)
        for f in range(FILES):
            with open(os.path.join(sub, f"file{f:03d}.txt"), "wb") as out:
                out.write(b"x")


def write_big(path: str) -> None:
    with open(path, "wb") as out:
        out.write(os.urandom(READ_SIZE))


async def walk_once(client: RawClient, root: str) -> float:
    options = {"maxDepth": 6, "maxDirectories": 2000, "maxEntries": 20000,
               "followDirectorySymlinks": True, "pruneHiddenDirectories": True}
    t0 = time.perf_counter()
    result = await client.call("fs/walk", {"path": client.path(root), "options": options})
    elapsed = time.perf_counter() - t0
    assert len(result["entries"]) == DIRS * (FILES + 1), len(result["entries"])
    return elapsed * 1000


async def read_once(client: RawClient, path: str, n: int) -> float:
    handle = f"bench{n}"
    t0 = time.perf_counter()
    await client.call("fs/open", {"handleId": handle, "path": client.path(path)})
    offset = 0
    while True:
        r = await client.call("fs/readBlock", {"handleId": handle, "offset": offset, "len": MIB})
        offset += len(base64.b64decode(r["chunk"]))
        if r["eof"]:
            break
    await client.call("fs/close", {"handleId": handle})
    elapsed = time.perf_counter() - t0
    assert offset == READ_SIZE, offset
    return READ_SIZE / MIB / elapsed


async def run(args: object) -> Report:
    targets = fs_targets(args)  # type: ignore[arg-type]
    report = Report("fs/walk and fs/readBlock", [t.name for t in targets])
    report.metric(WALK, "ms", target=1.0)
    report.metric(READ, "MiB/s", target=1.0, higher_is_better=True)
    samples: dict[str, dict[str, list[float]]] = {t.name: {WALK: [], READ: []} for t in targets}
    async with contextlib.AsyncExitStack() as stack:
        work = temp_dir(stack, "bench-walk-", parent=args.dir)  # type: ignore[attr-defined]
        tree = os.path.join(work, "tree")
        await asyncio.to_thread(make_tree, tree)
        big = os.path.join(work, "big")
        await asyncio.to_thread(write_big, big)
        clients = []
        for target in targets:
            server = await stack.enter_async_context(start_server(target, cwd=work))
            clients.append((target.name, await connect_client(stack, server.url)))
        count = 0
        for _ in range(args.samples // args.batch):  # type: ignore[attr-defined]
            for name, client in clients:
                for _ in range(args.batch):  # type: ignore[attr-defined]
                    samples[name][WALK].append(await walk_once(client, tree))
                for _ in range(args.reads):  # type: ignore[attr-defined]
                    count += 1
                    samples[name][READ].append(await read_once(client, big, count))
    for name, metrics in samples.items():
        report.add(name, WALK, summarize(metrics[WALK]), unit="ms", target=1.0)
        report.add(name, READ, summarize(metrics[READ]), unit="MiB/s", target=1.0,
                   higher_is_better=True)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = fs_parser(__doc__, dir_help="parent of the work directory (default: the temp dir)")
    ap.add_argument("--samples", type=int, default=30, help="walks per server")
    ap.add_argument("--batch", type=int, default=5, help="walks per server per batch")
    ap.add_argument("--reads", type=int, default=2, help="64 MiB reads per server per batch")
    args = ap.parse_args(argv)
    if args.quick:
        args.samples, args.batch, args.reads = 4, 2, 1
    return publish(asyncio.run(run(args)), args.json)


if __name__ == "__main__":
    sys.exit(main())
