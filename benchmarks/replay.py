"""Replay a recorded Codex session (``*.rpc.jsonl``) against a running exec-server.

The recordings (``tests/compat/codex-0.163-recordings``, and the spec's copy, which
also holds ``mcp.rpc.jsonl``) are what Codex CLI 0.163 sent to upstream's server
and what it got back. :func:`replay` sends the client's side in the recorded order
over one WebSocket connection, pipelining where Codex pipelined and, before each
frame, waiting for everything Codex had received before it (the replies by id, the
``process/closed`` of each process, the last body piece of each streamed
``http/request``). The scenario's paths are rewritten to a fresh directory
(:func:`prepare_root`), and the MCP recording's HTTP servers to a local
:class:`FakeHttp`.

Used by ``bench_replay.py``; the replay test in ``tests/compat`` follows the same
order rules.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection

JSON = Any  # raw JSON values: this module replays wire messages as recorded

#: The repository's copy of the recordings (shared/spec's copy adds ``mcp.rpc.jsonl``).
RECORDINGS = Path(__file__).resolve().parents[1] / "tests" / "compat" / "codex-0.163-recordings"
PLACEHOLDER_ROOT = "/srv/data/harness/final"
_HTTP_URL = re.compile(r"http://127\.0\.0\.1:(\d+)")


def recordings(directories: list[Path]) -> list[Path]:
    """Every ``*.rpc.jsonl`` in ``directories``; a name found twice is taken once (first)."""
    found: dict[str, Path] = {}
    for d in directories:
        for path in sorted(d.glob("*.rpc.jsonl")):
            found.setdefault(path.name, path)
    return sorted(found.values(), key=lambda p: p.name)


def _rewrite(value: JSON, subs: list[tuple[str, str]]) -> JSON:
    """Apply ``subs`` to every string, including text inside base64 payloads."""
    if isinstance(value, str):
        for old, new in subs:
            value = value.replace(old, new)
        return value
    if isinstance(value, list):
        return [_rewrite(v, subs) for v in value]
    if isinstance(value, dict):
        out: dict[str, JSON] = {}
        for key, item in value.items():
            if key in ("chunk", "dataBase64", "bodyBase64") and isinstance(item, str):
                try:
                    text = base64.b64decode(item).decode()
                except UnicodeDecodeError:
                    out[key] = item
                    continue
                out[key] = base64.b64encode(_rewrite(text, subs).encode()).decode()
            else:
                out[key] = _rewrite(item, subs)
        return out
    return value


@dataclasses.dataclass(frozen=True)
class Recording:
    """One recorded session: its frames in order, ``dir`` ``c2s`` or ``s2c``."""

    name: str
    path: Path
    frames: tuple[tuple[str, JSON], ...]

    @classmethod
    def load(cls, path: Path, root: Path, http_origin: str | None = None) -> Recording:
        """Read ``path`` with the scenario's directory rewritten to ``root`` and, when
        given, every ``http://127.0.0.1:PORT`` to ``http_origin``."""
        name = path.name.removesuffix(".rpc.jsonl")
        subs = [(f"{PLACEHOLDER_ROOT}/{name}", str(root))]
        frames = []
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if "dir" not in record:
                continue
            msg = _rewrite(record["msg"], subs)
            if http_origin is not None and record["dir"] == "c2s":
                msg = _rewrite_http(msg, http_origin)
            frames.append((record["dir"], msg))
        return cls(name, path, tuple(frames))

    def s2c(self) -> Iterator[JSON]:
        return (msg for d, msg in self.frames if d == "s2c")

    def requests(self) -> dict[JSON, str]:
        """Request id -> method, of what the client sent."""
        return {m["id"]: m["method"] for d, m in self.frames if d == "c2s" and "id" in m}

    def uses_http(self) -> bool:
        return any(m.get("method") == "http/request" for d, m in self.frames if d == "c2s")


def _rewrite_http(msg: JSON, origin: str) -> JSON:
    if msg.get("method") != "http/request":
        return msg
    params = dict(msg["params"])
    params["url"] = _HTTP_URL.sub(origin, params["url"])
    return {**msg, "params": params}


