#!/usr/bin/env python3
"""Server time of small filesystem calls, without the benchmark client's own cost.

``bench_fs.py`` times round trips through an asyncio WebSocket client (the
reference harness's kind), whose own CPU time and wake-ups are part of every
figure and land differently on each server. Here a blocking client per
server (a plain socket, no event loop) sends each request and asks the
kernel when the reply arrived (``SO_TIMESTAMPNS``): *server time* is from
the request's ``send`` to the reply's arrival in the client's socket, so
the client's wake-up and parsing drop out. It sends the next request as
soon as it has read the answer, as a native client would.

  getMetadata        of a 1 KiB file
  readFile 1 KiB     contents checked
  writeFile 1 KiB    the same file over and over
  copy 1 MiB file    to a new name each time

Both servers work in one directory (names prefixed per server), and every
metric alternates batches between them, flipping who goes first. Linux only
(``SO_TIMESTAMPNS``).

Usage: python benchmarks/bench_server_time.py [--quick] [--no-upstream] [--dir DIR] [--alt DIR ...]
                                              [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import socket
import struct
import sys
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (
    MIB,
    UPSTREAM,
    Report,
    fs_parser,
    fs_targets,
    publish,
    start_server,
    summarize,
    temp_dir,
)

KIB = 1024
#: ``SO_TIMESTAMPNS`` (``socket`` has no name for it): the kernel's receive time of a segment.
SO_TIMESTAMPNS = 35
ROUNDS = 6


class BlockingClient:
    """JSON-RPC over one WebSocket, by hand: masked text frames out, frames in."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        parsed = urllib.parse.urlsplit(url)
        sock = socket.create_connection((parsed.hostname, parsed.port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall(
            f"GET / HTTP/1.1\r\nHost: {parsed.netloc}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(4096)
            if not chunk:
                raise ConnectionError("closed during the upgrade")
            head += chunk
        status, _, rest = head.partition(b"\r\n\r\n")
        if b" 101 " not in status.split(b"\r\n", 1)[0]:
            raise ConnectionError(f"upgrade refused: {status[:80]!r}")
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self._sock = sock
        self._buf = rest
        self._next_id = 0

    def close(self) -> None:
        self._sock.close()

    def _send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message).encode()
        size = len(data)
        if size < 126:
            head = struct.pack("!BB", 0x81, 0x80 | size)
        elif size < 1 << 16:
            head = struct.pack("!BBH", 0x81, 0x80 | 126, size)
        else:
            head = struct.pack("!BBQ", 0x81, 0x80 | 127, size)
        mask = os.urandom(4)
        word = int.from_bytes(mask * (size // 4 + 1), "little")
        masked = (int.from_bytes(data, "little") ^ word).to_bytes(size + 4, "little")[:size]
        self._sock.sendall(head + mask + masked)

    def _frame(self) -> tuple[dict[str, Any], int | None]:
        """The next whole text frame (server frames are unmasked, unfragmented here)
        and the kernel's arrival time (ns, ``CLOCK_REALTIME``) of its first bytes."""
        arrived: int | None = None
        buf = self._buf
        while True:
            if len(buf) >= 2:
                size, start = buf[1] & 0x7F, 2
                if size == 126 and len(buf) >= 4:
                    size, start = struct.unpack("!H", buf[2:4])[0], 4
                elif size == 127 and len(buf) >= 10:
                    size, start = struct.unpack("!Q", buf[2:10])[0], 10
                header_whole = size < 126 or start > 2
                if header_whole and len(buf) >= start + size:
                    self._buf = buf[start + size :]
                    return json.loads(buf[start : start + size]), arrived
            data, ancillary, _, _ = self._sock.recvmsg(1 << 20, 64)
            if not data:
                raise ConnectionError("server closed the connection")
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and arrived is None:
                    seconds, nanos = struct.unpack("qq", payload[:16])
                    arrived = seconds * 1_000_000_000 + nanos
            buf += data

    def call(self, method: str, params: dict[str, Any]) -> tuple[Any, float, float]:
        """Result, server time and round trip (ms) of one request."""
        self._next_id += 1
        request_id = self._next_id
        sent = time.time_ns()
        self._send({"id": request_id, "method": method, "params": params})
        while True:
            message, arrived = self._frame()
            if message.get("id") == request_id:
                break
        done = time.time_ns()
        if "error" in message:
            raise RuntimeError(f"{method}: {message['error']}")
        if arrived is None:
            raise RuntimeError("no receive timestamp (SO_TIMESTAMPNS unsupported?)")
        return message.get("result"), (arrived - sent) / 1e6, (done - sent) / 1e6

    def handshake(self) -> None:
        self.call("initialize", {"clientName": "bench-server-time"})
        self._send({"method": "initialized", "params": {}})


def _uri(path: str) -> str:
    return "file://" + urllib.parse.quote(path)


Call = Callable[[BlockingClient, int], tuple[Any, float, float]]


def calls(workdir: str, name: str) -> dict[str, Call]:
    """The measured calls for one server (its files: ``name-...`` in ``workdir``)."""
    small = os.path.join(workdir, f"{name}-small.bin")
    big = os.path.join(workdir, f"{name}-big.bin")
    data = os.urandom(KIB)
    with open(small, "wb") as f:
        f.write(data)
    with open(big, "wb") as f:
        f.write(os.urandom(MIB))
    encoded = base64.b64encode(data).decode()

    def metadata(c: BlockingClient, _: int) -> tuple[Any, float, float]:
        out = c.call("fs/getMetadata", {"path": _uri(small), "sandbox": None})
        assert out[0]["isFile"] is True
        return out

    def read(c: BlockingClient, _: int) -> tuple[Any, float, float]:
        out = c.call("fs/readFile", {"path": _uri(small), "sandbox": None})
        assert out[0]["dataBase64"] == encoded
        return out

    def write(c: BlockingClient, _: int) -> tuple[Any, float, float]:
        return c.call("fs/writeFile", {"path": _uri(small), "dataBase64": encoded,
                                       "sandbox": None})

    def copy(c: BlockingClient, i: int) -> tuple[Any, float, float]:
        return c.call("fs/copy", {"sourcePath": _uri(big),
                                  "destinationPath": _uri(f"{big}.copy-{i}"),
                                  "recursive": False, "sandbox": None})

    return {"getMetadata": metadata, "readFile 1 KiB": read, "writeFile 1 KiB": write,
            "copy 1 MiB file": copy}


def measure(clients: dict[str, BlockingClient], workdir: str, n: int,
            report: Report) -> None:
    """Every metric, ``n`` samples per server in :data:`ROUNDS` alternating batches."""
    plans = {name: calls(workdir, name) for name in clients}
    names = list(clients)
    metrics = list(next(iter(plans.values())))
    serial = 0
    for k, metric in enumerate(metrics):
        server: dict[str, list[float]] = {name: [] for name in names}
        trip: dict[str, list[float]] = {name: [] for name in names}
        for name in names:  # one untimed call each (first use of the path and method)
            serial += 1
            plans[name][metric](clients[name], serial)
        per_round = max(1, -(-n // ROUNDS))
        done = 0
        flip = k % 2 == 1
        while done < n:
            batch = min(per_round, n - done)
            for name in names[::-1] if flip else names:
                for _ in range(batch):
                    serial += 1
                    _, s, t = plans[name][metric](clients[name], serial)
                    server[name].append(s)
                    trip[name].append(t)
            flip = not flip
            done += batch
        for name in names:
            report.add(name, f"{metric}: server time", summarize(server[name]), target=1.0)
            report.add(name, f"{metric}: round trip", summarize(trip[name]))


async def run(args: argparse.Namespace) -> Report:
    targets = fs_targets(args)
    report = Report("fs calls: server time, blocking client (medians)",
                    [t.name for t in targets])
    if UPSTREAM not in report.servers and not args.no_upstream:
        report.notes.append("upstream codex not installed: pip install openai-codex-cli-bin")
    report.notes.append("server time: request sent -> reply in the client's socket "
                        "(SO_TIMESTAMPNS); round trip: until the client has parsed it")
    n = 10 if args.quick else 240
    async with contextlib.AsyncExitStack() as stack:
        workdir = temp_dir(stack, "bench_server_time_", parent=args.dir)
        clients: dict[str, BlockingClient] = {}
        for target in targets:
            srv = await stack.enter_async_context(start_server(target, cwd=workdir))
            client = BlockingClient(srv.url)
            stack.callback(client.close)
            client.handshake()
            clients[target.name] = client
        # Blocking calls off the loop, which keeps draining the servers' output.
        await asyncio.to_thread(measure, clients, workdir, n, report)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = fs_parser(__doc__, dir_help="parent of the work directory (default: the temp dir)")
    args = ap.parse_args(argv)
    return publish(asyncio.run(run(args)), args.json)


if __name__ == "__main__":
    sys.exit(main())
