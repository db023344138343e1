"""Shared benchmark harness: start servers, talk raw JSON-RPC over WebSocket, print tables.

Used by ``bench_exec.py`` (processes), ``bench_fs.py`` and ``bench_sandbox.py``. It
deliberately does *not* use ``exec_server.client``: the figures compare servers, so
the client side is one small, identical raw client for ours and upstream's.

Typical use::

    async def bench_one(server: RunningServer, quickack: bool) -> dict[str, Summary]:
        async with await RawClient.connect(server.url, quickack=quickack) as c:
            await c.handshake()
            ...

    targets = available_targets()            # ours, plus upstream codex when installed
    report = Report("exec", targets)
    for t in targets:
        async with start_server(t) as srv:
            report.add_all(t.name, await bench_one(srv, quickack=True))
    report.print()

Upstream's exec-server speaks only ``file://`` URIs (CLIENT_COMPAT.md §1.3), ours
accepts both, so every path goes through ``RawClient.path()`` (URI form by default).
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
import re
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any

import msgspec
import websockets
from websockets.asyncio.client import ClientConnection

__all__ = [
    "MIB",
    "OURS",
    "UPSTREAM",
    "ProcState",
    "RawClient",
    "Report",
    "RpcError",
    "RunningServer",
    "ServerTarget",
    "Summary",
    "alt_targets",
    "available_targets",
    "connect_client",
    "default_env",
    "fs_parser",
    "ours_target",
    "publish",
    "ratio_interval",
    "rss_kib",
    "start_in_temp_dir",
    "start_server",
    "summarize",
    "target_met",
    "temp_dir",
    "upstream_codex_path",
    "upstream_target",
    "vm_hwm_kib",
    "write_json",
    "ws_connect",
]

MIB = 1024 * 1024
OURS = "ours"
UPSTREAM = "upstream"
_URL_RE = re.compile(rb"(wss?://[^\s\"']+)")
_TCP_QUICKACK = getattr(socket, "TCP_QUICKACK", 12)

JSON = Any  # raw JSON values: this module is a wire-level test client by design


# --------------------------------------------------------------------------- servers


@dataclasses.dataclass(frozen=True)
class ServerTarget:
    """A server implementation to benchmark: a name and the argv that starts it on port 0."""

    name: str
    argv: tuple[str, ...]
    env: dict[str, str] | None = None


def ours_target(*extra_args: str) -> ServerTarget:
    """This project's server, started through the same interpreter."""
    return ServerTarget(
        OURS,
        (sys.executable, "-m", "exec_server", "serve", "--listen", "ws://127.0.0.1:0", *extra_args),
    )


def upstream_codex_path() -> str | None:
    """Path of the upstream ``codex`` binary from ``pip install openai-codex-cli-bin``, if any."""
    try:
        import codex_cli_bin  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        return shutil.which("codex")
    path = os.path.join(os.path.dirname(codex_cli_bin.__file__), "bin", "codex")
    return path if os.access(path, os.X_OK) else None


def upstream_target() -> ServerTarget | None:
    codex = upstream_codex_path()
    if codex is None:
        return None
    return ServerTarget(UPSTREAM, (codex, "exec-server", "--listen", "ws://127.0.0.1:0"))


def available_targets(*, upstream: bool = True) -> list[ServerTarget]:
    """Ours first, then upstream when installed and wanted."""
    out = [ours_target()]
    up = upstream_target() if upstream else None
    if up is not None:
        out.append(up)
    return out


@dataclasses.dataclass
class RunningServer:
    """A started server: its URL and pid (for RSS). Stop with ``aclose()``."""

    target: ServerTarget
    url: str
    proc: asyncio.subprocess.Process
    _drain: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def rss_mib(self) -> float | None:
        kib = rss_kib(self.pid)
        return None if kib is None else kib / 1024

    async def aclose(self) -> None:
        if self.proc.returncode is None:
            for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 3.0)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, sig)
                try:
                    await asyncio.wait_for(self.proc.wait(), grace)
                    break
                except TimeoutError:
                    continue
        if self._drain is not None:
            self._drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._drain


