"""Shared fixtures: a real ``exec-server serve`` subprocess and raw JSON-RPC clients.

How to use (every area may):

``server_factory``
    ``srv = server_factory("--detach-ttl", "0.5")`` starts
    ``python -m exec_server serve --listen ws://127.0.0.1:0 <args>``, waits for
    the URL line and returns a :class:`ServerProcess` (``.url``, ``.pid``,
    ``.stderr_text()``, ``.open_fds()``, ``.child_pids()``). Pass
    ``listen=None`` to omit ``--listen``; ``cwd=``/``env=`` as for Popen.
    Every server is terminated (SIGTERM, then SIGKILL) and reaped at teardown.
``server``
    One default server.
``rpc``
    ``client = await rpc(server.url)`` opens a raw WebSocket
    :class:`RpcClient`: ``await client.request(method, params)`` returns the
    whole reply dict (``{"id","result"}`` or ``{"id","error"}``);
    ``await client.call(method, params)`` returns ``result`` or fails the
    test on an error; ``await client.initialize()`` does the handshake and
    returns the ``sessionId``; ``await client.notification(method)`` waits
    for the next notification (optionally of one method);
    ``await client.send_raw(text_or_bytes)`` / ``await client.response(id)``
    for hand-made frames; ``await client.close_sending()`` then
    ``await client.wait_closed()`` to watch the server end; ``client.ws`` is the raw
    websockets connection. Closed at teardown.
``stdio_rpc``
    ``client = await stdio_rpc("--detach-ttl", "1")`` spawns
    ``serve --listen stdio`` and returns the same :class:`RpcClient` API
    over newline-delimited JSON; the child is reaped at teardown.
``router_caller``
    ``caller = router_caller(services=None)``: an ``ExecServerClient.call``
    stand-in that encodes each request as a JSON-RPC frame, dispatches it
    through the real ``Router`` with the ``fs/*`` handlers (an attached,
    initialized session) and decodes the reply as the client does;
    ``await caller.exchange(frame)`` and ``await caller.raw(method, params)``
    for hand-made frames. Give ``services`` to route confined calls.
``no_leaks``
    Request it **first** in a test's argument list. On teardown it asserts
    that no child process of the test process is left (orphaned grandchildren
    are caught too: the test process becomes a child subreaper) and that no
    pipe/pty/socket fd opened during the test is still open. Waits up to
    5 s (polling) for children to be reaped and fds to close.

All waits use timeouts (``TIMEOUT`` seconds); nothing sleeps to synchronise.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import errno
import gc
import itertools
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

#: seconds any single wait in these helpers may take.
TIMEOUT = 10.0
PR_SET_CHILD_SUBREAPER = 36


# ---------------------------------------------------------------------------
# Server subprocess
# ---------------------------------------------------------------------------


def _server_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "exec_server", "serve", *args]


class ServerProcess:
    """A running ``exec-server serve`` child and what it announced."""

    def __init__(self, proc: subprocess.Popen[bytes], stderr_path: Path, url: str) -> None:
        self.proc = proc
        self.url = url
        self._stderr_path = stderr_path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr_text(self) -> str:
        return self._stderr_path.read_text(errors="replace")

    def open_fds(self) -> dict[int, str]:
        """The server's open fds and what they point to (``/proc/<pid>/fd``)."""
        out: dict[int, str] = {}
        fd_dir = f"/proc/{self.pid}/fd"
        for name in os.listdir(fd_dir):
            with contextlib.suppress(OSError):
                out[int(name)] = os.readlink(f"{fd_dir}/{name}")
        return out

    def child_pids(self) -> set[int]:
        """Direct children of the server process."""
        return _children_of(self.pid)

    def stop(self) -> int:
        """SIGTERM, wait, SIGKILL if needed; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(TIMEOUT)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode


def _read_line(proc: subprocess.Popen[bytes], timeout: float) -> bytes:
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    buf = b""
    while b"\n" not in buf:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("server printed no URL line in time")
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf += chunk
    return buf


def start_server(
    *args: str,
    listen: str | None = "ws://127.0.0.1:0",
    cwd: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
    stderr_dir: Path,
) -> ServerProcess:
    """Start a server child and wait for its URL (raises with stderr on failure)."""
    argv = _server_argv(*(["--listen", listen] if listen is not None else []), *args)
    fd, name = tempfile.mkstemp(prefix="server-stderr-", suffix=".log", dir=stderr_dir)
    stderr_path = Path(name)
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=fd, cwd=cwd, env=env
        )
    finally:
        os.close(fd)
    try:
        line = _read_line(proc, TIMEOUT)
    except BaseException:
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
        raise
    url = line.decode().strip()
    if not url.startswith(("ws://", "wss://")):
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
        raise RuntimeError(f"server did not announce a URL: {url!r}\n{stderr_path.read_text()}")
    return ServerProcess(proc, stderr_path, url)


@pytest.fixture
def set_xattr() -> Callable[[Path, str, bytes], None]:
    """``os.setxattr`` for a test's set-up; skips the test on a filesystem (or
    kernel) without that kind of attribute, e.g. ``user.*`` on tmpfs before 6.6."""

    def setter(path: Path, name: str, value: bytes) -> None:
        try:
            os.setxattr(path, name, value)
        except OSError as exc:
            if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
                pytest.skip(f"{path}: no {name.split('.')[0]}.* attributes on this filesystem")
            raise

    return setter


@pytest.fixture
def server_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., ServerProcess]]:
    """``server_factory(*extra_args, listen=..., cwd=..., env=...) -> ServerProcess``."""
    started: list[ServerProcess] = []
    stderr_dir = tmp_path_factory.mktemp("server-logs")

    def factory(
        *args: str,
        listen: str | None = "ws://127.0.0.1:0",
        cwd: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> ServerProcess:
        srv = start_server(*args, listen=listen, cwd=cwd, env=env, stderr_dir=stderr_dir)
        started.append(srv)
        return srv

    yield factory
    for srv in started:
        srv.stop()


@pytest.fixture
def server(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    """One server with default flags."""
    return server_factory()


# ---------------------------------------------------------------------------
# Raw JSON-RPC client
# ---------------------------------------------------------------------------


class RpcError(AssertionError):
    """``RpcClient.call`` got an error reply."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(f"{error.get('code')}: {error.get('message')}")
        self.code: int = error.get("code", 0)
        self.message: str = error.get("message", "")