def prepare_root(root: Path, name: str, source: Path) -> None:
    """Lay out the scenario directory ``root`` as the recording ``name`` found it: a
    ``workspace`` with the files Codex read or patched, the image and skill it read
    (their bytes taken from the recording at ``source``)."""
    workspace = root / "workspace"
    workspace.mkdir(parents=True)
    (workspace / "edit_me.txt").write_text("alpha\nbeta\ngamma\n")
    (workspace / "delete_me.txt").write_text("bye\n")
    (root / "exec_server_home").mkdir()
    if name == "view_image":
        for data in _read_results(source):
            (workspace / "pixel.png").write_bytes(data)
    elif name == "skills":
        (workspace / ".git").mkdir()
        skill = workspace / ".agents" / "skills" / "pa-demo"
        skill.mkdir(parents=True)
        for data in _read_results(source):
            (skill / "SKILL.md").write_bytes(data)


def _read_results(path: Path) -> Iterator[bytes]:
    for line in path.read_text().splitlines():
        result = json.loads(line).get("msg", {}).get("result", {})
        if isinstance(result, dict) and "dataBase64" in result:
            yield base64.b64decode(result["dataBase64"])


# --------------------------------------------------------------------------- replay


class ReplayError(Exception):
    """The server did not send what the client waited for, or dropped the connection."""


class _Peer:
    """Everything the server sent, with a condition to wait on."""

    def __init__(self) -> None:
        self.responses: dict[JSON, JSON] = {}
        self.closed: set[str] = set()
        self.bodies_done: set[str] = set()
        self.notifications = 0
        self.changed = asyncio.Condition()
        self.lost: BaseException | None = None

    async def pump(self, ws: ClientConnection) -> None:
        try:
            async for raw in ws:
                msg = json.loads(raw)
                async with self.changed:
                    self._note(msg)
                    self.changed.notify_all()
        except Exception as exc:  # any end of the stream ends the replay
            self.lost = exc
        async with self.changed:
            self.lost = self.lost or ReplayError("the server closed the connection")
            self.changed.notify_all()

    def _note(self, msg: JSON) -> None:
        if "id" in msg and ("result" in msg or "error" in msg):
            self.responses[msg["id"]] = msg
            return
        self.notifications += 1
        params = msg.get("params") or {}
        if msg.get("method") == "process/closed":
            self.closed.add(params["processId"])
        elif msg.get("method") == "http/request/bodyDelta" and params.get("done"):
            self.bodies_done.add(params["requestId"])


@dataclasses.dataclass(frozen=True)
class _Awaited:
    """What Codex had received at one point of the recording."""

    ids: frozenset[JSON]
    closed: frozenset[str]
    bodies: frozenset[str]

    def met(self, peer: _Peer) -> bool:
        return (self.ids <= peer.responses.keys() and self.closed <= peer.closed
                and self.bodies <= peer.bodies_done)

    def missing(self, peer: _Peer) -> str:
        return (f"replies {sorted(self.ids - peer.responses.keys(), key=str)}, "
                f"closed {sorted(self.closed - peer.closed)}, "
                f"bodies {sorted(self.bodies - peer.bodies_done)}")


def _schedule(rec: Recording) -> tuple[list[tuple[_Awaited, JSON]], _Awaited]:
    """Each client frame with what must have arrived before it is sent; the final wait."""
    ids: set[JSON] = set()
    closed: set[str] = set()
    bodies: set[str] = set()
    out = []

    def now() -> _Awaited:
        return _Awaited(frozenset(ids), frozenset(closed), frozenset(bodies))

    for direction, msg in rec.frames:
        if direction == "c2s":
            out.append((now(), msg))
            continue
        params = msg.get("params") or {}
        if "id" in msg:
            ids.add(msg["id"])
        elif msg.get("method") == "process/closed":
            closed.add(params["processId"])
        elif msg.get("method") == "http/request/bodyDelta" and params.get("done"):
            bodies.add(params["requestId"])
    return out, now()


