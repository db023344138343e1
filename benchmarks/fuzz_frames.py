#!/usr/bin/env python3
"""Differential frame fuzz: raw WebSocket frames and bad JSON-RPC, ours beside upstream.

Every case opens a fresh TCP connection, upgrades it (a real HTTP upgrade),
sends ``initialize`` + ``initialized`` unless the case is about the handshake,
writes the case's bytes exactly (frames built here, so anything RFC 6455
forbids can be sent: reserved bits and opcodes, unmasked frames, huge declared
lengths, fragmented control frames, bad close codes, invalid UTF-8 ...), then a
probe request (``fs/getMetadata`` of ``/``), and reads what comes back until the
probe's reply (the connection survived), a close frame, the end of the stream
without a close frame, or a quiet ``--wait`` seconds.

A case's outcome is the replies in order (id and result or error code, pongs)
and how it ended. Outcomes are compared server by server:

  OURS-DROPS   ours ended the connection where upstream answered and went on
  OURS-SILENT  ours ended it without a close frame
  UP-DROPS     upstream ended it where ours went on
  UP-SILENT    both ended it with the same replies, ours with a close frame,
               upstream without (upstream sends no close frame on any error)
  DIFFERENT    both went on (or both closed) but the replies differ

The first two are bugs to fix (issue 30: "never a silent close"); the exit
status is 1 when any is found. Without upstream each case is ``alone``, or
OURS-SILENT when ours ended it without a close frame. Cases come from fixed lists (frames, JSON
shapes, each method's params of every wrong type) and ``--random`` mutations of
valid messages drawn from ``--seed``: one seed, one set of inputs.

Usage: python benchmarks/fuzz_frames.py [--seed N] [--random N] [--no-upstream]
           [--only SUBSTRING] [--wait S] [--parallel N] [--load MIB] [--show all|diff]
           [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import json
import os
import random
import sys
import time
from collections.abc import Iterator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (
    OURS,
    UPSTREAM,
    RunningServer,
    ServerTarget,
    ours_target,
    start_in_temp_dir,
    upstream_target,
    write_json,
)
from websockets.utils import apply_mask

TEXT, BINARY, CONT, CLOSE, PING, PONG = 1, 2, 0, 8, 9, 10
KEY = base64.b64encode(b"fuzz-frames-key!").decode()
UPGRADE = (
    "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    f"Sec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 13\r\n\r\n"
).encode()
PROBE_ID = "probe"
PROBE = json.dumps({"id": PROBE_ID, "method": "fs/getMetadata",
                    "params": {"path": "file:///"}}).encode()
INIT = json.dumps({"id": "init", "method": "initialize",
                   "params": {"clientName": "fuzz"}}).encode()
INITIALIZED = b'{"method":"initialized","params":{}}'
#: Every request method of this server and of upstream 0.163's surface.
METHODS = (
    "initialize", "environment/info", "environment/status", "environmentConfig/read",
    "fs/canonicalize", "fs/close", "fs/copy", "fs/createDirectory", "fs/getMetadata",
    "fs/open", "fs/readBlock", "fs/readDirectory", "fs/readFile", "fs/remove", "fs/walk",
    "fs/writeBlock", "fs/writeFile", "http/request", "process/closeStdin", "process/read",
    "process/resizePty", "process/signal", "process/start", "process/terminate",
    "process/write",
)


# --------------------------------------------------------------------------- frames


class Framer:
    """Builds client frames; masks drawn from the run's seeded generator."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def frame(self, payload: bytes, opcode: int = TEXT, *, fin: bool = True, rsv: int = 0,
              masked: bool = True, length: int | None = None, wide: int | None = None) -> bytes:
        """One frame. ``length`` declares another payload length than the bytes sent;
        ``wide`` forces the 2- (126) or 8-byte (127) length form whatever the size."""
        n = len(payload) if length is None else length
        head = bytearray([(0x80 if fin else 0) | (rsv & 7) << 4 | (opcode & 0x0F)])
        mask_bit = 0x80 if masked else 0
        if wide is None:
            wide = 0 if n < 126 else 126 if n < 0x10000 else 127
        if wide == 0:
            head.append(mask_bit | n)
        elif wide == 126:
            head += bytes([mask_bit | 126]) + n.to_bytes(2, "big")
        else:
            head += bytes([mask_bit | 127]) + n.to_bytes(8, "big")
        if not masked:
            return bytes(head) + payload
        key = self.rng.randbytes(4)
        return bytes(head) + key + apply_mask(payload, key)

    def text(self, payload: bytes) -> bytes:
        return self.frame(payload, TEXT)

    def fragments(self, payload: bytes, pieces: int, opcode: int = TEXT) -> list[bytes]:
        cuts = sorted(self.rng.sample(range(1, len(payload)), pieces - 1)) if pieces > 1 else []
        parts = [payload[a:b] for a, b in zip([0, *cuts], [*cuts, len(payload)], strict=True)]
        return [self.frame(p, opcode if i == 0 else CONT, fin=i == len(parts) - 1)
                for i, p in enumerate(parts)]