class RpcClient:
    """Raw JSON-RPC over one connection: dicts in, dicts out, no typing layer.

    A background task reads every inbound message: replies are matched to
    pending ids; notifications go to a queue; ``closed`` is set at EOF.
    """

    def __init__(
        self,
        send: Callable[[bytes | str], Awaitable[None]],
        recv: Callable[[], Awaitable[bytes | str | None]],
        close: Callable[[], Awaitable[None]],
    ) -> None:
        self._send = send
        self._recv = recv
        self._close = close
        self._ids = itertools.count(1)
        self._replies: dict[Any, asyncio.Future[dict[str, Any]]] = {}
        self.notifications: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.all_messages: list[dict[str, Any]] = []
        self.closed = asyncio.Event()
        self._reader = asyncio.create_task(self._read_loop())

    def _future(self, msg_id: Any) -> asyncio.Future[dict[str, Any]]:
        key = (type(msg_id).__name__, msg_id)
        fut = self._replies.get(key)
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
            self._replies[key] = fut
        return fut

    async def _read_loop(self) -> None:
        try:
            while True:
                data = await self._recv()
                if data is None:
                    return
                msg = json.loads(data)
                self.all_messages.append(msg)
                if "id" in msg and ("result" in msg or "error" in msg):
                    fut = self._future(msg["id"])
                    if not fut.done():
                        fut.set_result(msg)
                else:
                    self.notifications.put_nowait(msg)
        finally:
            self.closed.set()

    async def send_raw(self, data: bytes | str) -> None:
        await self._send(data)

    async def send(self, message: dict[str, Any]) -> None:
        await self._send(json.dumps(message))

    async def response(self, msg_id: Any, timeout: float = TIMEOUT) -> dict[str, Any]:  # noqa: ASYNC109
        """The reply with ``msg_id`` (sent earlier), waiting up to ``timeout``."""
        fut = self._future(msg_id)
        closed = asyncio.ensure_future(self.closed.wait())
        try:
            await asyncio.wait({fut, closed}, timeout=timeout, return_when="FIRST_COMPLETED")
        finally:
            closed.cancel()
        if fut.done():
            return fut.result()
        if self.closed.is_set():
            raise ConnectionError(f"connection closed while waiting for reply {msg_id!r}")
        raise TimeoutError(f"no reply to id {msg_id!r} within {timeout} s")

    async def request(
        self,
        method: str,
        params: Any = None,
        *,
        msg_id: Any = None,
        timeout: float = TIMEOUT,  # noqa: ASYNC109
        omit_params: bool = False,
    ) -> dict[str, Any]:
        """Send a request and return the whole reply message."""
        if msg_id is None:
            msg_id = next(self._ids) + 1000
        msg: dict[str, Any] = {"id": msg_id, "method": method}
        if not omit_params:
            msg["params"] = params if params is not None else {}
        await self.send(msg)
        return await self.response(msg_id, timeout)

    async def call(self, method: str, params: Any = None, *, timeout: float = TIMEOUT) -> Any:  # noqa: ASYNC109
        """``request`` and return ``result``; raises :class:`RpcError` on an error reply."""
        reply = await self.request(method, params, timeout=timeout)
        if "error" in reply:
            raise RpcError(reply["error"])
        return reply["result"]

    async def notify(self, method: str, params: Any = None) -> None:
        msg: dict[str, Any] = {"method": method}
        if params is not None:
            msg["params"] = params
        await self.send(msg)

    async def initialize(
        self, client_name: str = "pytest", resume_session_id: str | None = None
    ) -> str:
        """``initialize`` + ``initialized``; returns the ``sessionId``."""
        params: dict[str, Any] = {"clientName": client_name}
        if resume_session_id is not None:
            params["resumeSessionId"] = resume_session_id
        result = await self.call("initialize", params)
        await self.notify("initialized", {})
        return str(result["sessionId"])

    async def notification(
        self,
        method: str | None = None,
        timeout: float = TIMEOUT,  # noqa: ASYNC109
    ) -> dict[str, Any]:
        """Next notification (of ``method`` if given; others are skipped)."""
        async with asyncio.timeout(timeout):
            while True:
                msg = await self.notifications.get()
                if method is None or msg.get("method") == method:
                    return msg

    async def wait_closed(self, timeout: float = TIMEOUT) -> None:  # noqa: ASYNC109
        """Wait until the server closes the connection."""
        async with asyncio.timeout(timeout):
            await self.closed.wait()

    async def close_sending(self) -> None:
        """Stop sending (stdio: EOF on the server's stdin; ws: close) but keep
        reading, so ``wait_closed`` observes the server's side ending."""
        with contextlib.suppress(Exception):
            await self._close()

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self._close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader


