#!/usr/bin/env python3
"""``fs/copy`` of one file (or, with ``--tree``, of ``bench_fs.py``'s 200-file tree),
many samples, side by side with upstream, split in windows.

``bench_fs.py`` takes 30 copies per server. In a directory where files were
deleted recently, creating one costs 100-500 µs on ext4 without a journal, and
our spare files (``fs/spare.py``) start only once a directory's average creation
passes 100 µs: those 30 samples are mostly the warm-up. This script takes more
samples (same client, same ``interleaved`` batches, one shared work directory) and
prints, besides the medians, ours/upstream per window of consecutive samples, so a
trend shows as one (docs/benchmarks.md, "Fifteenth session").

``--alt DIR`` (repeatable) adds another build of this server, run with
``PYTHONPATH=DIR`` (a directory holding an ``exec_server`` package), so changes are
compared in one run with the shipped build and upstream.

Usage: python benchmarks/bench_fs_copy.py [--size BYTES | --tree] [--samples N] [--dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_fs import Side, build_tree, create_cost_us, interleaved
from harness import (
    MIB,
    OURS,
    UPSTREAM,
    Report,
    connect_client,
    fs_parser,
    fs_targets,
    publish,
    start_server,
    summarize,
    temp_dir,
)


def write_source(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def check_copies(sides: list[Side], samples: int, size: int) -> None:
    """Every copy (and the warm-up's, index ``samples``) is whole."""
    for side in sides:
        for i in range(samples + 1):
            if os.path.getsize(side.local(f"copy-{i}.bin")) != size:
                raise AssertionError(f"{side.name}: copy {i} is not {size} bytes")


def tree_files(root: str) -> int:
    return sum(len(files) for _, _, files in os.walk(root))


def check_tree_copies(sides: list[Side], samples: int) -> None:
    """Every tree copy (and the warm-up's) holds as many files as the source."""
    for side in sides:
        want = tree_files(side.local("source"))
        for i in range(samples + 1):
            got = tree_files(side.local(f"copy-{i}"))
            if got != want:
                raise AssertionError(f"{side.name}: tree copy {i} has {got} of {want} files")


def windows(ours: list[float], upstream: list[float], size: int) -> list[float]:
    """ours/upstream of the medians of each ``size`` consecutive samples."""
    return [
        statistics.median(ours[i : i + size]) / statistics.median(upstream[i : i + size])
        for i in range(0, min(len(ours), len(upstream)), size)
    ]


async def run(args: argparse.Namespace) -> Report:
    chosen = fs_targets(args)
    metric = "copy tree (200 files)" if args.tree else f"copy {args.size} B file"
    suffix = "" if args.tree else ".bin"
    report = Report(f"exec-server {metric} (medians)", [t.name for t in chosen])
    data = os.urandom(args.size)
    async with contextlib.AsyncExitStack() as stack:
        workdir = temp_dir(stack, "bench_fs_copy_", parent=args.dir)
        sides: list[Side] = []
        for target in chosen:
            srv = await stack.enter_async_context(start_server(target, cwd=workdir))
            side = Side(target.name, await connect_client(stack, srv.url), workdir, {})
            if args.tree:
                await asyncio.to_thread(build_tree, side.local("source"))
            else:
                await asyncio.to_thread(write_source, side.local("source.bin"), data)
            sides.append(side)
        cost = await asyncio.to_thread(create_cost_us, workdir)
        report.notes.append(f"creating a file in the work directory took {cost:.0f} us")

        async def copy(side: Side, i: int) -> None:
            await side.client.call("fs/copy", {"sourcePath": side.path("source" + suffix),
                                               "destinationPath": side.path(f"copy-{i}{suffix}"),
                                               "recursive": args.tree, "sandbox": None})

        await interleaved(sides, metric, args.samples, copy,
                          rounds=max(1, args.samples // args.batch))
        if args.tree:
            await asyncio.to_thread(check_tree_copies, sides, args.samples)
        else:
            await asyncio.to_thread(check_copies, sides, args.samples, args.size)
    for side in sides:
        report.add(side.name, metric, summarize(side.samples[metric]), target=1.0)
    by_name = {side.name: side.samples[metric] for side in sides}
    if UPSTREAM in by_name:
        for name, samples in by_name.items():
            if name == UPSTREAM:
                continue
            ratios = windows(samples, by_name[UPSTREAM], args.window)
            label = "ours" if name == OURS else name
            report.notes.append(f"{label}/up per {args.window} samples: "
                                + " ".join(f"{r:.2f}" for r in ratios))
            if name != OURS:
                ratio = statistics.median(samples) / statistics.median(by_name[UPSTREAM])
                report.notes.append(f"{label}/up overall: {ratio:.2f}")
    return report


def main(argv: list[str] | None = None) -> int:
    ap = fs_parser(__doc__, dir_help="parent of the work directory (default: the temp dir)")
    ap.add_argument("--size", type=int, default=MIB, help="bytes in the file copied")
    ap.add_argument("--tree", action="store_true",
                    help="copy bench_fs.py's tree (10 dirs x 20 files x 4 KiB) instead")
    ap.add_argument("--samples", type=int, default=120, help="copies per server")
    ap.add_argument("--batch", type=int, default=6, help="copies per server per batch")
    ap.add_argument("--window", type=int, default=30, help="samples per printed ratio")
    args = ap.parse_args(argv)
    if args.quick:
        args.samples, args.batch, args.window = 4, 2, 2
    return publish(asyncio.run(run(args)), args.json)


if __name__ == "__main__":
    sys.exit(main())