def close_payload(code: int, reason: bytes = b"") -> bytes:
    return code.to_bytes(2, "big") + reason


# --------------------------------------------------------------------------- cases


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    chunks: tuple[bytes, ...]  # written one by one, in order
    init: bool = True
    probe: bool = True


def request(method: str, params: object = None, rid: object = 1, *, omit: bool = False) -> bytes:
    msg: dict[str, object] = {"id": rid, "method": method}
    if not omit:
        msg["params"] = params
    return json.dumps(msg).encode()


def frame_cases(f: Framer) -> Iterator[Case]:
    req = request("fs/getMetadata", {"path": "file:///tmp"}, 1)
    yield Case("frame/text", (f.text(req),))
    yield Case("frame/binary", (f.frame(req, BINARY),))
    yield Case("frame/binary-truncated-json", (f.frame(req[:-1], BINARY),))
    yield Case("frame/empty-text", (f.text(b""),))
    yield Case("frame/empty-binary", (f.frame(b"", BINARY),))
    yield Case("frame/unmasked-empty-binary", (f.frame(b"", BINARY, masked=False),))
    for k in (2, 3, 7):
        yield Case(f"frame/fragmented-text-{k}", tuple(f.fragments(req, k)))
        yield Case(f"frame/fragmented-binary-{k}", tuple(f.fragments(req, k, BINARY)))
    parts = f.fragments(req, 3)
    yield Case("frame/fragmented-ping-between",
               (parts[0], f.frame(b"between", PING), parts[1], parts[2]))
    yield Case("frame/fragmented-pong-between",
               (parts[0], f.frame(b"", PONG), parts[1], parts[2]))
    yield Case("frame/fragmented-close-between",
               (parts[0], f.frame(close_payload(1000), CLOSE), parts[1], parts[2]), probe=False)
    yield Case("frame/fragmented-text-then-text", (parts[0], f.text(req)))
    yield Case("frame/fragmented-text-then-binary", (parts[0], f.frame(req, BINARY)))
    yield Case("frame/fragment-empty-final", (f.frame(req, TEXT, fin=False), f.frame(b"", CONT)))
    yield Case("frame/fragments-all-empty",
               (f.frame(b"", TEXT, fin=False), f.frame(b"", CONT, fin=False), f.frame(b"", CONT)))
    yield Case("frame/continuation-first", (f.frame(req, CONT),))
    yield Case("frame/continuation-after-message", (f.text(req), f.frame(b"x", CONT)))
    yield Case("frame/two-messages-one-write", (f.text(req) + f.text(request("x/y", rid=2)),))
    yield Case("frame/byte-by-byte", tuple(bytes([b]) for b in f.text(req)))
    for size in (0, 1, 125):
        yield Case(f"frame/ping-{size}", (f.frame(b"p" * size, PING),))
    yield Case("frame/ping-126", (f.frame(b"p" * 126, PING),))
    yield Case("frame/ping-unfinished", (f.frame(b"p", PING, fin=False),))
    yield Case("frame/ping-wide-length", (f.frame(b"pp", PING, wide=126),))
    yield Case("frame/pong-unsolicited", (f.frame(b"hello", PONG),))
    yield Case("frame/many-pings", tuple(f.frame(str(i).encode(), PING) for i in range(50)))
    for code in (1000, 1001, 1002, 1003, 1007, 1008, 1009, 1011, 1012, 3000, 4000, 4999):
        yield Case(f"frame/close-{code}", (f.frame(close_payload(code, b"bye"), CLOSE),),
                   probe=False)
    for code in (0, 999, 1004, 1005, 1006, 1015, 1016, 2999, 5000, 65535):
        yield Case(f"frame/close-bad-code-{code}", (f.frame(close_payload(code), CLOSE),),
                   probe=False)
    yield Case("frame/close-empty", (f.frame(b"", CLOSE),), probe=False)
    yield Case("frame/close-one-byte", (f.frame(b"\x03", CLOSE),), probe=False)
    yield Case("frame/close-bad-utf8-reason",
               (f.frame(close_payload(1000, b"\xff\xfe"), CLOSE),), probe=False)
    yield Case("frame/close-reason-123", (f.frame(close_payload(1000, b"r" * 123), CLOSE),),
               probe=False)
    yield Case("frame/close-then-data",
               (f.frame(close_payload(1000), CLOSE) + f.text(req),), probe=False)
    for bad, label in ((b"\xff", "ff"), (b"\xc0\xaf", "overlong"), (b"\xed\xa0\x80", "surrogate"),
                       (b"\xe2\x82", "truncated"), (b"\x80", "lone-continuation"),
                       (b"\xf4\x90\x80\x80", "above-max")):
        method = b'{"id":1,"method":"fs/getMetadata","params":{"path":"file:///' + bad + b'"}}'
        yield Case(f"utf8/text-{label}", (f.text(method),))
        yield Case(f"utf8/binary-{label}", (f.frame(method, BINARY),))
    euro = "€".encode()
    split = b'{"id":1,"method":"x/' + euro[:1], euro[1:] + b'"}'
    yield Case("utf8/split-across-fragments",
               (f.frame(split[0], TEXT, fin=False), f.frame(split[1], CONT)))
    yield Case("utf8/invalid-in-first-fragment",
               (f.frame(b'{"id":1,"method":"\xff', TEXT, fin=False), f.frame(b'"}', CONT)))
    for rsv in (1, 2, 4, 7):
        yield Case(f"frame/rsv-{rsv}", (f.frame(req, TEXT, rsv=rsv),))
    for opcode in (3, 4, 5, 6, 7, 11, 12, 13, 14, 15):
        yield Case(f"frame/opcode-{opcode}", (f.frame(req, opcode),))
    yield Case("frame/unmasked-text", (f.frame(req, TEXT, masked=False),))
    yield Case("frame/unmasked-ping", (f.frame(b"x", PING, masked=False),))
    yield Case("frame/non-minimal-length-126", (f.frame(req, TEXT, wide=126),))
    yield Case("frame/non-minimal-length-127", (f.frame(req, TEXT, wide=127),))
    yield Case("frame/length-msb-set", (f.frame(b"x", TEXT, length=1 << 63, wide=127),))
    for exp in (62, 40, 31):
        yield Case(f"frame/declared-2^{exp}-sent-10", (f.frame(b"x" * 10, TEXT, length=1 << exp),))
    yield Case("frame/declared-300MiB-sent-1KiB",
               (f.frame(b"x" * 1024, TEXT, length=300 << 20),))
    yield Case("frame/declared-longer-then-eof", (f.frame(req, TEXT, length=len(req) + 5),),
               probe=False)