async def open_ws_client(url: str, **kwargs: Any) -> tuple[RpcClient, ClientConnection]:
    ws = await connect(url, compression=None, max_size=None, open_timeout=TIMEOUT, **kwargs)

    async def recv() -> bytes | str | None:
        try:
            return await ws.recv()
        except ConnectionClosed:
            return None

    return RpcClient(ws.send, recv, ws.close), ws


@pytest.fixture
async def rpc() -> AsyncIterator[Callable[[str], Awaitable[RpcClient]]]:
    """``client = await rpc(url)``: a raw WebSocket JSON-RPC client."""
    clients: list[RpcClient] = []

    async def factory(url: str) -> RpcClient:
        client, ws = await open_ws_client(url)
        client.ws = ws  # type: ignore[attr-defined]  # the raw websockets connection
        clients.append(client)
        return client

    yield factory
    for client in clients:
        await client.aclose()


@pytest.fixture
async def stdio_rpc() -> AsyncIterator[Callable[..., Awaitable[RpcClient]]]:
    """``client = await stdio_rpc(*extra_args)``: ``serve --listen stdio`` child + client.

    The child's stderr goes to the test's stderr; the child is reaped at teardown.
    """
    procs: list[tuple[asyncio.subprocess.Process, RpcClient]] = []

    async def factory(*args: str, cwd: str | None = None) -> RpcClient:
        proc = await asyncio.create_subprocess_exec(
            *_server_argv("--listen", "stdio", *args),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            cwd=cwd,
            limit=1 << 30,
        )
        assert proc.stdin is not None and proc.stdout is not None
        stdin, stdout = proc.stdin, proc.stdout

        async def send(data: bytes | str) -> None:
            raw = data.encode() if isinstance(data, str) else data
            stdin.write(raw + b"\n")
            await stdin.drain()

        async def recv() -> bytes | None:
            line = await stdout.readline()
            return line or None

        async def close() -> None:
            if not stdin.is_closing():
                stdin.close()

        client = RpcClient(send, recv, close)
        procs.append((proc, client))
        return client

    yield factory
    for proc, client in procs:
        await client.aclose()
        try:
            await asyncio.wait_for(proc.wait(), TIMEOUT)
        except TimeoutError:
            proc.kill()
            await proc.wait()


