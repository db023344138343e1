#!/usr/bin/env python3
"""Recorded Codex sessions replayed back to back: this server's wall time beside upstream's.

Starts both servers once (ours: ``python -m exec_server serve``; upstream:
``codex exec-server`` from ``openai-codex-cli-bin``, when installed), then in each
of ``--rounds`` rounds replays every recording (``*.rpc.jsonl``, see
``replay.py``) against each server in turn, the servers' order swapped every
round so load that comes and goes hits both alike. A sample is one session: a
new connection, the client's frames in the recorded order with the recorded
waits, until the last reply; a fresh scenario directory each time, laid out
outside the timed span. The total row sums one round's sessions per server.

Prints per recording and total: medians (ms), ratio ours/upstream with its
bootstrap 95 % interval, and the verdict against the budget (total <= 1.0x, met
when the interval reaches it). A session whose replies differ in kind from the
recording's (a result where Codex got an error, or another error code) is named
in a note; one that does not complete (timeout, dropped connection) is named and
left out of the rest of the run on both servers, so the total compares like with
like.

``--alt DIR`` replays against another build of this server (``PYTHONPATH=DIR``)
in the same rounds.

Usage: python benchmarks/bench_replay.py [--rounds N] [--quick] [--no-upstream]
           [--recordings DIR ...] [--sandbox-backend auto|bwrap|landlock] [--json FILE]
           [--alt DIR ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (
    OURS,
    UPSTREAM,
    Report,
    RunningServer,
    ServerTarget,
    alt_targets,
    ours_target,
    start_in_temp_dir,
    summarize,
    upstream_target,
    write_json,
    ws_connect,
)
from replay import RECORDINGS, FakeHttp, Recording, ReplayError, prepare_root, recordings, replay

TOTAL = "total (all sessions)"
TARGET = 1.0


class Run:
    """Samples and outcomes of one benchmark run."""

    def __init__(self, servers: list[str], names: list[str]) -> None:
        self.servers = servers
        self.names = names
        self.samples: dict[tuple[str, str], list[float]] = {}
        self.totals: dict[str, list[float]] = {s: [] for s in servers}
        #: recording -> (server, why) of its first failure
        self.failed: dict[str, tuple[str, str]] = {}
        self.differences: dict[tuple[str, str], tuple[str, ...]] = {}

    def completed(self, server: str, name: str) -> int:
        return len(self.samples.get((server, name), []))

    def live(self) -> list[str]:
        return [n for n in self.names if n not in self.failed]


async def session(server: RunningServer, path: Path, base: Path, http_origin: str,
                  limit_s: float) -> tuple[float, tuple[str, ...]]:
    """One replay of ``path`` against ``server``: its wall time (s) and differences."""
    root = Path(tempfile.mkdtemp(prefix=f"{server.target.name}-", dir=base))
    try:
        name = path.name.removesuffix(".rpc.jsonl")
        scenario = root / name
        prepare_root(scenario, name, path)
        rec = Recording.load(path, scenario, http_origin)
        t0 = time.perf_counter()
        ws = await ws_connect(server.url, quickack=True)
        try:
            result = await replay(ws, rec, limit_s=limit_s)
            seconds = time.perf_counter() - t0
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ws.close(), 3)
        return seconds, result.differences
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def bench(targets: list[ServerTarget], paths: list[Path], rounds: int,
                limit_s: float) -> Run:
    run = Run([t.name for t in targets], [p.name.removesuffix(".rpc.jsonl") for p in paths])
    by_name = dict(zip(run.names, paths, strict=True))
    async with contextlib.AsyncExitStack() as stack:
        # Outside /tmp: a workspace-write sandbox leaves /tmp writable, so the
        # sandboxed recording's write outside the workspace would be allowed there.
        base = Path(tempfile.mkdtemp(prefix="bench-replay-", dir="/var/tmp"))
        stack.callback(shutil.rmtree, base, True)
        fake = await stack.enter_async_context(FakeHttp())
        servers = []
        for t in targets:
            server, _ = await start_in_temp_dir(stack, t, f"replay-{t.name}-", parent=str(base))
            servers.append(server)
        for r in range(rounds):
            order = servers if r % 2 == 0 else servers[::-1]
            for name in run.live():
                for server in order:
                    key = (server.target.name, name)
                    try:
                        seconds, diffs = await session(server, by_name[name], base,
                                                       fake.origin, limit_s)
                    except (ReplayError, OSError) as exc:
                        run.failed[name] = (server.target.name, str(exc))
                        break
                    run.samples.setdefault(key, []).append(seconds * 1000)
                    run.differences.setdefault(key, diffs)
            print(f"[bench_replay] round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
    # A session left out after a failure is left out of every round's total.
    live = run.live()
    for s in run.servers:
        run.totals[s] = [sum(xs) for xs in zip(*(run.samples[(s, n)] for n in live), strict=True)]
    return run


def report(run: Run) -> Report:
    rep = Report("recorded Codex sessions replayed (medians, ms per session)", run.servers)
    for name in run.names:
        for s in run.servers:
            xs = run.samples.get((s, name))
            if xs and name not in run.failed:
                rep.add(s, name, summarize(xs), unit="ms")
    for s in run.servers:
        if run.totals[s]:
            rep.add(s, TOTAL, summarize(run.totals[s]), unit="ms", target=TARGET)
    for name, (s, why) in run.failed.items():
        rep.notes.append(f"{name}: did not complete on {s} ({why}); left out of the total")
    for (s, name), diffs in sorted(run.differences.items()):
        if diffs:
            rep.notes.append(f"{s} {name}: {len(diffs)} replies differ from the recording: "
                             + "; ".join(diffs[:3]) + (" ..." if len(diffs) > 3 else ""))
    if UPSTREAM in run.servers:
        rep.notes.append(verdict(rep))
    else:
        rep.notes.append("upstream codex not installed: pip install openai-codex-cli-bin")
    return rep


def verdict(rep: Report) -> str:
    ratio, interval = rep.ratio(TOTAL), rep.interval(TOTAL)
    if ratio is None:
        return f"budget total <= {TARGET:g}x: no figure"
    if interval is None:
        return (f"budget total <= {TARGET:g}x: median ratio {ratio:.2f}x "
                "(too few rounds for an interval: use --rounds 5 or more)")
    met = interval[0] <= TARGET
    return (f"budget total <= {TARGET:g}x: {'met' if met else 'MISSED'} "
            f"(ratio {ratio:.2f}x, 95% interval {interval[0]:.2f}-{interval[1]:.2f})")


def as_json(run: Run, rep: Report) -> dict[str, object]:
    return {
        "rows": rep.as_dict(),
        "sessions": {
            s: {name: {"completed": run.completed(s, name),
                       "differences": list(run.differences.get((s, name), ()))}
                for name in run.names}
            for s in run.servers
        },
        "failed": {name: {"server": s, "why": why} for name, (s, why) in run.failed.items()},
        "notes": rep.notes,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=8, help="rounds (default 8)")
    ap.add_argument("--quick", action="store_true", help="one round (smoke test)")
    ap.add_argument("--no-upstream", action="store_true", help="replay against our server only")
    ap.add_argument("--recordings", action="append", type=Path, metavar="DIR",
                    help=f"directory of *.rpc.jsonl, repeatable (default {RECORDINGS})")
    ap.add_argument("--only", metavar="NAMES", help="comma list of recording names to replay")
    ap.add_argument("--sandbox-backend", default="auto", choices=("auto", "bwrap", "landlock"),
                    help="our server's sandbox backend (default auto)")
    ap.add_argument("--limit", type=float, default=30.0, metavar="S",
                    help="give up on a session waiting longer than this (default 30 s)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    ap.add_argument("--alt", action="append", default=[], metavar="DIR",
                    help="another build of this server, run with PYTHONPATH=DIR, replayed "
                    "in the same rounds; repeatable")
    args = ap.parse_args(argv)
    paths = recordings(args.recordings or [RECORDINGS])
    if args.only:
        wanted = set(args.only.split(","))
        paths = [p for p in paths if p.name.removesuffix(".rpc.jsonl") in wanted]
    if not paths:
        ap.error("no recordings found")
    targets = [ours_target("--sandbox-backend", args.sandbox_backend),
               *alt_targets(args.alt, "--sandbox-backend", args.sandbox_backend)]
    up = None if args.no_upstream else upstream_target()
    if up is not None:
        targets.append(up)
    for t in targets:
        print(f"[bench_replay] {t.name}: {' '.join(t.argv)}", file=sys.stderr, flush=True)
    run = asyncio.run(bench(targets, paths, 1 if args.quick else args.rounds, args.limit))
    rep = report(run)
    rep.print()
    if args.json:
        write_json(args.json, as_json(run, rep))
    return 1 if any(s == OURS for s, _ in run.failed.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