def _stop_on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


# Servers run in sessions of their own, so a SIGTERM to a benchmark (``timeout``, a CI
# job's end) would leave them running: turn it into the interrupt that unwinds
# ``asyncio.run``, whose task cancellation runs ``start_server``'s clean-up.
if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
    signal.signal(signal.SIGTERM, _stop_on_sigterm)


@contextlib.asynccontextmanager
async def start_server(
    target: ServerTarget, *, cwd: str | None = None, limit_s: float = 30.0
) -> AsyncIterator[RunningServer]:
    """Start ``target`` in its own process group, read the ws:// URL it prints, yield it."""
    env = None if target.env is None else {**os.environ, **target.env}
    proc = await asyncio.create_subprocess_exec(
        *target.argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,
        cwd=cwd,
        env=env,
    )
    assert proc.stdout is not None
    stdout = proc.stdout
    server = RunningServer(target, "", proc)
    try:
        async with asyncio.timeout(limit_s):
            while True:
                line = await stdout.readline()
                if not line:
                    raise RuntimeError(f"{target.name} server exited without printing a URL")
                m = _URL_RE.search(line)
                if m:
                    server.url = m.group(1).decode()
                    break

        async def drain() -> None:
            while await stdout.readline():
                pass

        server._drain = asyncio.create_task(drain())
        yield server
    finally:
        await server.aclose()


def temp_dir(
    stack: contextlib.AsyncExitStack, prefix: str, *, parent: str | None = None
) -> str:
    """A fresh directory (real path: sandbox rules see resolved paths), removed when
    ``stack`` closes, i.e. after anything entered on the stack later (a server using it)."""
    path = os.path.realpath(tempfile.mkdtemp(prefix=prefix, dir=parent))
    stack.callback(shutil.rmtree, path, True)
    return path


async def start_in_temp_dir(
    stack: contextlib.AsyncExitStack,
    target: ServerTarget,
    prefix: str,
    *,
    parent: str | None = None,
) -> tuple[RunningServer, str]:
    """Start ``target`` with a fresh :func:`temp_dir` as its cwd; both end with ``stack``."""
    workdir = temp_dir(stack, prefix, parent=parent)
    server = await stack.enter_async_context(start_server(target, cwd=workdir))
    return server, workdir


async def connect_client(
    stack: contextlib.AsyncExitStack, url: str, *, quickack: bool = True
) -> RawClient:
    """A handshaken :class:`RawClient` for ``url``, closed when ``stack`` closes."""
    client = await RawClient.connect(url, quickack=quickack)
    stack.push_async_callback(client.aclose)
    await client.handshake()
    return client


def write_json(path: str, data: JSON) -> None:
    """Write benchmark figures (``--json FILE``); call outside the event loop."""
    with open(path, "w") as f:
        json.dump(data, f, indent=2)


def publish(report: Report, json_path: str | None) -> int:
    """Print ``report``, write it to ``json_path`` when given; the script's exit status."""
    report.print()
    if json_path:
        write_json(json_path, report.as_dict())
    return 0


def fs_parser(doc: str | None, *, dir_help: str) -> argparse.ArgumentParser:
    """The options the filesystem benchmarks share: --quick, --no-upstream, --json, --dir."""
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny iteration counts (smoke test)")
    ap.add_argument("--no-upstream", action="store_true", help="benchmark only our server")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    ap.add_argument("--dir", metavar="DIR", default=None, help=dir_help)
    ap.add_argument("--alt", action="append", default=[], metavar="DIR",
                    help="another build of this server, run with PYTHONPATH=DIR (a directory "
                    "holding an exec_server package, e.g. from `git archive REV src`); "
                    "repeatable")
    return ap