# ---------------------------------------------------------------------------
# Leak checks
# ---------------------------------------------------------------------------


def _children_of(pid: int) -> set[int]:
    out: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # the comm field may contain spaces and parens: split after the last ')'
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            out.add(int(name))
    return out


def _tracked_fds() -> dict[int, str]:
    out: dict[int, str] = {}
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{name}")
            if target.startswith(("pipe:", "socket:", "/dev/pts/", "/dev/ptmx")):
                out[int(name)] = target
    return out


def _set_subreaper(on: bool) -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)


@pytest.fixture
def no_leaks() -> Iterator[None]:
    """Fail the test if it leaves child processes or pipe/pty/socket fds behind.

    The test process is a subreaper only meanwhile: kept on, it would adopt
    every orphan of later tests (a stopped server's sandbox helpers) and,
    never waiting for them, collect hundreds of zombies over a run.
    """
    _set_subreaper(True)
    try:
        yield from _check_no_leaks()
    finally:
        _set_subreaper(False)


def _check_no_leaks() -> Iterator[None]:
    me = os.getpid()
    children_before = _children_of(me)
    fds_before = _tracked_fds()
    yield
    deadline = time.monotonic() + 5.0
    while True:
        gc.collect()
        leaked_children = _children_of(me) - children_before
        for pid in list(leaked_children):
            with contextlib.suppress(ChildProcessError):
                done, _ = os.waitpid(pid, os.WNOHANG)
                if done:
                    leaked_children.discard(pid)
        fds_now = _tracked_fds()
        leaked_fds = {fd: target for fd, target in fds_now.items() if fds_before.get(fd) != target}
        if not leaked_children and not leaked_fds:
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    for pid in leaked_children:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    raise AssertionError(f"leaked children {sorted(leaked_children)}, fds {leaked_fds}")


# ---------------------------------------------------------------------------
# In-process server (real router and handlers, memory transports)
# ---------------------------------------------------------------------------


