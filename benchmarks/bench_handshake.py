"""Connection set-up time: TCP connect + WebSocket upgrade + ``initialize`` reply.

For each auth mode (none, capability token, signed JWT) ours and upstream's
``codex exec-server`` run side by side with the same flags; samples come from
alternating batches. The token check should cost microseconds, so each auth
row should sit within noise of the ``none`` row of the same server.

    python benchmarks/bench_handshake.py [--n 200] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import os
import sys
import tempfile
import time

import websockets

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (
    OURS,
    UPSTREAM,
    Report,
    ServerTarget,
    publish,
    start_server,
    summarize,
    upstream_codex_path,
)

TOKEN = "bench-token-" + "x" * 32
SECRET = b"bench-secret-" + b"y" * 32
BATCH = 20


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _jwt() -> str:
    head = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = _b64url(json.dumps({"exp": int(time.time()) + 3600}).encode())
    sig = hmac.new(SECRET, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{_b64url(sig)}"


def _modes(tmp: str) -> dict[str, tuple[list[str], str | None]]:
    token_file = os.path.join(tmp, "token")
    secret_file = os.path.join(tmp, "secret")
    with open(token_file, "w") as f:
        f.write(TOKEN)
    with open(secret_file, "wb") as f:
        f.write(SECRET)
    return {
        "none": ([], None),
        "capability-token": (
            ["--ws-auth", "capability-token", "--ws-token-file", token_file], TOKEN
        ),
        "signed-bearer-token": (
            ["--ws-auth", "signed-bearer-token", "--ws-shared-secret-file", secret_file],
            _jwt(),
        ),
    }


async def _one(url: str, token: str | None) -> float:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    t0 = time.perf_counter()
    async with websockets.connect(
        url, additional_headers=headers, compression=None, proxy=None, ping_interval=None
    ) as ws:
        await ws.send('{"id":1,"method":"initialize","params":{"clientName":"bench"}}')
        await ws.recv()
        elapsed = time.perf_counter() - t0
    return elapsed * 1000


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="samples per server and mode")
    parser.add_argument("--json", default=None, help="write the figures here")
    parser.add_argument(
        "--alt", default=None, metavar="SRC",
        help="also time another build's src/ directory (mode none only), as column alt",
    )
    args = parser.parse_args()
    codex = upstream_codex_path()
    servers = [OURS] + (["alt"] if args.alt else []) + ([UPSTREAM] if codex else [])
    report = Report("connection set-up (connect + upgrade + initialize)", servers)
    with tempfile.TemporaryDirectory() as tmp:
        for mode, (flags, token) in _modes(tmp).items():
            targets = [
                ServerTarget(OURS, (sys.executable, "-m", "exec_server", "serve",
                                    "--listen", "ws://127.0.0.1:0", *flags))
            ]
            if args.alt and mode == "none":
                targets.append(ServerTarget("alt", targets[0].argv, {"PYTHONPATH": args.alt}))
            if codex:
                targets.append(ServerTarget(
                    UPSTREAM, (codex, "exec-server", "--listen", "ws://127.0.0.1:0", *flags)
                ))
            samples: dict[str, list[float]] = {t.name: [] for t in targets}
            async with contextlib.AsyncExitStack() as stack:
                running = [await stack.enter_async_context(start_server(t)) for t in targets]
                for srv in running:  # warm up
                    for _ in range(5):
                        await _one(srv.url, token)
                while min(len(v) for v in samples.values()) < args.n:
                    for srv in running:
                        for _ in range(BATCH):
                            samples[srv.target.name].append(await _one(srv.url, token))
            for name, values in samples.items():
                report.add(name, f"set-up, auth {mode}", summarize(values))
    return publish(report, args.json)


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