def fs_targets(args: argparse.Namespace) -> list[ServerTarget]:
    """The servers a :func:`fs_parser` benchmark runs: ours, each ``--alt`` build
    (``alt1``, ``alt2``, ...), then upstream unless ``--no-upstream``."""
    out = [ours_target()] if args.no_upstream else available_targets()
    return out[:1] + alt_targets(args.alt) + out[1:]


def alt_targets(dirs: Sequence[str], *extra_args: str) -> list[ServerTarget]:
    """Other builds of this server (``alt1``, ``alt2``, ...), each run with ``PYTHONPATH=DIR``."""
    base = ours_target(*extra_args)
    return [ServerTarget(f"alt{k + 1}", base.argv, {"PYTHONPATH": d})
            for k, d in enumerate(dirs)]


def _proc_kib(path: str, key: str) -> int | None:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _vmrss_kib(pid: int) -> int | None:
    return _proc_kib(f"/proc/{pid}/status", "VmRSS:")


def vm_hwm_kib(pid: int) -> int | None:
    """Peak resident set (VmHWM) of ``pid`` alone in KiB (Linux ``/proc``), or None."""
    return _proc_kib(f"/proc/{pid}/status", "VmHWM:")


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(name))
    out, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child)
    return out


async def settle(pid: int, *, quiet: float = 0.25, limit: float = 3.0) -> None:
    """Wait until ``pid``'s set of descendant processes stays the same for ``quiet``
    seconds (at most ``limit``): start-up probes a server runs in short-lived
    children are not part of its idle footprint, long-lived helpers are."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    last = sorted(_descendants(pid))
    since = loop.time()
    while loop.time() < deadline:
        await asyncio.sleep(0.02)
        now = sorted(_descendants(pid))
        if now != last:
            last, since = now, loop.time()
        elif loop.time() - since >= quiet:
            return


def rss_kib(pid: int, *, tree: bool = True) -> int | None:
    """VmRSS of ``pid`` in KiB (Linux ``/proc``), ``None`` if unavailable.

    With ``tree`` (default) the server's helper processes (descendants) count too,
    by their PSS so pages shared with the server after a fork are not counted
    twice; measure when no benchmarked child is running.
    """
    own = _vmrss_kib(pid)
    if own is None or not tree:
        return own
    return own + sum(
        _proc_kib(f"/proc/{d}/smaps_rollup", "Pss:") or 0 for d in _descendants(pid)
    )


# --------------------------------------------------------------------------- raw client


class RpcError(Exception):
    """A JSON-RPC error reply."""

    def __init__(self, method: str, error: JSON) -> None:
        super().__init__(f"{method}: {error}")
        self.method = method
        self.error = error
        self.code: int | None = error.get("code") if isinstance(error, dict) else None


class _QuickAckConnection(ClientConnection):
    """Re-arm TCP_QUICKACK on every receive so the client never delays ACKs.

    Upstream never sets TCP_NODELAY; with delayed ACKs on the client, its small
    writes stall ~40 ms in Nagle. QuickACK gives the fair figures.
    """

    def data_received(self, data: bytes) -> None:
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, _TCP_QUICKACK, 1)
        super().data_received(data)


async def ws_connect(url: str, *, quickack: bool = False) -> ClientConnection:
    """The benchmark client's WebSocket connection: no size limit, no compression, no
    pings; with ``quickack`` it never delays ACKs (see :class:`_QuickAckConnection`)."""
    return await websockets.connect(
        url,
        max_size=None,
        max_queue=None,
        compression=None,
        ping_interval=None,
        open_timeout=30,
        close_timeout=2,
        proxy=None,
        create_connection=_QuickAckConnection if quickack else None,
    )


class ProcState:
    """What the client has seen of one process through notifications."""

    __slots__ = ("changed", "closed", "data", "exit_code", "exited", "keep", "nbytes", "seq")

    def __init__(self, keep: bool = True) -> None:
        self.keep = keep
        self.data = bytearray()
        self.nbytes = 0
        self.seq = 0
        self.exited = False
        self.exit_code: int | None = None
        self.closed = False
        self.changed = asyncio.Event()


class RawClient:
    """Minimal JSON-RPC-over-WebSocket client; notifications tracked per processId."""

    def __init__(self, ws: ClientConnection, *, uri_paths: bool = True) -> None:
        self.ws = ws
        self.uri_paths = uri_paths
        self._next_id = 0
        self._pending: dict[int, asyncio.Future[JSON]] = {}
        self.procs: dict[str, ProcState] = {}
        self.init_result: JSON = None
        self._reader = asyncio.create_task(self._read_loop())

    @classmethod
    async def connect(
        cls, url: str, *, quickack: bool = False, uri_paths: bool = True
    ) -> RawClient:
        return cls(await ws_connect(url, quickack=quickack), uri_paths=uri_paths)

    async def __aenter__(self) -> RawClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(), 3)
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader

    def path(self, p: str) -> str:
        """A path in the wire form this client uses (``file://`` URI by default)."""
        return "file://" + urllib.parse.quote(p) if self.uri_paths else p

    async def _read_loop(self) -> None:
        err: BaseException | None = None
        try:
            async for raw in self.ws:
                msg = _decode(raw)
                mid = msg.get("id")
                if mid is not None and ("result" in msg or "error" in msg):
                    fut = self._pending.pop(mid, None)
                    if fut is not None and not fut.done():
                        fut.set_result(msg)
                    continue
                self._on_notification(msg.get("method"), msg.get("params") or {})
        except websockets.ConnectionClosed as exc:
            err = exc
        finally:
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(ConnectionError(f"connection lost: {err!r}"))
            self._pending.clear()

    def _on_notification(self, method: str | None, params: JSON) -> None:
        st = self.procs.get(params.get("processId"))
        if st is None:
            return
        if method == "process/output":
            chunk: str = params.get("chunk") or ""
            if st.keep:
                b = base64.b64decode(chunk)
                st.data += b
                st.nbytes += len(b)
            else:
                st.nbytes += b64_len(chunk)
            st.seq = max(st.seq, params.get("seq", 0))
        elif method == "process/exited":
            st.exited = True
            st.exit_code = params.get("exitCode")
        elif method == "process/closed":
            st.closed = True
        st.changed.set()

    async def call(self, method: str, params: JSON = None, *, limit_s: float = 120.0) -> JSON:
        async def send(mid: int) -> None:
            msg: dict[str, JSON] = {"id": mid, "method": method}
            if params is not None:
                msg["params"] = params
            await self.ws.send(_encode(msg), text=True)

        return await self._exchange(method, send, limit_s)

    async def call_fragmented(self, method: str, params: JSON, *, fragment: int,
                              limit_s: float = 300.0) -> JSON:
        """:meth:`call`, sending the request as a WebSocket message of ``fragment``-sized
        text frames (for requests larger than a peer accepts in one frame)."""
        async def send(mid: int) -> None:
            text = json.dumps({"id": mid, "method": method, "params": params})
            await self.ws.send([text[i : i + fragment] for i in range(0, len(text), fragment)])

        return await self._exchange(method, send, limit_s)

    async def _exchange(self, method: str, send: Callable[[int], Awaitable[None]],
                        limit_s: float) -> JSON:
        """Send a request with the next id (``send(id)``) and wait for its reply's result."""
        self._next_id += 1
        mid = self._next_id
        fut: asyncio.Future[JSON] = asyncio.get_running_loop().create_future()
        # Mark a connection-lost exception as retrieved when the send itself fails.
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._pending[mid] = fut
        try:
            await send(mid)
            reply = await asyncio.wait_for(fut, limit_s)
        finally:
            self._pending.pop(mid, None)
        if "error" in reply:
            raise RpcError(method, reply["error"])
        return reply["result"]

    async def notify(self, method: str, params: JSON = None) -> None:
        msg: dict[str, JSON] = {"method": method}
        if params is not None:
            msg["params"] = params
        await self.ws.send(_encode(msg), text=True)

    async def handshake(self, client_name: str = "exec-bench") -> JSON:
        self.init_result = await self.call("initialize", {"clientName": client_name})
        await self.notify("initialized", {})
        return self.init_result

    # ---- process helpers

    def track(self, pid: str, *, keep: bool = True) -> ProcState:
        st = ProcState(keep)
        self.procs[pid] = st
        return st

    async def start(
        self,
        pid: str,
        argv: Sequence[str],
        cwd: str,
        *,
        tty: bool = False,
        env: dict[str, str] | None = None,
        keep: bool = True,
        extra: dict[str, JSON] | None = None,
    ) -> ProcState:
        """``process/start`` (current-client shape, no sandbox); tracks notifications."""
        st = self.track(pid, keep=keep)
        params: dict[str, JSON] = {
            "processId": pid,
            "argv": list(argv),
            "cwd": self.path(cwd),
            "env": default_env() if env is None else env,
            "tty": tty,
            "arg0": None,
        }
        if extra:
            params.update(extra)
        await self.call("process/start", params)
        return st

    async def wait_closed(self, pid: str, limit_s: float = 120.0) -> ProcState:
        """Wait for ``process/closed`` of ``pid`` via notifications."""
        return await self.wait_output(pid, lambda st: st.closed, limit_s)

    async def wait_output(self, pid: str, predicate: Callable[[ProcState], bool],
                          limit_s: float = 30.0) -> ProcState:
        """Wait until ``predicate(state)`` holds for ``pid``'s notification state."""
        st = self.procs[pid]
        async with asyncio.timeout(limit_s):
            while not predicate(st):
                st.changed.clear()
                await st.changed.wait()
        return st

    async def read_until_closed(self, pid: str, *, max_bytes: int = MIB,
                                wait_ms: int = 5000) -> tuple[bytes, int | None]:
        """Follow ``pid`` with ``process/read`` using the PROTOCOL §8.4 cursor convention."""
        after: int | None = None
        out = bytearray()
        while True:
            r = await self.call("process/read", {"processId": pid, "afterSeq": after,
                                                 "maxBytes": max_bytes, "waitMs": wait_ms})
            for ch in r["chunks"]:
                out += base64.b64decode(ch["chunk"])
            after = r["nextSeq"] - 1
            if r["closed"]:
                return bytes(out), r.get("exitCode")

    def forget(self, pid: str) -> None:
        self.procs.pop(pid, None)


# msgspec's C codec keeps the client cheap, so throughput figures measure the server.
_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


def b64_len(s: str) -> int:
    """Decoded length of a padded base64 string without decoding it."""
    if not s:
        return 0
    pad = 2 if s.endswith("==") else (1 if s.endswith("=") else 0)
    return len(s) * 3 // 4 - pad


def default_env() -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "LANG": "C"}
    if "HOME" in os.environ:
        env["HOME"] = os.environ["HOME"]
    return env