class InProcessServer:
    """An :class:`ExecServer` whose connections are in-memory pipes.

    ``server`` is the ExecServer (tests may add routes to ``server.router``);
    ``await connect()`` returns an :class:`RpcClient` whose ``processor`` is
    the server side's
    :class:`~exec_server.server.connection.ConnectionProcessor` and ``task`` its run task;
    ``await client.aclose()`` is a transport drop.
    """

    def __init__(self, *, sandboxed: bool = False, **config: Any) -> None:
        """``sandboxed``: the real sandbox services (sandboxed ``fs/*`` calls work)."""
        from exec_server.config import ServerConfig
        from exec_server.server.app import ExecServer
        from exec_server.server.services import ServerServices

        cfg = ServerConfig(**config)
        services = ServerServices.create(cfg) if sandboxed else ServerServices(cfg)
        self.server = ExecServer(cfg, services)
        self._clients: list[RpcClient] = []

    async def connect(self, label: str = "exec-server test") -> RpcClient:
        from exec_server.transport.memory import memory_pair

        client_end, server_end = memory_pair(label=label)
        processor = self.server.processor(server_end)
        task = asyncio.create_task(processor.run())

        async def send(data: bytes | str) -> None:
            await client_end.send(data.encode() if isinstance(data, str) else data)

        client = RpcClient(send, client_end.receive, client_end.aclose)
        client.processor = processor  # type: ignore[attr-defined]
        client.task = task  # type: ignore[attr-defined]
        self._clients.append(client)
        return client

    async def aclose(self) -> None:
        for client in self._clients:
            await client.aclose()
            task: asyncio.Task[None] = client.task  # type: ignore[attr-defined]
            await asyncio.wait_for(task, TIMEOUT)
        await self.server.aclose()


@pytest.fixture
async def inprocess_server() -> AsyncIterator[Callable[..., InProcessServer]]:
    """``srv = inprocess_server(detach_ttl=0.2, ...)``: see :class:`InProcessServer`."""
    servers: list[InProcessServer] = []

    def factory(**config: Any) -> InProcessServer:
        srv = InProcessServer(**config)
        servers.append(srv)
        return srv

    yield factory
    for srv in servers:
        await srv.aclose()


async def _wait_until(predicate: Callable[[], bool], timeout: float = TIMEOUT) -> None:  # noqa: ASYNC109
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 - external condition (/proc): nothing to await
            await asyncio.sleep(0.02)


@pytest.fixture
def wait_until() -> Callable[..., Awaitable[None]]:
    """``await wait_until(lambda: cond, timeout=10)``: poll an external condition
    (``/proc``, files) with a deadline; prefer awaiting an event when there is one."""
    return _wait_until


async def _no_notifications(method: str, params: Any) -> None:
    raise AssertionError(f"fs methods send no notifications (got {method})")


class RouterCaller:
    """``RemoteFileSystem``'s caller, dispatching through the real router and fs handlers."""

    def __init__(self, services: Any = None) -> None:
        from exec_server.config import ServerConfig
        from exec_server.protocol.handshake import HandshakeState
        from exec_server.server.handlers import fs as fs_handlers
        from exec_server.server.handlers import fs_handles as fs_handle_handlers
        from exec_server.server.router import Router
        from exec_server.server.services import ServerServices
        from exec_server.server.session import Attachment, Session, SessionRegistry

        self.services = services if services is not None else ServerServices(ServerConfig())
        self.registry = SessionRegistry(self.services.config)
        self.router = Router()
        fs_handlers.register(self.router)
        fs_handle_handlers.register(self.router)
        self.attachment = Attachment("test", _no_notifications)
        session = Session("session", processes=None)  # type: ignore[arg-type]
        session.attached_to = self.attachment.connection_id
        self.attachment.session = session
        self.attachment.handshake.state = HandshakeState.READY
        self._next_id = 0

    async def exchange(self, frame: bytes | str) -> bytes:
        """Dispatch one request frame and return the encoded reply."""
        from exec_server.protocol.codec import decode_message
        from exec_server.protocol.messages import Request
        from exec_server.server.router import RequestContext

        request = decode_message(frame)
        assert isinstance(request, Request)
        ctx = RequestContext(self.attachment, self.services, self.registry)
        reply: bytes = await self.router.dispatch(ctx, request)
        return reply

    async def call(self, method: str, params: Any, result_type: Any) -> Any:
        from exec_server.exceptions import error_for_code
        from exec_server.protocol.codec import decode_message, decode_result, encode_request
        from exec_server.protocol.messages import ErrorResponse

        self._next_id += 1
        reply = decode_message(await self.exchange(encode_request(self._next_id, method, params)))
        if isinstance(reply, ErrorResponse):
            raise error_for_code(reply.error.code, reply.error.message)
        return decode_result(reply.result, result_type)  # type: ignore[union-attr]

    async def raw(self, method: str, params: Any) -> dict[str, Any]:
        """Send ``params`` (any JSON value) and return the reply as a dict."""
        self._next_id += 1
        frame = json.dumps({"id": self._next_id, "method": method, "params": params}).encode()
        reply: dict[str, Any] = json.loads(await self.exchange(frame))
        return reply