@dataclasses.dataclass(frozen=True)
class ReplayResult:
    """One finished replay: what was exchanged, how the replies compare with the recording's."""

    name: str
    requests: int
    notifications: int
    #: request ids whose reply kind (result / error code) differs from the recording
    differences: tuple[str, ...]


async def replay(ws: ClientConnection, rec: Recording, *, limit_s: float = 30.0) -> ReplayResult:
    """Replay ``rec`` on the open connection ``ws``, returning once the last awaited
    reply arrived. Raises :class:`ReplayError` when a wait exceeds ``limit_s`` or the
    connection ends first."""
    schedule, final = _schedule(rec)
    peer = _Peer()
    pump = asyncio.create_task(peer.pump(ws))
    try:
        for awaited, msg in schedule:
            await _wait(peer, awaited, limit_s, f"before sending {msg.get('method')}")
            await ws.send(json.dumps(msg))
        await _wait(peer, final, limit_s, "at the end")
    finally:
        pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pump
    return ReplayResult(rec.name, len(rec.requests()), peer.notifications,
                        tuple(_differences(rec, peer)))


async def _wait(peer: _Peer, awaited: _Awaited, limit_s: float, where: str) -> None:
    async with peer.changed:
        try:
            async with asyncio.timeout(limit_s):
                await peer.changed.wait_for(lambda: awaited.met(peer) or peer.lost is not None)
        except TimeoutError:
            raise ReplayError(f"timed out {where}: missing {awaited.missing(peer)}") from None
        if not awaited.met(peer):
            raise ReplayError(f"connection lost {where} ({peer.lost!r}): "
                              f"missing {awaited.missing(peer)}")


def _kind(msg: JSON) -> str:
    return f"error {msg['error'].get('code')}" if "error" in msg else "result"


def _differences(rec: Recording, peer: _Peer) -> Iterator[str]:
    methods = rec.requests()
    for msg in rec.s2c():
        if "id" not in msg:
            continue
        got = peer.responses.get(msg["id"])
        if got is not None and _kind(got) != _kind(msg):
            yield f"{methods.get(msg['id'])} #{msg['id']}: {_kind(got)}, recorded {_kind(msg)}"


# --------------------------------------------------------------------------- fake HTTP


class FakeHttp:
    """The MCP recording's Streamable-HTTP servers, answered locally and at once:
    a POST carrying a JSON-RPC id gets a 200 JSON result, a notification 202, GET
    405 (no server-sent stream), anything else 200 with an empty body."""

    def __init__(self) -> None:
        self._server: asyncio.Server | None = None
        self.requests = 0

    @property
    def origin(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aenter__(self) -> FakeHttp:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method = lines[0].split(" ", 1)[0]
                headers = {k.strip().lower(): v.strip()
                           for k, _, v in (line.partition(":") for line in lines[1:] if line)}
                body = await _read_body(reader, headers)
                self.requests += 1
                status, payload = _answer(method, body)
                writer.write(
                    f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
                    f"content-type: application/json\r\ncontent-length: {len(payload)}\r\n"
                    "\r\n".encode() + payload
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if headers.get("transfer-encoding", "").lower() != "chunked":
        return await reader.readexactly(int(headers.get("content-length", "0")))
    body = b""
    while size := int((await reader.readline()).split(b";")[0].strip(), 16):
        body += await reader.readexactly(size)
        await reader.readline()
    await reader.readline()
    return body


_REASONS = {200: "OK", 202: "Accepted", 400: "Bad Request", 405: "Method Not Allowed"}


def _answer(method: str, body: bytes) -> tuple[int, bytes]:
    if method == "GET":
        return 405, b""
    if method != "POST":
        return 200, b""
    try:
        request = json.loads(body)
    except ValueError:
        return 400, b""
    if not isinstance(request, dict) or "id" not in request:
        return 202, b""
    result: JSON = {"tools": []} if request.get("method") == "tools/list" else {
        "protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
        "serverInfo": {"name": "replay-fake", "version": "1"},
    }
    return 200, json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result}).encode()