# --------------------------------------------------------------------------- statistics


@dataclasses.dataclass(frozen=True)
class Summary:
    """Median / p90 / n of a sample set, in the metric's unit.

    ``samples`` (sorted) are kept for :func:`ratio_interval`; not written to JSON.
    """

    median: float
    p90: float
    n: int
    samples: tuple[float, ...] = dataclasses.field(default=(), repr=False, compare=False)

    def __str__(self) -> str:
        return f"{self.median:.3f}"


def summarize(samples: Iterable[float]) -> Summary:
    xs = sorted(samples)
    if not xs:
        raise ValueError("no samples")
    k = (len(xs) - 1) * 0.9
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return Summary(statistics.median(xs), xs[lo] + (xs[hi] - xs[lo]) * (k - lo), len(xs),
                   tuple(xs))


#: Resamples behind :func:`ratio_interval`; its seed is fixed, so a report reprints alike.
BOOTSTRAP_ROUNDS = 2000


def ratio_interval(ours: Sequence[float], upstream: Sequence[float],
                   level: float = 0.95) -> tuple[float, float] | None:
    """Percentile-bootstrap interval of median(ours) / median(upstream).

    Why: on a shared 2-vCPU VM two runs of the same build differ by 5-10 %, so
    a ratio of 1.03 alone does not say whether ours is slower. Each side is
    resampled on its own (the samples come from alternating batches, close
    enough to independent for this). ``None`` with fewer than 5 samples a side.
    """
    if len(ours) < 5 or len(upstream) < 5:
        return None
    rng = random.Random(0x5EED)
    ratios = []
    for _ in range(BOOTSTRAP_ROUNDS):
        b = statistics.median(rng.choices(upstream, k=len(upstream)))
        if b > 0:
            ratios.append(statistics.median(rng.choices(ours, k=len(ours))) / b)
    if len(ratios) < BOOTSTRAP_ROUNDS // 2:
        return None
    ratios.sort()
    tail = (1 - level) / 2
    return ratios[int(tail * (len(ratios) - 1))], ratios[int((1 - tail) * (len(ratios) - 1))]