def size_cases(f: Framer) -> Iterator[Case]:
    """Messages past upstream's limits (tungstenite: 16 MiB a frame, 64 MiB a
    message), well within ours (1 GiB)."""
    def padded(size: int) -> bytes:
        head = b'{"id":1,"method":"fs/getMetadata","params":{"path":"file:///","pad":"'
        return head + b"x" * (size - len(head) - 3) + b'"}}'

    yield Case("size/frame-20MiB", (f.text(padded(20 << 20)),))
    big = padded(70 << 20)
    yield Case("size/message-70MiB-in-1MiB-fragments",
               tuple(f.frame(big[i : i + (1 << 20)], TEXT if i == 0 else CONT,
                             fin=i + (1 << 20) >= len(big))
                     for i in range(0, len(big), 1 << 20)))


BAD_JSON: tuple[tuple[str, bytes], ...] = (
    ("array-empty", b"[]"),
    ("batch-one", b"[" + request("fs/getMetadata", {"path": "file:///"}) + b"]"),
    ("batch-two", b"[" + request("x/a") + b"," + request("x/b", rid=2) + b"]"),
    ("nested-array", b"[[[[]]]]"),
    ("deep-array-100k", b"[" * 100_000 + b"]" * 100_000),
    ("deep-object-100k", b'{"a":' * 100_000 + b"1" + b"}" * 100_000),
    ("deep-unclosed-100k", b"[" * 100_000),
    ("deep-params-1k", b'{"id":1,"method":"fs/getMetadata","params":'
     + b'{"a":' * 1000 + b"1" + b"}" * 1000 + b"}"),
    ("deep-params-100k", b'{"id":1,"method":"fs/getMetadata","params":'
     + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    ("null", b"null"), ("true", b"true"), ("number", b"1"), ("string", b'"x"'),
    ("empty-object", b"{}"),
    ("whitespace", b"  \n\t "),
    ("nul", b"\x00"),
    ("nul-inside-string", b'{"id":1,"method":"fs/getMetadata\x00","params":{}}'),
    ("escaped-nul-in-path",
     b'{"id":1,"method":"fs/getMetadata","params":{"path":"file:///a\\u0000b"}}'),
    ("bom", b"\xef\xbb\xbf" + request("fs/getMetadata", {"path": "file:///"})),
    ("trailing-garbage", request("fs/getMetadata", {"path": "file:///"}) + b"x"),
    ("trailing-whitespace", request("fs/getMetadata", {"path": "file:///"}) + b" \n"),
    ("two-values", request("fs/getMetadata", {"path": "file:///"}) + request("x/y", rid=2)),
    ("duplicate-id", b'{"id":1,"id":2,"method":"fs/getMetadata","params":{"path":"file:///"}}'),
    ("duplicate-method", b'{"id":1,"method":"x/y","method":"fs/getMetadata",'
     b'"params":{"path":"file:///"}}'),
    ("duplicate-params", b'{"id":1,"method":"fs/getMetadata","params":{"path":1},'
     b'"params":{"path":"file:///"}}'),
    ("lone-surrogate-method", b'{"id":1,"method":"x\\ud800","params":{}}'),
    ("lone-surrogate-path", b'{"id":1,"method":"fs/getMetadata","params":{"path":"file:///\\ud800"}}'),
    ("lone-low-surrogate", b'{"id":1,"method":"fs/getMetadata","params":{"path":"file:///\\udc00"}}'),
    ("surrogate-pair-ok", b'{"id":1,"method":"fs/getMetadata",'
     b'"params":{"path":"file:///\\ud83d\\ude00"}}'),
    ("lone-surrogate-id", b'{"id":"\\ud800","method":"x/y"}'),
    ("bad-escape", b'{"id":1,"method":"x\\q"}'),
    ("huge-number-param", b'{"id":1,"method":"fs/readFile","params":{"path":"file:///","maxBytes":'
     + b"9" * 400 + b"}}"),
    ("float-exp-param", b'{"id":1,"method":"process/read","params":{"processId":"p",'
     b'"maxBytes":1e400}}'),
    ("negative-param", b'{"id":1,"method":"process/read","params":{"processId":"p",'
     b'"maxBytes":-1}}'),
    ("jsonrpc-member", b'{"jsonrpc":"2.0","id":1,"method":"fs/getMetadata",'
     b'"params":{"path":"file:///"}}'),
    ("trace-member", b'{"id":1,"method":"fs/getMetadata","params":{"path":"file:///"},"trace":1}'),
    ("no-method", b'{"id":1}'),
    ("method-number", b'{"id":1,"method":1}'),
    ("method-null", b'{"id":1,"method":null}'),
    ("method-empty", b'{"id":1,"method":""}'),
    ("method-unknown", b'{"id":1,"method":"no/such"}'),
    ("params-only", b'{"params":{}}'),
    ("notification-unknown", b'{"method":"no/such"}'),
    ("notification-known-method", b'{"method":"fs/getMetadata","params":{"path":"file:///"}}'),
    ("initialized-again", INITIALIZED),
    ("initialize-again", INIT),
    ("response-from-client", b'{"id":1,"result":{}}'),
    ("error-from-client", b'{"id":1,"error":{"code":1,"message":"x"}}'),
    ("error-bad-shape", b'{"id":1,"error":1}'),
    ("result-and-method", b'{"id":1,"result":{},"method":"fs/getMetadata",'
     b'"params":{"path":"file:///"}}'),
)

IDS: tuple[tuple[str, bytes], ...] = (
    ("int", b"7"), ("zero", b"0"), ("negative", b"-5"), ("minus-one", b"-1"),
    ("i64-max", b"9223372036854775807"), ("i64-min", b"-9223372036854775808"),
    ("u64-max", b"18446744073709551615"), ("over-u64", b"18446744073709551616"),
    ("huge", b"9" * 400), ("float", b"1.5"), ("float-int", b"2.0"), ("exp", b"1e3"),
    ("string", b'"s"'), ("empty-string", b'""'), ("null", b"null"), ("true", b"true"),
    ("array", b"[1]"), ("object", b'{"a":1}'),
)

PARAMS: tuple[tuple[str, object], ...] = (
    ("array", []), ("string", "x"), ("number", 1), ("bool", True), ("empty-object", {}),
    ("wrong-types", {"processId": 1, "path": 1, "argv": "x", "cwd": 1, "chunk": 1,
                     "handleId": [], "url": 1, "method": 1, "maxBytes": "x"}),
    ("relative-path", {"path": "relative/x", "processId": "fuzz-none"}),
)


def json_cases(f: Framer) -> Iterator[Case]:
    for name, body in BAD_JSON:
        yield Case(f"json/{name}", (f.text(body),))
        if name in ("nul", "array-empty", "deep-unclosed-100k"):
            yield Case(f"json/{name}-binary", (f.frame(body, BINARY),))
    yield Case("json/initialized-before-initialize", (f.text(INITIALIZED),), init=False)
    yield Case("json/request-before-initialize",
               (f.text(request("fs/getMetadata", {"path": "file:///"})),), init=False)
    for name, rid in IDS:
        yield Case(f"id/{name}", (f.text(b'{"id":' + rid + b',"method":"fs/getMetadata",'
                                         b'"params":{"path":"file:///"}}'),))
        yield Case(f"id/{name}-unknown-method", (f.text(b'{"id":' + rid + b',"method":"n/a"}'),))
    for method in METHODS:
        init = method != "initialize"
        yield Case(f"params/{method}/absent", (f.text(request(method, omit=True)),), init=init)
        yield Case(f"params/{method}/null", (f.text(request(method, None)),), init=init)
        for name, params in PARAMS:
            yield Case(f"params/{method}/{name}", (f.text(request(method, params)),), init=init)


SEEDS: tuple[bytes, ...] = (
    request("fs/getMetadata", {"path": "file:///"}),
    request("fs/readFile", {"path": "file:///nonexistent-fuzz"}, "r"),
    request("process/read", {"processId": "none", "afterSeq": 0, "maxBytes": 10, "waitMs": 0}),
    request("process/write", {"processId": "none", "chunk": "aGkK", "writeId": "w"}),
    b'{"id":1,"method":"fs/walk","params":{"path":"file:///nonexistent-fuzz","maxDepth":1}}',
)


_INSERTS = b'{}[]",:\\0-9e.\x00\xff\x80 '


def mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(5)
        i = rng.randrange(len(b) + 1) if b else 0
        if op == 0 and b:  # flip bits of a byte
            b[min(i, len(b) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1:  # insert a random byte (any value, JSON structure or not)
            b[i:i] = bytes([rng.choice(_INSERTS + bytes([rng.randrange(256)]))])
        elif op == 2 and b:  # delete a slice
            del b[i : i + rng.randint(1, 8)]
        elif op == 3 and b:  # duplicate a slice
            j = rng.randrange(len(b))
            b[i:i] = b[j : j + rng.randint(1, 16)]
        else:  # truncate
            del b[i:]
    return bytes(b)


def random_cases(f: Framer, rng: random.Random, count: int) -> Iterator[Case]:
    for k in range(count):
        data = mutate(rng, rng.choice(SEEDS))
        opcode = rng.choice((TEXT, TEXT, BINARY))
        if len(data) > 1 and rng.random() < 0.3:
            chunks = tuple(f.fragments(data, rng.randint(2, min(5, len(data))), opcode))
        else:
            chunks = (f.frame(data, opcode),)
        if rng.random() < 0.1:  # a control frame slipped in after the first
            chunks = (chunks[0], f.frame(rng.randbytes(rng.randint(0, 20)), PING), *chunks[1:])
        yield Case(f"random/{k:03d}", chunks)


# --------------------------------------------------------------------------- running


@dataclasses.dataclass
class Outcome:
    replies: list[str]
    end: str  # "open", "close <code> <reason>", "eof (no close frame)", "quiet"
    messages: dict[str, str] = dataclasses.field(default_factory=dict)

    def signature(self) -> tuple[tuple[str, ...], tuple[str, ...], str]:
        """What is compared: the replies in order, the pongs (a server may answer a
        ping between a message's fragments before or after that message's reply),
        the end (a close frame's code, not its reason text)."""
        end = self.end if not self.end.startswith("close") else " ".join(self.end.split()[:2])
        replies = tuple(r for r in self.replies if not r.startswith("pong"))
        pongs = tuple(sorted(r for r in self.replies if r.startswith("pong")))
        return replies, pongs, end

    def ended(self) -> bool:
        return self.end != "open"

    def __str__(self) -> str:
        return f"[{', '.join(self.replies)}] {self.end}"


class _Eof(Exception):
    pass


async def _read_exactly(reader: asyncio.StreamReader, n: int) -> bytes:
    try:
        return await reader.readexactly(n)
    except (asyncio.IncompleteReadError, ConnectionError) as exc:
        raise _Eof from exc


async def _read_message(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One server message (fragments joined; control frames returned as they come)."""
    opcode0, data = None, bytearray()
    while True:
        b0, b1 = await _read_exactly(reader, 2)
        n = b1 & 0x7F
        if n == 126:
            n = int.from_bytes(await _read_exactly(reader, 2), "big")
        elif n == 127:
            n = int.from_bytes(await _read_exactly(reader, 8), "big")
        if b1 & 0x80:
            await _read_exactly(reader, 4)  # a server must not mask; read past it anyway
        payload = await _read_exactly(reader, n)
        opcode = b0 & 0x0F
        if opcode >= 8:
            return opcode, payload
        if opcode0 is None:
            opcode0 = opcode
        data += payload
        if b0 & 0x80:
            return opcode0, bytes(data)


def _describe(msg: dict[str, object]) -> tuple[str, str | None]:
    rid = json.dumps(msg.get("id"))
    if "error" in msg and isinstance(msg["error"], dict):
        return f"{rid}:{msg['error'].get('code')}", str(msg["error"].get("message"))
    if "result" in msg:
        return f"{rid}:ok", None
    return f"notification {msg.get('method')}", None


async def run_case(url: str, case: Case, wait: float) -> Outcome:
    host, port = url.removeprefix("ws://").rstrip("/").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port), limit=1 << 26)
    out = Outcome([], "quiet")
    try:
        writer.write(UPGRADE)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        if not head.startswith(b"HTTP/1.1 101"):
            return Outcome([], f"upgrade refused: {head.splitlines()[0]!r}")
        setup = Framer(random.Random(0))
        if case.init:
            writer.write(setup.text(INIT) + setup.text(INITIALIZED))
            opcode, data = await asyncio.wait_for(_read_message(reader), 10)
            if opcode != TEXT or "result" not in json.loads(data):
                return Outcome([], f"initialize failed: {data[:200]!r}")
        for chunk in case.chunks:
            writer.write(chunk)
            with contextlib.suppress(ConnectionError):
                await writer.drain()
        if case.probe:
            writer.write(setup.text(PROBE))
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        async with asyncio.timeout(wait):
            while True:
                opcode, data = await _read_message(reader)
                if opcode == CLOSE:
                    code = int.from_bytes(data[:2], "big") if len(data) >= 2 else None
                    out.end = f"close {code} {data[2:].decode(errors='replace')!r}"
                    return out
                if opcode == PONG:
                    out.replies.append(f"pong {len(data)}")
                    continue
                if opcode == PING:
                    continue
                try:
                    msg = json.loads(data)
                except ValueError:
                    out.replies.append(f"unparsable {data[:40]!r}")
                    continue
                if msg.get("id") == PROBE_ID and ("result" in msg or "error" in msg):
                    out.end = "open"
                    return out
                label, text = _describe(msg)
                out.replies.append(label)
                if text is not None:
                    out.messages[label] = text
    except TimeoutError:
        out.end = "quiet"
    except _Eof:
        out.end = "eof (no close frame)"
    except ConnectionError as exc:
        out.end = f"eof ({type(exc).__name__}, no close frame)"
    finally:
        writer.transport.abort()
    return out


def preview(case: Case, limit: int = 160) -> str:
    """The case's frames as ``opcode:payload`` (unmasked), cut to ``limit`` characters."""
    data, i, parts = b"".join(case.chunks), 0, []
    while i + 2 <= len(data):
        b0, b1 = data[i], data[i + 1]
        n, i = b1 & 0x7F, i + 2
        if n >= 126:
            width = 2 if n == 126 else 8
            n, i = int.from_bytes(data[i : i + width], "big"), i + width
        key = data[i : i + 4] if b1 & 0x80 else b"\0\0\0\0"
        i += 4 if b1 & 0x80 else 0
        payload = bytes(b ^ key[k % 4] for k, b in enumerate(data[i : i + min(n, limit)]))
        fin = "" if b0 & 0x80 else "(more)"
        more = f"+{n - len(payload)}" if n > len(payload) else ""
        parts.append(f"{b0 & 0x0F}{fin}:{payload!r}{more}")
        i += n
    text = " ".join(parts)
    return text if len(text) <= limit else text[:limit] + "..."


def classify(ours: Outcome, up: Outcome) -> str:
    if ours.signature() == up.signature():
        return "same"
    if ours.ended() and not up.ended():
        return "OURS-DROPS"
    if ours.end.startswith("eof") and up.end != "quiet":
        return "OURS-SILENT"
    if up.ended() and not ours.ended():
        return "UP-DROPS"
    if (ours.signature()[:2] == up.signature()[:2] and ours.end.startswith("close")
            and up.end.startswith("eof")):
        return "UP-SILENT"
    return "DIFFERENT"


async def fuzz(targets: list[ServerTarget], cases: list[Case], wait: float, parallel: int,
               load_mib: int = 0) -> dict[str, dict[str, Outcome]]:
    """Every case against every server; ``parallel`` connections at a time per server
    (1: one case after the other), beside a connection sending ``load_mib`` MiB
    requests throughout (0: none)."""
    results: dict[str, dict[str, Outcome]] = {c.name: {} for c in cases}
    async with contextlib.AsyncExitStack() as stack:
        servers: list[RunningServer] = []
        for t in targets:
            server, _ = await start_in_temp_dir(stack, t, f"fuzz-{t.name}-")
            servers.append(server)
        slots = {s.target.name: asyncio.Semaphore(parallel) for s in servers}
        stop = asyncio.Event()
        loaders = [asyncio.create_task(load(s, load_mib, stop)) for s in servers if load_mib]

        async def one(case: Case, server: RunningServer) -> None:
            async with slots[server.target.name]:
                results[case.name][server.target.name] = await run_case(server.url, case, wait)

        if parallel == 1:
            for case in cases:
                for server in servers:
                    await one(case, server)
        else:
            await asyncio.gather(*(one(c, s) for c in cases for s in servers))
        stop.set()
        for line in await asyncio.gather(*loaders):
            print(line)
    return results


async def load(server: RunningServer, mib: int, stop: asyncio.Event) -> str:
    """Keep one more connection busy with ``mib`` MiB requests (in 1 MiB fragments,
    within upstream's frame limit) until ``stop``; what it saw, as one line."""
    pad = b"x" * (mib << 20)
    sent = answered = 0
    framer = Framer(random.Random(0))
    try:
        reader, writer = await asyncio.open_connection(
            *server.url.removeprefix("ws://").rstrip("/").rsplit(":", 1), limit=1 << 26)
        writer.write(UPGRADE)
        await reader.readuntil(b"\r\n\r\n")
        writer.write(framer.text(INIT) + framer.text(INITIALIZED))
        await _read_message(reader)
        while not stop.is_set():
            body = request("fs/getMetadata", {"path": "file:///", "pad": ""}, sent)
            body = body[:-3] + pad + body[-3:]
            for i in range(0, len(body), 1 << 20):
                writer.write(framer.frame(body[i : i + (1 << 20)], TEXT if i == 0 else CONT,
                                          fin=i + (1 << 20) >= len(body)))
                await writer.drain()
            sent += 1
            opcode, data = await _read_message(reader)
            answered += opcode == TEXT and b'"result"' in data
        writer.transport.abort()
        end = "kept"
    except (_Eof, ConnectionError) as exc:
        end = f"dropped ({type(exc).__name__})"
    return (f"load on {server.target.name}: {sent} requests of {mib} MiB sent, "
            f"{answered} answered, connection {end}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=1, help="random generator seed (default 1)")
    ap.add_argument("--random", type=int, default=200, metavar="N",
                    help="random mutations of valid messages (default 200)")
    ap.add_argument("--no-upstream", action="store_true", help="our server only")
    ap.add_argument("--only", metavar="SUBSTRING", help="cases whose name contains this")
    ap.add_argument("--wait", type=float, default=1.0, metavar="S",
                    help="a connection quiet this long ends its case as 'quiet' (default 1)")
    ap.add_argument("--parallel", type=int, default=1, metavar="N",
                    help="cases run at once per server (default 1); a load run: the "
                    "outcomes must not change")
    ap.add_argument("--load", type=int, default=0, metavar="MIB",
                    help="meanwhile, one more connection per server sends MIB-MiB requests "
                    "back to back (default 0: none); the outcomes must not change")
    ap.add_argument("--show", choices=("diff", "all"), default="diff",
                    help="print only the differences (default: not same, not UP-SILENT) "
                    "or every case")
    ap.add_argument("--json", metavar="FILE", help="also write every outcome as JSON")
    args = ap.parse_args(argv)

    rng = random.Random(args.seed)
    framer = Framer(rng)
    cases = [*frame_cases(framer), *size_cases(framer), *json_cases(framer),
             *random_cases(framer, rng, args.random)]
    if args.only:
        cases = [c for c in cases if args.only in c.name]
    targets = [ours_target()]
    up = None if args.no_upstream else upstream_target()
    if up is not None:
        targets.append(up)
    t0 = time.perf_counter()
    results = asyncio.run(fuzz(targets, cases, args.wait, args.parallel, args.load))
    elapsed = time.perf_counter() - t0

    verdicts: dict[str, str] = {}
    for case in cases:
        r = results[case.name]
        verdict = classify(r[OURS], r[UPSTREAM]) if UPSTREAM in r else (
            "OURS-SILENT" if r[OURS].end.startswith("eof") else "alone")
        verdicts[case.name] = verdict
        if args.show == "all" or verdict not in ("same", "UP-SILENT", "alone"):
            print(f"{verdict:11} {case.name}  sent {preview(case)}")
            for server, outcome in r.items():
                print(f"    {server:8} {outcome}")
                for label, text in outcome.messages.items():
                    if verdict != "same":
                        print(f"             {label}: {text[:160]}")
    counts: dict[str, int] = {}
    for v in verdicts.values():
        counts[v] = counts.get(v, 0) + 1
    print(f"{len(cases)} cases, seed {args.seed}, {elapsed:.1f} s, servers "
          f"{', '.join(t.name for t in targets)}: "
          + ", ".join(f"{k} {n}" for k, n in sorted(counts.items())))
    if args.json:
        by_name = {c.name: c for c in cases}
        write_json(args.json, {
            "seed": args.seed,
            "cases": {name: {"verdict": verdicts[name], "sent": preview(by_name[name]),
                             **{s: dataclasses.asdict(o) for s, o in results[name].items()}}
                      for name in results},
        })
    return 1 if counts.get("OURS-DROPS") or counts.get("OURS-SILENT") else 0


if __name__ == "__main__":
    sys.exit(main())
