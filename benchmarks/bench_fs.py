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

Both servers run side by side in one work directory (each on its own names)
and every metric's samples are taken in alternating batches (ours, upstream,
ours, ...), so load changes on a shared machine, and the filesystem's state in
that directory, affect both alike. Medians in ms; ``ours/up`` is the ratio of
medians. The budget's target, ours/upstream <= 1.5 for the 1 KiB and 1 MiB
reads and writes and for getMetadata, is met when the ratio's 95 % interval
reaches it; the other rows have no target. ``--only`` picks rows by substring
(e.g. ``--only "1 KiB,1 MiB,getMetadata"``) for a shorter run.

``--alt DIR`` (repeatable; in every filesystem benchmark) adds another build of
this server, run with ``PYTHONPATH=DIR``, as ``alt1``, ``alt2``, ... in the same
batches: ``mkdir /tmp/base && git archive HEAD src | tar -x -C /tmp/base``, then
``--alt /tmp/base/src`` compares a change with the last commit and upstream in
one run. On this project's VMs a server's figures move by 1.5-2x within an hour,
so only figures from one run compare.

Usage: python benchmarks/bench_fs.py [--quick] [--no-upstream] [--json FILE] [--dir DIR]
                                   [--alt DIR ...] [--only SUBSTRINGS]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (
    MIB,
    UPSTREAM,
    RawClient,
    Report,
    ServerTarget,
    connect_client,
    fs_parser,
    fs_targets,
    publish,
    rss_kib,
    start_server,
    summarize,
    temp_dir,
    vm_hwm_kib,
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
    tree: int = 30  # was 10 until the sixth session: too few for this VM's slow phases
    round_trips: tuple[int, ...] = (40, 64)


QUICK = Counts(small=5, medium=3, large=1, metadata=5, readdir=2, copy_file=2, tree=1,
               round_trips=(8,))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


#: Writes larger than this are sent as a fragmented WebSocket message: upstream
#: (tungstenite defaults) refuses single frames over 16 MiB and messages over 64 MiB.
FRAGMENT = 1 * MIB


def _exists(path: str) -> bool:
    return os.path.exists(path)


def prepare(prefix: str, counts: Counts) -> None:
    """Untimed fixtures, named ``prefix`` + name: a 1000-entry directory, a tree to
    copy, trees to remove."""
    listing = prefix + "listing"
    os.mkdir(listing)
    for i in range(1000):
        with open(os.path.join(listing, f"entry-{i:04d}.txt"), "wb"):
            pass
    build_tree(prefix + "tree")
    for i in range(counts.tree + 1):  # + the warm-up's (see interleaved)
        build_tree(prefix + f"victim-{i}")


def create_cost_us(directory: str, n: int = 50) -> float:
    """Median microseconds to create (and close) an empty file in ``directory``.

    Printed with the figures because it is the filesystem's state, not a
    server's: on ext4 without a journal, creating a file skips every inode of
    its group freed in the last 60 s (300 s while the inode table is dirty),
    one buffer lookup each, so after a mass delete (a test suite's or a
    previous run's clean-up) each creation there costs up to ~1 ms. Our
    ``fs/writeFile`` creates a file per call (a temp file renamed over the
    target, so a failed write never leaves half a file) where upstream
    truncates in place, so that row follows this figure (docs/benchmarks.md).
    """
    times = []
    probe = os.path.join(directory, ".create-probe")
    for i in range(n):
        t0 = time.perf_counter()
        fd = os.open(f"{probe}-{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        times.append(time.perf_counter() - t0)
        os.close(fd)
    for i in range(n):
        os.unlink(f"{probe}-{i}")
    times.sort()
    return times[n // 2] * 1e6


def build_tree(root: str) -> None:
    for d in range(10):
        sub = os.path.join(root, f"d{d}")
        os.makedirs(sub, exist_ok=True)
        for f in range(20):
            with open(os.path.join(sub, f"f{f}.bin"), "wb") as fh:
                fh.write(b"t" * (4 * KIB))


async def round_trip(target: ServerTarget, workdir: str, mib: int, report: Report) -> None:
    """A fresh server, one ``mib`` MiB write + read; its idle RSS and its peak (VmHWM)."""
    name = target.name
    label = f"{mib} MiB"
    async with start_server(target, cwd=workdir) as srv, await RawClient.connect(
        srv.url, quickack=True
    ) as c:
        await c.handshake()
        idle = rss_kib(srv.pid, tree=False)
        if idle is not None:
            report.add(name, "RSS idle (fresh server)", idle / 1024, unit="MiB")
        encoded = _b64(os.urandom(mib * MIB))
        path = c.path(os.path.join(workdir, "round-trip.bin"))
        t0 = time.perf_counter()
        try:
            await c.call_fragmented("fs/writeFile", {"path": path, "dataBase64": encoded,
                                                 "sandbox": None}, fragment=FRAGMENT)
            r = await c.call("fs/readFile", {"path": path, "sandbox": None}, limit_s=300)
        except Exception as exc:  # upstream drops the connection over 64 MiB
            report.notes.append(f"{name}: {label} round trip failed: {type(exc).__name__}")
            return
        elapsed = (time.perf_counter() - t0) * 1000
        if r["dataBase64"] != encoded:
            raise AssertionError("round trip changed the bytes")
        del r
        peak = vm_hwm_kib(srv.pid)
        report.add(name, f"{label} write+read", elapsed)
        if peak is not None:
            report.add(name, f"peak RSS, {label} round trip", peak / 1024, unit="MiB")


@dataclass
class Side:
    """One server under test: its client, its samples, and its files.

    Every server works in the same directory, each on names starting with its
    own prefix (``ours-``, ``upstream-``): files a call creates then come from
    the same inode group of the same directory for every server, so the
    filesystem's state there (see :func:`create_cost_us`) weighs on all alike.
    Each server's own directory could land in a different group.
    """

    name: str
    client: RawClient
    workdir: str
    samples: dict[str, list[float]]

    def local(self, name: str, *parts: str) -> str:
        """This side's ``name`` in the shared work directory, as a local path."""
        return os.path.join(self.workdir, f"{self.name}-{name}", *parts)

    def path(self, name: str, *parts: str) -> str:
        """:meth:`local` in the form the client sends (``file://`` URI)."""
        return self.client.path(self.local(name, *parts))


Op = Callable[[Side, int], Awaitable[Any]]


async def interleaved(
    sides: list[Side], metric: str, n: int, op: Op, rounds: int = 5, first: int = 0
) -> None:
    """Run ``n`` samples of ``op`` per server in ``rounds`` alternating batches
    (the order flips every round), so load changes on a shared machine hit every
    server alike. ``first`` is the index of the server that runs the first batch.

    Starts with an untimed ``sync``: the fixtures and the previous metric leave
    megabytes of dirty pages, and their writeback (journal commits) would
    otherwise land on the first samples of this metric, on whichever server
    happened to run then. The first call after the ``sync`` is still slower
    (the first 1 MiB copy after it took 1.6-5.3 ms against ~0.7 ms, for
    whichever server made it), so each server then makes one untimed warm-up
    call (``op(side, n)``: ops that need a fresh target get index ``n``), and
    callers rotate ``first`` from metric to metric as well.
    """
    await asyncio.to_thread(os.sync)
    for side in sides[::-1] if first % 2 else sides:
        await op(side, n)
    done = 0
    per_round = max(1, -(-n // rounds))
    flip = first % 2 == 1
    while done < n:
        batch = min(per_round, n - done)
        # Alternate who goes first, so neither server always runs right after
        # the sync (or right after the other's batch).
        order = sides[::-1] if flip else sides
        flip = not flip
        for side in order:
            out = side.samples.setdefault(metric, [])
            for i in range(done, done + batch):
                t0 = time.perf_counter()
                await op(side, i)
                out.append((time.perf_counter() - t0) * 1000)
        done += batch


def rw_ops(size: int) -> tuple[Op, Op]:
    data = os.urandom(size)
    encoded = _b64(data)
    name = f"rw-{size}.bin"

    async def write(side: Side, _: int) -> None:
        params = {"path": side.path(name), "dataBase64": encoded, "sandbox": None}
        if len(encoded) > FRAGMENT:
            await side.client.call_fragmented("fs/writeFile", params, fragment=FRAGMENT)
        else:
            await side.client.call("fs/writeFile", params)

    async def read(side: Side, _: int) -> None:
        r = await side.client.call("fs/readFile", {"path": side.path(name), "sandbox": None})
        if r["dataBase64"] != encoded:
            raise AssertionError("readFile returned different bytes")

    return write, read


async def metadata(side: Side, _: int) -> None:
    r = await side.client.call("fs/getMetadata", {"path": side.path("rw-1024.bin"),
                                                  "sandbox": None})
    assert r["isFile"] is True


async def readdir(side: Side, _: int) -> None:
    r = await side.client.call("fs/readDirectory", {"path": side.path("listing"),
                                                    "sandbox": None})
    assert len(r["entries"]) == 1000


async def copy_file(side: Side, i: int) -> None:
    await side.client.call("fs/copy", {"sourcePath": side.path(f"rw-{MIB}.bin"),
                                       "destinationPath": side.path(f"copy-{i}.bin"),
                                       "recursive": False, "sandbox": None})


async def copy_tree(side: Side, i: int) -> None:
    await side.client.call("fs/copy", {"sourcePath": side.path("tree"),
                                       "destinationPath": side.path(f"tree-copy-{i}"),
                                       "recursive": True, "sandbox": None})


async def remove_tree(side: Side, i: int) -> None:
    victim = side.local(f"victim-{i}")
    await side.client.call("fs/remove", {"path": side.client.path(victim), "recursive": True,
                                         "force": True, "sandbox": None})
    assert not _exists(victim)


#: The budget's rows (ours/upstream <= 1.5): small and 1 MiB reads and writes.
BUDGET_ROWS = frozenset({"writeFile 1 KiB", "readFile 1 KiB", "writeFile 1 MiB",
                         "readFile 1 MiB", "getMetadata"})
BUDGET_TARGET = 1.5


def _wanted(metric: str, only: list[str]) -> bool:
    return not only or any(part in metric for part in only)


async def bench_all(
    targets: list[ServerTarget], counts: Counts, report: Report, parent: str | None = None,
    only: list[str] | None = None,
) -> None:
    only = only or []
    async with contextlib.AsyncExitStack() as stack:
        sides: list[Side] = []
        workdir = temp_dir(stack, "bench_fs_", parent=parent)
        for target in targets:
            srv = await stack.enter_async_context(start_server(target, cwd=workdir))
            client = await connect_client(stack, srv.url)
            sides.append(Side(target.name, client, workdir, {}))
            await asyncio.to_thread(prepare, os.path.join(workdir, f"{target.name}-"), counts)
        cost = await asyncio.to_thread(create_cost_us, workdir)
        report.notes.append(
            f"creating a file in the work directory took {cost:.0f} us (median of 50, before "
            "the run; see create_cost_us)"
        )

        plan: list[tuple[str, int, Op]] = []
        for size, n, label in (
            (KIB, counts.small, "1 KiB"),
            (MIB, counts.medium, "1 MiB"),
            (16 * MIB, counts.large, "16 MiB"),
        ):
            write, read = rw_ops(size)
            plan += [(f"writeFile {label}", n, write), (f"readFile {label}", n, read)]
        plan += [
            ("getMetadata", counts.metadata, metadata),
            ("readDirectory 1000", counts.readdir, readdir),
            ("copy 1 MiB file", counts.copy_file, copy_file),
            ("copy tree (200 files)", counts.tree, copy_tree),
            ("remove tree (200 files)", counts.tree, remove_tree),
        ]
        # Who runs right after each metric's sync alternates from metric to
        # metric (see interleaved), so no server takes that batch every time.
        plan = [p for p in plan if _wanted(p[0], only)]
        for k, (metric, n, op) in enumerate(plan):
            await interleaved(sides, metric, n, op, first=k)
        for side in sides:
            for metric, values in side.samples.items():
                report.add(side.name, metric, summarize(values),
                           target=BUDGET_TARGET if metric in BUDGET_ROWS else None)

    for mib in counts.round_trips if _wanted("round trip", only) else ():
        for target in targets:
            async with contextlib.AsyncExitStack() as stack:
                work = temp_dir(stack, "bench_fs_rt_", parent=parent)
                await round_trip(target, work, mib, report)


async def run(args: argparse.Namespace) -> Report:
    counts = QUICK if args.quick else Counts()
    targets = fs_targets(args)
    report = Report("exec-server filesystem benchmarks (medians)", [t.name for t in targets])
    if UPSTREAM not in report.servers:
        report.notes.append("upstream codex not installed: pip install openai-codex-cli-bin")
    report.notes.append("client: harness RawClient with TCP_QUICKACK, file:// URIs, sandbox null")
    report.notes.append(f"work directory under {args.dir or tempfile.gettempdir()}, "
                        "shared by both servers (names prefixed per server)")
    for target in targets:
        print(f"[bench_fs] {target.name}: {' '.join(target.argv)}", file=sys.stderr, flush=True)
    await bench_all(targets, counts, report, args.dir,
                    [p for p in args.only.split(",") if p])
    return report


def main(argv: list[str] | None = None) -> int:
    ap = fs_parser(__doc__, dir_help="parent of the work directory (default: the temp dir); "
                   "e.g. a tmpfs such as /dev/shm to take the disk out of the figures")
    ap.add_argument("--only", default="", metavar="SUBSTRINGS",
                    help="comma list: measure only the rows whose name contains one "
                    "('round trip' selects the 40/64 MiB round trips)")
    args = ap.parse_args(argv)
    return publish(asyncio.run(run(args)), args.json)


if __name__ == "__main__":
    sys.exit(main())