def target_met(ratio: float, interval: tuple[float, float] | None, target: float,
               higher_is_better: bool) -> bool:
    """The budget's rule: met when the ratio's 95 % interval reaches ``target``.

    Why: one run on a shared VM cannot tell a ratio just past the target from one
    just inside it; a miss is only a miss when the whole interval is past it.
    Without an interval (fewer than 5 samples a side) the median ratio decides.
    """
    if higher_is_better:
        return (ratio if interval is None else interval[1]) >= target
    return (ratio if interval is None else interval[0]) <= target


async def time_many(n: int, fn: Callable[[], Any], *, scale: float = 1000.0) -> Summary:
    """Run ``await fn()`` n times sequentially; summary of durations (ms by default)."""
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        samples.append((time.perf_counter() - t0) * scale)
    return summarize(samples)


# --------------------------------------------------------------------------- report


@dataclasses.dataclass
class _Row:
    metric: str
    unit: str
    target: float | None
    higher_is_better: bool
    values: dict[str, Summary | float] = dataclasses.field(default_factory=dict)


class Report:
    """Side-by-side table: one row per metric, one column per server, ratio ours/upstream.

    ``target`` is the wanted ratio ours/upstream (≤ target when lower is better,
    ≥ target when higher is better); the last column says whether it is met.
    """

    def __init__(self, title: str, servers: Sequence[str]) -> None:
        self.title = title
        self.servers = list(servers)
        self._rows: dict[str, _Row] = {}
        self.notes: list[str] = []
        #: metric -> its interval, computed once (2000 resamples) until a value changes
        self._intervals: dict[str, tuple[float, float] | None] = {}

    def metric(self, metric: str, unit: str, *, target: float | None = None,
               higher_is_better: bool = False) -> None:
        """Declare a row (order of declaration is the print order)."""
        if metric not in self._rows:
            self._rows[metric] = _Row(metric, unit, target, higher_is_better)

    def add(self, server: str, metric: str, value: Summary | float, *, unit: str = "ms",
            target: float | None = None, higher_is_better: bool = False) -> None:
        self.metric(metric, unit, target=target, higher_is_better=higher_is_better)
        self._rows[metric].values[server] = value
        self._intervals = {k: v for k, v in self._intervals.items()
                           if not k.startswith(f"{metric}\0")}

    @staticmethod
    def _median(v: Summary | float | None) -> float | None:
        if v is None:
            return None
        return v.median if isinstance(v, Summary) else float(v)

    def ratio(self, metric: str, other: str = UPSTREAM) -> float | None:
        """median(ours) / median(``other``) of one row."""
        row = self._rows.get(metric)
        if row is None:
            return None
        a = self._median(row.values.get(OURS))
        b = self._median(row.values.get(other))
        if a is None or b is None or b == 0:
            return None
        return a / b

    def interval(self, metric: str, other: str = UPSTREAM) -> tuple[float, float] | None:
        """95 % interval of :meth:`ratio` (see :func:`ratio_interval`), when both
        servers' samples are known."""
        key = f"{metric}\0{other}"
        if key in self._intervals:
            return self._intervals[key]
        row = self._rows.get(metric)
        if row is None:
            return None
        a, b = row.values.get(OURS), row.values.get(other)
        interval = None
        if isinstance(a, Summary) and isinstance(b, Summary):
            interval = ratio_interval(a.samples, b.samples)
        self._intervals[key] = interval
        return interval

    def _alts(self) -> list[str]:
        """The ``--alt`` builds in this report (``alt1``, ...)."""
        return [s for s in self.servers if s.startswith("alt")]

    def as_dict(self) -> dict[str, JSON]:
        out: dict[str, JSON] = {}
        for row in self._rows.values():
            interval = self.interval(row.metric)
            out[row.metric] = {
                "unit": row.unit,
                "target": row.target,
                "ratio": self.ratio(row.metric),
                "ratio_95": None if interval is None else list(interval),
                **{f"ratio_{alt}": self.ratio(row.metric, alt) for alt in self._alts()},
                **{f"ratio_{alt}_95": (None if (i := self.interval(row.metric, alt)) is None
                                       else list(i)) for alt in self._alts()},
                **{
                    s: ({"median": v.median, "p90": v.p90, "n": v.n}
                        if isinstance(v, Summary) else v)
                    for s, v in row.values.items()
                },
            }
        return out

    def render(self) -> str:
        head = ["metric", *self.servers, "unit"]
        show_ratio = OURS in self.servers and UPSTREAM in self.servers
        if show_ratio:
            head += ["ours/up", "95% interval", "target"]
        alts = self._alts() if OURS in self.servers else []
        head += [f"ours/{alt}" for alt in alts]
        lines: list[list[str]] = [head]
        for row in self._rows.values():
            cells = [row.metric]
            for s in self.servers:
                v = self._median(row.values.get(s))
                cells.append("-" if v is None else f"{v:.3f}" if v < 100 else f"{v:.1f}")
            cells.append(row.unit)
            if show_ratio:
                ratio = self.ratio(row.metric)
                cells.append("-" if ratio is None else f"{ratio:.2f}x")
                interval = self.interval(row.metric)
                cells.append("" if interval is None else f"{interval[0]:.2f}-{interval[1]:.2f}")
                if row.target is None or ratio is None:
                    cells.append("")
                else:
                    ok = target_met(ratio, interval, row.target, row.higher_is_better)
                    cmp = ">=" if row.higher_is_better else "<="
                    cells.append(f"{cmp}{row.target:g} {'ok' if ok else 'MISS'}")
            for alt in alts:
                ratio = self.ratio(row.metric, alt)
                interval = self.interval(row.metric, alt)
                cells.append("-" if ratio is None else f"{ratio:.2f}x" + (
                    "" if interval is None else f" ({interval[0]:.2f}-{interval[1]:.2f})"))
            lines.append(cells)
        widths = [max(len(r[i]) for r in lines) for i in range(len(head))]
        text = [f"== {self.title} =="]
        for i, cells_ in enumerate(lines):
            text.append("  ".join(c.ljust(w) if j == 0 else c.rjust(w)
                                  for j, (c, w) in enumerate(zip(cells_, widths, strict=True))))
            if i == 0:
                text.append("-" * (sum(widths) + 2 * (len(widths) - 1)))
        text += [f"note: {n}" for n in self.notes]
        if show_ratio and any(self.interval(m) is not None for m in self._rows):
            text.append("note: 95% interval: bootstrap of ours/up over this run's samples; "
                        "a target is met when the interval reaches it (the median ratio's "
                        "verdict where there is no interval)")
        return "\n".join(text)

    def print(self) -> None:
        print(self.render(), flush=True)