@pytest.fixture
def router_caller() -> Callable[..., RouterCaller]:
    """``router_caller(services=None)``: see :class:`RouterCaller`."""
    return RouterCaller


def _workspace_write_context(workspace: str | os.PathLike[str]) -> dict[str, Any]:
    """The current client's workspace-write ``sandbox`` member (``root`` read,
    project roots write, no explicit carve-outs), for ``workspace``."""
    uri = f"file://{os.fspath(workspace)}"

    def special(kind: str, access: str) -> dict[str, Any]:
        return {"path": {"type": "special", "value": {"kind": kind}}, "access": access}

    return {
        "permissions": {
            "type": "managed",
            "file_system": {
                "type": "restricted",
                "entries": [special("root", "read"), special("project_roots", "write")],
            },
            "network": "restricted",
        },
        "cwd": uri,
        "policyContext": {"cwd": uri, "workspaceRoots": [uri]},
        "workspaceRoots": [uri],
        "windowsSandboxLevel": "disabled",
        "useLegacyLandlock": False,
    }


@pytest.fixture
def workspace_write_context() -> Callable[[str | os.PathLike[str]], dict[str, Any]]:
    """``workspace_write_context(path)``: a fresh codex workspace-write context dict."""
    return _workspace_write_context


def _read_only_context(root: str | os.PathLike[str]) -> dict[str, Any]:
    """A legacy read-only ``sandbox`` member that reads only under ``root``
    (PROTOCOL.md §15.6 RO(r)): a confined helper does the reading."""
    return {
        "sandboxPolicy": {
            "type": "read-only",
            "access": {
                "type": "restricted",
                "include_platform_defaults": False,
                "readable_roots": [os.fspath(root)],
            },
        },
        "windowsSandboxLevel": "disabled",
    }


@pytest.fixture
def read_only_context() -> Callable[[str | os.PathLike[str]], dict[str, Any]]:
    """``read_only_context(root)``: a fresh legacy read-only context dict reading only ``root``."""
    return _read_only_context


def _legacy_workspace_write_context(root: str | os.PathLike[str]) -> dict[str, Any]:
    """A legacy workspace-write ``sandbox`` member that writes only under ``root``
    and reads nothing else (PROTOCOL.md §15.6 WW(w); no ``/tmp``, no ``$TMPDIR``)."""
    return {
        "sandboxPolicy": {
            "type": "workspace-write",
            "writable_roots": [os.fspath(root)],
            "read_only_access": {"type": "restricted", "include_platform_defaults": False},
            "network_access": False,
            "exclude_tmpdir_env_var": True,
            "exclude_slash_tmp": True,
        },
        "windowsSandboxLevel": "disabled",
    }


@pytest.fixture
def legacy_workspace_write_context() -> Callable[[str | os.PathLike[str]], dict[str, Any]]:
    """``legacy_workspace_write_context(root)``: a fresh legacy WW(w) context dict."""
    return _legacy_workspace_write_context


@pytest.fixture
def codex_binary() -> str:
    """Upstream's ``codex`` binary (``openai-codex-cli-bin``, in the test extras);
    the test is skipped without it."""
    try:
        import codex_cli_bin  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        path = shutil.which("codex")
    else:
        path = os.path.join(os.path.dirname(codex_cli_bin.__file__), "bin", "codex")
    if path is None or not os.access(path, os.X_OK):
        pytest.skip("upstream codex not installed (pip install openai-codex-cli-bin)")
    return path


# ---------------------------------------------------------------------------
# A local HTTP peer for http/request tests
# ---------------------------------------------------------------------------


