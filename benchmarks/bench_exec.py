#!/usr/bin/env python3
"""Process benchmarks: this project's exec-server side by side with upstream's.

Starts our server (``python -m exec_server serve``) and, when installed
(``pip install openai-codex-cli-bin``), the upstream Rust ``codex exec-server``,
side by side, and measures over a raw WebSocket JSON-RPC client:

  handshake           connect + initialize + initialized (new connection each)
  true start->closed  process/start of ``true`` until process/closed arrives
  echo start->closed  same for ``sh -c 'echo hi'`` (output checked)
  throughput          ``head -c 64MiB /dev/zero`` via process/output notifications
                      (bytes received must equal bytes written)
  32 concurrent       32 ``sh -c 'echo done'`` started at once, wall time to all closed
  pty echo            tty ``cat``: one process/write, latency until the echo arrives
  RSS                 server VmRSS idle (after the first handshake) and after the load

Servers run side by side and each metric alternates between them in ``--rounds``
rounds, so background load drifts hit both alike. Every client-side figure is
taken twice: with a client that re-arms TCP_QUICKACK (fair: upstream never sets
TCP_NODELAY, so a delayed-ACK client stalls its small writes in Nagle) and with a
plain client. The budget's targets (ours/upstream, quickack) are printed next to
the ratios, met when the ratio's 95 % interval reaches them. ``--alt DIR`` adds
another build of this server (``PYTHONPATH=DIR``) to the same rounds.

Usage: python benchmarks/bench_exec.py [--quick] [--no-upstream] [--json FILE]
                                     [--rounds N] [--metrics LIST] [--alt DIR ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (
    MIB,
    UPSTREAM,
    ProcState,
    RawClient,
    Report,
    RunningServer,
    ServerTarget,
    alt_targets,
    available_targets,
    connect_client,
    ours_target,
    publish,
    settle,
    start_in_temp_dir,
    summarize,
)

MODES = ("quickack", "plain")


@dataclass(frozen=True)
class Counts:
    handshake: int = 30
    true: int = 50
    echo: int = 50
    throughput_mib: int = 64
    throughput_reps: int = 6
    concurrent: int = 32
    concurrent_reps: int = 10
    pty_writes: int = 200


QUICK = Counts(
    handshake=3,
    true=3,
    echo=3,
    throughput_mib=1,
    throughput_reps=1,
    concurrent=4,
    concurrent_reps=1,
    pty_writes=3,
)


def _pid(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:12]}"


async def bench_handshake(url: str, quickack: bool, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        client = await RawClient.connect(url, quickack=quickack)
        await client.handshake()
        samples.append((time.perf_counter() - t0) * 1000)
        await client.aclose()
    return samples


async def bench_roundtrip(
    c: RawClient, workdir: str, argv: list[str], n: int, expect: bytes | None
) -> list[float]:
    """process/start -> process/closed notification, sequentially (ms)."""
    samples = []
    for _ in range(n):
        pid = _pid("rt")
        t0 = time.perf_counter()
        await c.start(pid, argv, workdir)
        st = await c.wait_closed(pid)
        samples.append((time.perf_counter() - t0) * 1000)
        c.forget(pid)
        if expect is not None and bytes(st.data) != expect:
            raise AssertionError(f"{argv}: got {bytes(st.data)!r}, want {expect!r}")
        if st.exit_code != 0:
            raise AssertionError(f"{argv}: exit code {st.exit_code}")
    return samples


async def bench_throughput(c: RawClient, workdir: str, mib: int, reps: int) -> list[float]:
    """MiB/s of ``head -c`` output received through notifications; totals verified."""
    expect = mib * MIB
    samples = []
    for _ in range(reps):
        pid = _pid("tp")
        t0 = time.perf_counter()
        await c.start(pid, ["head", "-c", str(expect), "/dev/zero"], workdir, keep=False)
        st = await c.wait_closed(pid, limit_s=300)
        dt = time.perf_counter() - t0
        c.forget(pid)
        if st.nbytes != expect:
            raise AssertionError(f"throughput: received {st.nbytes} of {expect} bytes")
        samples.append(expect / MIB / dt)
    return samples


async def bench_concurrent(c: RawClient, workdir: str, k: int, reps: int) -> list[float]:
    """Wall time from the first start to the last close of k short processes (ms)."""
    samples = []
    for _ in range(reps):
        pids = [_pid("cc") for _ in range(k)]
        t0 = time.perf_counter()
        await asyncio.gather(*(c.start(p, ["sh", "-c", "echo done"], workdir) for p in pids))
        states = await asyncio.gather(*(c.wait_closed(p) for p in pids))
        samples.append((time.perf_counter() - t0) * 1000)
        for p, st in zip(pids, states, strict=True):
            c.forget(p)
            if bytes(st.data) != b"done\n" or st.exit_code != 0:
                raise AssertionError(f"concurrent: {bytes(st.data)!r} exit {st.exit_code}")
    return samples


async def bench_pty_echo(c: RawClient, workdir: str, n: int) -> list[float]:
    """process/write of one short line to tty ``cat`` until its echo arrives (ms)."""
    pid = _pid("pty")
    st = await c.start(pid, ["cat"], workdir, tty=True)
    samples = []
    try:
        for i in range(n):
            want = f"x{i}y".encode()
            t0 = time.perf_counter()
            await c.call(
                "process/write",
                {"processId": pid, "chunk": _b64(want + b"\n"), "writeId": str(i + 1)},
            )
            await c.wait_output(pid, _contains(want))
            samples.append((time.perf_counter() - t0) * 1000)
            st.data.clear()
    finally:
        await c.call("process/terminate", {"processId": pid})
        await c.wait_closed(pid)
        c.forget(pid)
    return samples


def _contains(want: bytes) -> Callable[[ProcState], bool]:
    return lambda st: want in st.data


def _b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode()


@dataclass
class _Live:
    """A started server and, per mode, an open client."""

    server: RunningServer
    workdir: str
    clients: dict[str, RawClient]


def _split(total: int, rounds: int) -> list[int]:
    """``total`` iterations spread over ``rounds`` (at least one each)."""
    rounds = max(1, min(rounds, total))
    return [total // rounds + (1 if i < total % rounds else 0) for i in range(rounds)]


async def bench_all(
    targets: list[ServerTarget], counts: Counts, report: Report, modes: tuple[str, ...],
    rounds: int, metrics: frozenset[str] | None = None,
) -> None:
    """Run every benchmark (of ``metrics``), alternating servers round by round.

    Interleaving spreads background load drift evenly over ours and upstream,
    which matters on small shared machines.
    """
    async with contextlib.AsyncExitStack() as stack:
        live: dict[str, _Live] = {}
        for t in targets:
            srv, workdir = await start_in_temp_dir(stack, t, "bench_exec_")
            live[t.name] = _Live(srv, workdir, {})
        for lv in live.values():
            for mode in modes:
                lv.clients[mode] = await connect_client(
                    stack, lv.server.url, quickack=mode == "quickack"
                )
            await settle(lv.server.pid)  # start-up probes in children have finished
            _rss(report, lv.server, "RSS idle")

        async def run(metric: str, n: int, fn: Callable[[_Live, RawClient, bool, int],
                                                        Awaitable[list[float]]],
                      mode: str, **kw: Any) -> None:
            if metrics is not None and not any(key in metric for key in _keys(metrics)):
                return
            samples: dict[str, list[float]] = {name: [] for name in live}
            for part in _split(n, rounds):
                for name, lv in live.items():
                    samples[name] += await fn(lv, lv.clients[mode], mode == "quickack", part)
            for name, xs in samples.items():
                report.add(name, f"{metric} [{mode}]", summarize(xs), **kw)

        for mode in modes:
            await run("handshake", counts.handshake,
                      lambda lv, c, q, n: bench_handshake(lv.server.url, q, n), mode)
            await run("true start->closed", counts.true,
                      lambda lv, c, q, n: bench_roundtrip(c, lv.workdir, ["true"], n, None), mode)
            await run("echo hi start->closed", counts.echo,
                      lambda lv, c, q, n: bench_roundtrip(c, lv.workdir, ["sh", "-c", "echo hi"],
                                                          n, b"hi\n"), mode)
            await run(f"{counts.throughput_mib} MiB stdout via notif", counts.throughput_reps,
                      lambda lv, c, q, n: bench_throughput(c, lv.workdir, counts.throughput_mib,
                                                           n),
                      mode, unit="MiB/s", higher_is_better=True)
            await run(f"{counts.concurrent} concurrent sh echo", counts.concurrent_reps,
                      lambda lv, c, q, n: bench_concurrent(c, lv.workdir, counts.concurrent, n),
                      mode)
            await run("pty write->echo", counts.pty_writes,
                      lambda lv, c, q, n: bench_pty_echo(c, lv.workdir, n), mode)
        for lv in live.values():
            _rss(report, lv.server, "RSS after load")


#: ``--metrics`` names -> a prefix/substring of the metric label they select.
METRICS: Final = {"handshake": "handshake", "true": "true start", "echo": "echo hi",
                  "throughput": "MiB stdout", "concurrent": "concurrent", "pty": "pty"}


def _keys(metrics: frozenset[str]) -> list[str]:
    return [METRICS[m] for m in metrics]


def _rss(report: Report, srv: RunningServer, metric: str) -> None:
    mib = srv.rss_mib()
    if mib is not None:
        report.add(srv.target.name, metric, mib, unit="MiB")


def declare_rows(report: Report, counts: Counts, modes: tuple[str, ...],
                 metrics: frozenset[str]) -> None:
    """Fix the row order (per metric, quickack then plain) of the ``metrics`` measured."""
    report.metric("RSS idle", "MiB", target=0.6)
    for key, metric, unit, target, hib in (
        ("handshake", "handshake", "ms", None, False),
        ("true", "true start->closed", "ms", 0.5, False),
        ("echo", "echo hi start->closed", "ms", None, False),
        ("throughput", f"{counts.throughput_mib} MiB stdout via notif", "MiB/s", 0.8, True),
        ("concurrent", f"{counts.concurrent} concurrent sh echo", "ms", 0.8, False),
        ("pty", "pty write->echo", "ms", 1.5, False),
    ):
        if key not in metrics:
            continue
        for mode in modes:
            report.metric(f"{metric} [{mode}]", unit,
                          target=target if mode == "quickack" else None, higher_is_better=hib)
    report.metric("RSS after load", "MiB")


async def run(args: argparse.Namespace) -> Report:
    counts = QUICK if args.quick else Counts()
    targets = [ours_target()] if args.no_upstream else available_targets()
    targets = [t for t in targets if t.name in args.servers.split(",")]
    targets[1:1] = alt_targets(args.alt)
    modes = tuple(m for m in MODES if m in args.modes.split(","))
    report = Report("exec-server process benchmarks (medians)", [t.name for t in targets])
    if UPSTREAM not in report.servers:
        report.notes.append("upstream codex not installed: pip install openai-codex-cli-bin")
    for target in targets:
        print(f"[bench_exec] {target.name}: {' '.join(target.argv)}", file=sys.stderr, flush=True)
    metrics = frozenset(m for m in args.metrics.split(",") if m)
    unknown = metrics - set(METRICS)
    if unknown:
        raise SystemExit(f"unknown --metrics {sorted(unknown)}; choose from {sorted(METRICS)}")
    declare_rows(report, counts, modes, metrics)
    await bench_all(targets, counts, report, modes, 1 if args.quick else args.rounds, metrics)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny iteration counts (smoke test)")
    ap.add_argument("--no-upstream", action="store_true", help="benchmark only our server")
    ap.add_argument("--servers", default="ours,upstream", help="which servers to run")
    ap.add_argument("--modes", default=",".join(MODES), help="quickack,plain (default both)")
    ap.add_argument("--rounds", type=int, default=5,
                    help="alternate servers this many times per metric (default 5)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    ap.add_argument("--alt", action="append", default=[], metavar="DIR",
                    help="another build of this server, run with PYTHONPATH=DIR, as alt1, "
                    "alt2, ... in the same rounds; repeatable")
    ap.add_argument("--metrics", default=",".join(METRICS),
                    help="comma list of " + ",".join(METRICS) + " (default all; RSS always)")
    args = ap.parse_args(argv)
    return publish(asyncio.run(run(args)), args.json)


if __name__ == "__main__":
    sys.exit(main())
