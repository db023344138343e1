#!/usr/bin/env python3
"""Fairness under a big message: does one client's huge ``fs/writeFile`` stall the
other connections' replies? Ours side by side with upstream's ``codex exec-server``.

For each size, on a fresh server: a sender process (its own, so its CPU work never
delays the prober) sends one ``fs/writeFile`` of that many random bytes as a
WebSocket message of 1 MiB text fragments (upstream refuses frames over 16 MiB);
meanwhile a prober connection sends ``fs/getMetadata`` every 10 ms, one at a
time, from just before the big message starts until 0.5 s after its answer.
Printed per server and size: the big write's time and outcome, the probes
answered, their worst and 99th-percentile reply times, and how many took over
1 s. Sizes are of the data in MiB; the message is 4/3 of it: 767 MiB is a
message just under 1 GiB, our default limit (``--max-message-size``). Upstream
refuses messages over 64 MiB (tungstenite's default message limit): its big
write fails, and the probes show what the refusal costs.

The sender holds the message (1.37 GiB of text for 1 GiB) and the server at
least as much: check ``free -m`` before choosing sizes.

Usage: python benchmarks/bench_big_message.py [--sizes 40,256,767] [--no-upstream]
                                             [--alt DIR ...]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import os
import statistics
import sys
import time

import msgspec
import websockets

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (
    MIB,
    RawClient,
    ServerTarget,
    available_targets,
    ours_target,
    start_in_temp_dir,
)

PROBE_EVERY = 0.01
_SCRIPT = os.path.abspath(__file__)


async def _send_big(url: str, path: str, size: int) -> None:
    """Sender process: connect, prepare, print ``ready``; on a line from stdin, send
    the write and print ``done <seconds> <ok|error text>``."""
    ws = await websockets.connect(url, max_size=None, compression=None, ping_interval=None,
                                  proxy=None, open_timeout=30)
    await ws.send(b'{"id":1,"method":"initialize","params":{"clientName":"big"}}', text=True)
    await ws.recv()
    await ws.send(b'{"method":"initialized","params":{}}', text=True)
    head = msgspec.json.encode({"id": 2, "method": "fs/writeFile", "params": {
        "path": "file://" + path, "dataBase64": ""}})
    cut = head.index(b'"dataBase64":""') + len(b'"dataBase64":"')
    message = head[:cut] + base64.b64encode(os.urandom(size)) + head[cut:]
    view = memoryview(message)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    started = time.perf_counter()
    outcome = "ok"
    try:
        await ws.send((view[i : i + MIB] for i in range(0, len(view), MIB)), text=True)
        reply = msgspec.json.decode(await ws.recv())
        if "error" in reply:
            outcome = "error " + str(reply["error"].get("message"))[:60]
    except websockets.ConnectionClosed as exc:
        outcome = f"closed {exc}"[:70]
    print(f"done {time.perf_counter() - started:.2f} {outcome}", flush=True)
    with contextlib.suppress(Exception):
        await ws.close()


async def _one(target: ServerTarget, size: int) -> dict[str, object]:
    async with contextlib.AsyncExitStack() as stack:
        server, workdir = await start_in_temp_dir(stack, target, "bench-big-")
        prober = await RawClient.connect(server.url, quickack=True)
        stack.push_async_callback(prober.aclose)
        await prober.handshake()
        sender = await asyncio.create_subprocess_exec(
            sys.executable, _SCRIPT, "--send", server.url,
            os.path.join(workdir, "big.bin"), str(size),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )
        assert sender.stdin is not None and sender.stdout is not None
        try:
            assert (await sender.stdout.readline()).startswith(b"ready")
            probe = {"path": prober.path(workdir)}
            await prober.call("fs/getMetadata", probe)
            times: list[float] = []
            done = asyncio.ensure_future(sender.stdout.readline())
            sender.stdin.write(b"go\n")
            await sender.stdin.drain()
            end: float | None = None
            while end is None or time.perf_counter() < end:
                started = time.perf_counter()
                await prober.call("fs/getMetadata", probe)
                times.append(time.perf_counter() - started)
                if end is None and done.done():
                    end = time.perf_counter() + 0.5
                await asyncio.sleep(max(0.0, PROBE_EVERY - (time.perf_counter() - started)))
            fields = (await done).decode().split(maxsplit=2)
        finally:
            with contextlib.suppress(ProcessLookupError):
                sender.kill()
            await sender.wait()
    times.sort()
    return {
        "write_s": float(fields[1]), "outcome": fields[2].strip() if len(fields) > 2 else "",
        "probes": len(times), "worst_ms": times[-1] * 1000,
        "p99_ms": statistics.quantiles(times, n=100)[98] * 1000 if len(times) > 1 else 0.0,
        "over_1s": sum(t > 1.0 for t in times),
    }


async def _main(args: argparse.Namespace) -> int:
    targets = [ours_target()] if args.no_upstream else available_targets()
    for k, alt in enumerate(args.alt):
        targets.insert(1 + k, ServerTarget(f"alt{k + 1}", ours_target().argv, {"PYTHONPATH": alt}))
    print(f"{'server':<9}{'size':>6}  {'write s':>8}  {'probes':>6}  {'worst ms':>9}  "
          f"{'p99 ms':>8}  {'>1 s':>4}  outcome")
    for size_mib in (int(s) for s in args.sizes.split(",")):
        for target in targets:
            r = await _one(target, size_mib * MIB)
            print(f"{target.name:<9}{size_mib:>5}M  {r['write_s']:>8.2f}  {r['probes']:>6}  "
                  f"{r['worst_ms']:>9.1f}  {r['p99_ms']:>8.1f}  {r['over_1s']:>4}  "
                  f"{r['outcome']}", flush=True)
    return 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--send":
        asyncio.run(_send_big(sys.argv[2], sys.argv[3], int(sys.argv[4])))
        return 0
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="40,256,767",
                    help="MiB of data per big write, comma-separated")
    ap.add_argument("--no-upstream", action="store_true", help="only our server")
    ap.add_argument("--alt", action="append", default=[], metavar="DIR",
                    help="another build of this server (PYTHONPATH=DIR), as in bench_fs.py")
    return asyncio.run(_main(ap.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