class HttpPeer:
    """A small HTTP/1.1 server on 127.0.0.1 whose behaviour each path chooses.

    ``/echo``: 200 with JSON ``{"method", "headers": [[name, value], ...], "body"}``
    of what it received (header names as sent), plus response headers
    ``x-multi: a``, ``x-multi: b`` and a non-ASCII ``x-bin``.
    ``/bytes/N``: N bytes of ``pattern(N)`` with a content length, written in
    256 KiB pieces, each awaited (``drain``); ``written`` counts them and
    ``finished`` is set at the end.
    ``/hold``: the head (``content-length: 6``) and ``abc`` at once, then
    ``def`` once ``release`` is set; ``dropped`` is set if the client leaves
    first. ``/nohead``: nothing until ``release`` is set.
    ``/trunc``: ``content-length: 100``, then ``abc`` and the connection closes.
    ``/status/NNN``: that status, empty body. ``/redirect``: 302 to ``/echo``.
    ``requests`` lists ``(method, path)`` in arrival order.
    """

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.finished = asyncio.Event()
        self.head_sent = asyncio.Event()
        self.dropped = asyncio.Event()
        self.written = 0
        self.requests: list[tuple[str, str]] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    @staticmethod
    def pattern(size: int) -> bytes:
        block = bytes(range(256)) * 1024
        return (block * (size // len(block) + 1))[:size]

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def aclose(self) -> None:
        self.release.set()
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()  # ends the handlers' reads and writes
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=TIMEOUT)

    def _track(self) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _respond(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = [line.split(": ", 1) for line in lines[1:] if line]
                length = next((int(v) for k, v in headers if k.lower() == "content-length"), 0)
                body = await reader.readexactly(length)
                self.requests.append((method, path))
                if not await self._route(method, path, headers, body, reader, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _route(
        self,
        method: str,
        path: str,
        headers: list[list[str]],
        body: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        def head(status: int, length: int, extra: str = "") -> bytes:
            return (
                f"HTTP/1.1 {status} X\r\ncontent-length: {length}\r\n{extra}\r\n"
            ).encode("latin-1")

        if path == "/echo":
            payload = json.dumps(
                {"method": method, "headers": headers, "body": body.decode("latin-1")}
            ).encode()
            extra = (
                "x-multi: a\r\nx-multi: b\r\nx-bin: caf\xe9\r\n"
                "content-type: application/json\r\n"
            )
            writer.write(head(200, len(payload), extra) + (b"" if method == "HEAD" else payload))
        elif path.startswith("/bytes/"):
            size = int(path.rsplit("/", 1)[1])
            data = self.pattern(size)
            writer.write(head(200, size))
            for start in range(0, size, 256 * 1024):
                writer.write(data[start : start + 256 * 1024])
                await writer.drain()
                self.written = min(size, start + 256 * 1024)
            self.finished.set()
        elif path == "/hold":
            writer.write(head(200, 6) + b"abc")
            await writer.drain()
            self.head_sent.set()
            released = asyncio.ensure_future(self.release.wait())
            eof = asyncio.ensure_future(reader.read(1))
            await asyncio.wait((released, eof), return_when=asyncio.FIRST_COMPLETED)
            released.cancel()
            eof.cancel()
            if not self.release.is_set():
                self.dropped.set()
                return False
            writer.write(b"def")
        elif path == "/nohead":
            await self.release.wait()
            writer.write(head(200, 0))
        elif path == "/trunc":
            writer.write(head(200, 100) + b"abc")
            await writer.drain()
            return False
        elif path == "/redirect":
            writer.write(head(302, 0, "location: /echo\r\n"))
        elif path.startswith("/status/"):
            writer.write(head(int(path.rsplit("/", 1)[1]), 0))
        else:
            writer.write(head(404, 0))
        await writer.drain()
        return True


@pytest.fixture
async def http_peer() -> AsyncIterator[HttpPeer]:
    """A started :class:`HttpPeer`; closed (and its held responses released) at teardown."""
    peer = HttpPeer()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer._track()
        await peer._respond(reader, writer)

    peer._server = await asyncio.start_server(serve, "127.0.0.1", 0)
    peer.port = peer._server.sockets[0].getsockname()[1]
    yield peer
    await peer.aclose()
