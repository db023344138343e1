#!/usr/bin/env python3
"""``http/request`` benchmark: this project's exec-server side by side with upstream's.

A local HTTP peer (its own process, on 127.0.0.1) serves a body of
``--mib`` MiB with a content length. Each sample is one ``http/request`` with
``streamResponse: true``, timed from the request until the ``done`` frame,
as MiB/s; the client checks every delta's number and that the byte count
adds up. Both servers run at once and the samples alternate between them
(``--reps`` each), so background load hits both alike. Target: ours/upstream
>= 1.0 (issue 29). A second row gives each server's CPU time (user + system)
per MiB of body: what the server costs, less sensitive to other load than
the wall-clock rate (on two shared cores, the servers, the client and the
peer compete for CPU).

Usage: python benchmarks/bench_http.py [--quick] [--mib N] [--reps N] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (
    MIB,
    UPSTREAM,
    RawClient,
    Report,
    available_targets,
    b64_len,
    connect_client,
    ours_target,
    publish,
    start_server,
    summarize,
)

#: The HTTP peer: serves ``GET /bytes/N`` (N bytes, 256 KiB writes, each drained).
_PEER = r"""
import asyncio, sys
BLOCK = bytes(range(256)) * 1024
async def serve(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            size = int(head.split(b" ", 2)[1].rsplit(b"/", 1)[1])
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
            left = size
            while left:
                n = min(left, len(BLOCK))
                writer.write(BLOCK[:n])
                await writer.drain()
                left -= n
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()
async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
asyncio.run(main())
"""

METRIC = "http/request streamed body"
CPU_METRIC = "server CPU per streamed MiB"
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


class BodyCounter:
    """Counts one streamed body's bytes from ``http/request/bodyDelta`` notifications."""

    def __init__(self) -> None:
        self.nbytes = 0
        self.seq = 0
        self.error: Any = None
        self.done = asyncio.Event()

    def on_delta(self, params: dict[str, Any]) -> None:
        self.seq += 1
        if params.get("seq") != self.seq:
            raise AssertionError(f"bodyDelta seq {params.get('seq')}, expected {self.seq}")
        self.nbytes += b64_len(params.get("deltaBase64") or "")
        if params.get("done"):
            self.error = params.get("error")
            self.done.set()


def watch_bodies(client: RawClient) -> dict[str, BodyCounter]:
    """Route ``bodyDelta`` notifications of ``client`` to counters by requestId."""
    counters: dict[str, BodyCounter] = {}
    previous = client._on_notification

    def on_notification(method: str | None, params: Any) -> None:
        if method == "http/request/bodyDelta":
            counter = counters.get(params.get("requestId"))
            if counter is not None:
                counter.on_delta(params)
            return
        previous(method, params)

    client._on_notification = on_notification  # type: ignore[method-assign]
    return counters


async def one_body(client: RawClient, counters: dict[str, BodyCounter], url: str,
                   request_id: str, size: int) -> float:
    """One streamed request; MiB/s from the request to the ``done`` frame."""
    counter = counters[request_id] = BodyCounter()
    t0 = time.perf_counter()
    result = await client.call("http/request", {
        "method": "GET", "url": url, "headers": [], "requestId": request_id,
        "streamResponse": True,
    })
    assert result["status"] == 200, result
    await asyncio.wait_for(counter.done.wait(), 120)
    elapsed = time.perf_counter() - t0
    del counters[request_id]
    if counter.error is not None or counter.nbytes != size:
        raise AssertionError(f"body: {counter.nbytes} of {size} bytes, error {counter.error}")
    return size / MIB / elapsed


@contextlib.asynccontextmanager
async def http_peer() -> Any:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _PEER, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    try:
        port = int((await asyncio.wait_for(proc.stdout.readline(), 30)).strip())
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        await proc.wait()


async def run(args: argparse.Namespace) -> Report:
    mib, reps = (1, 2) if args.quick else (args.mib, args.reps)
    targets = [ours_target()] if args.no_upstream else available_targets()
    report = Report("http/request benchmarks (medians)", [t.name for t in targets])
    metric = f"{METRIC} {mib} MiB"
    report.metric(metric, "MiB/s", target=1.0, higher_is_better=True)
    report.metric(CPU_METRIC, "ms")
    if UPSTREAM not in report.servers:
        report.notes.append("upstream codex not installed: pip install openai-codex-cli-bin")
    size = mib * MIB
    samples: dict[str, list[float]] = {t.name: [] for t in targets}
    cpu: dict[str, list[float]] = {t.name: [] for t in targets}
    async with contextlib.AsyncExitStack() as stack:
        base = await stack.enter_async_context(http_peer())
        url = f"{base}/bytes/{size}"
        clients = []
        for target in targets:
            server = await stack.enter_async_context(start_server(target))
            client = await connect_client(stack, server.url)
            clients.append((target.name, server.pid, client, watch_bodies(client)))
        for _, _, client, counters in clients:  # warm-up: connection pools, first import
            await one_body(client, counters, url, "warm", size)
        for rep in range(reps):
            for name, pid, client, counters in clients:
                before = cpu_seconds(pid)
                samples[name].append(await one_body(client, counters, url, f"r{rep}", size))
                cpu[name].append((cpu_seconds(pid) - before) * 1000 / mib)
    for name, xs in samples.items():
        report.add(name, metric, summarize(xs), unit="MiB/s", target=1.0, higher_is_better=True)
        report.add(name, CPU_METRIC, summarize(cpu[name]), unit="ms")
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 MiB, 2 reps (smoke test)")
    ap.add_argument("--no-upstream", action="store_true", help="benchmark only our server")
    ap.add_argument("--mib", type=int, default=64, help="body size in MiB (default 64)")
    ap.add_argument("--reps", type=int, default=7, help="samples per server (default 7)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args(argv)
    return publish(asyncio.run(run(args)), args.json)


if __name__ == "__main__":
    sys.exit(main())
