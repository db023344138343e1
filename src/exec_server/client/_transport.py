"""Client transports of whole messages: WebSocket, or a spawned stdio server. ``recv()``
gives None at a clean end and raises :class:`ConnectionLostError` on a broken one."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import sys
from collections.abc import Sequence
from typing import Final, Protocol

import websockets
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, ConnectionClosedOK, InvalidStatus

from exec_server.client.errors import ConnectionLostError, HandshakeError

__all__ = ["DEFAULT_MAX_MESSAGE_SIZE", "StdioTransport", "Transport", "WebSocketTransport"]

#: a 512 MiB ``fs/readFile`` reply in base64
DEFAULT_MAX_MESSAGE_SIZE: Final = 1 << 30
_STDIO_EXIT_GRACE: Final = 5.0
SEND_FRAGMENT: Final = 1 << 20


class Transport(Protocol):
    async def send(self, data: bytes) -> None: ...

    async def recv(self) -> bytes | bytearray | str | None: ...

    async def aclose(self) -> None: ...

    def describe(self) -> str: ...


class WebSocketTransport:
    """One WebSocket connection (``websockets.asyncio.client``), TCP_NODELAY so small
    requests are not held by Nagle; no compression, no keepalive pings."""

    def __init__(self, ws: ClientConnection, url: str) -> None:
        self._ws = ws
        self._url = url

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> WebSocketTransport:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else None
        try:
            if ssl_context is not None and not url.startswith("wss://"):
                raise ValueError(f"a TLS context needs a wss:// URL, not {url}")
            # without a context, wss:// gets the default one (the system's CAs)
            tls = ssl_context if ssl_context is not None else (url.startswith("wss://") or None)
            ws = await connect(
                url,
                additional_headers=headers,
                compression=None,
                proxy=None,
                open_timeout=None,  # the caller's deadline applies
                ping_interval=None,
                max_size=DEFAULT_MAX_MESSAGE_SIZE,
                user_agent_header=None,
                ssl=tls,
            )
        except InvalidStatus as exc:
            raise HandshakeError(_refusal_text(url, exc), status=exc.response.status_code) from exc
        except ssl.SSLCertVerificationError as exc:
            raise HandshakeError(
                f"cannot connect to {url}: TLS certificate verification failed: "
                f"{exc.verify_message or exc.reason}"
            ) from exc
        except ssl.SSLError as exc:
            raise HandshakeError(
                f"cannot connect to {url}: TLS handshake failed: {exc.reason or exc} "
                "(does the server serve wss://?)"
            ) from exc
        except (OSError, TimeoutError, ValueError, websockets.WebSocketException) as exc:
            raise HandshakeError(f"cannot connect to {url}: {_failure_text(url, exc)}") from exc
        sock = ws.transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(ws, url)

    async def send(self, data: bytes) -> None:
        try:
            if len(data) <= SEND_FRAGMENT:
                await self._ws.send(data, text=True)
            else:
                # In fragments, each framed and written as the socket drains: whole,
                # the library would hold the text masked and framed besides. Upstream
                # accepts fragmented messages; a single frame over 16 MiB it refuses.
                # A task of its own, so a caller that stops waiting cannot cut the
                # message short (the next message would break the connection).
                view = memoryview(data)
                pieces = (view[i : i + SEND_FRAGMENT] for i in range(0, len(view), SEND_FRAGMENT))
                sending = asyncio.ensure_future(self._ws.send(pieces, text=True))
                sending.add_done_callback(_seen)
                await asyncio.shield(sending)
        except ConnectionClosed as exc:
            raise ConnectionLostError(_closed_text(exc)) from exc

    async def recv(self) -> bytes | bytearray | str | None:
        try:
            return await self._ws.recv(decode=False)
        except ConnectionClosedOK:
            return None
        except ConnectionClosed as exc:
            raise ConnectionLostError(_closed_text(exc)) from exc

    async def aclose(self) -> None:
        await self._ws.close()

    def describe(self) -> str:
        return self._url


def _seen(task: asyncio.Future[None]) -> None:
    """A shielded send's outcome is its caller's: no "exception never retrieved"."""
    if not task.cancelled():
        task.exception()


def _closed_text(exc: ConnectionClosed) -> str:
    if exc.rcvd is None and exc.sent is None:
        return "connection closed without a close frame"
    return str(exc)


def _failure_text(url: str, exc: BaseException) -> str:
    """``str(exc)``, or what happened when it is empty (a reset has none)."""
    text = str(exc)
    if not text:
        if isinstance(exc, ConnectionResetError):
            text = "connection reset by the server"
        elif isinstance(exc, TimeoutError):
            text = "timed out"
        else:
            text = type(exc).__name__
    if url.startswith("wss://") and isinstance(exc, ConnectionError):
        text += " during the TLS handshake (does the server serve wss://?)"
    return text


def _refusal_text(url: str, exc: InvalidStatus) -> str:
    response = exc.response
    text = f"{url} refused the connection: HTTP {response.status_code} {response.reason_phrase}"
    body = response.body.decode("utf-8", "replace").strip() if response.body else ""
    if body:
        text += f": {body[:200]}"
    if response.status_code == 401:
        text += " (pass the server's token: token=... / --token-file / EXEC_SERVER_TOKEN)"
    return text


class StdioTransport:
    """A child ``exec-server serve --listen stdio``; newline-delimited JSON on its pipes."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc
        assert proc.stdin is not None and proc.stdout is not None
        self._stdin = proc.stdin
        self._stdout = proc.stdout

    @classmethod
    async def spawn(cls, argv: Sequence[str] | None = None) -> StdioTransport:
        """Its stderr is inherited, so its logs stay visible."""
        if argv is None:
            argv = [sys.executable, "-m", "exec_server", "serve", "--listen", "stdio"]
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=DEFAULT_MAX_MESSAGE_SIZE,
        )
        return cls(proc)

    async def send(self, data: bytes) -> None:
        try:
            self._stdin.write(data)  # no joined copy of a big message
            self._stdin.write(b"\n")
            await self._stdin.drain()
        except (ConnectionError, BrokenPipeError) as exc:
            raise ConnectionLostError("stdio server closed its stdin") from exc

    async def recv(self) -> bytes | str | None:
        try:
            line = await self._stdout.readline()
        except (ValueError, asyncio.LimitOverrunError) as exc:
            raise ConnectionLostError("message exceeds the size limit") from exc
        return line or None

    async def aclose(self) -> None:
        """Close stdin (the server exits at EOF) and reap it; kill it if it lingers."""
        if not self._stdin.is_closing():
            self._stdin.close()
        with contextlib.suppress(ConnectionError):
            await self._stdin.wait_closed()
        try:
            await asyncio.wait_for(self._proc.wait(), _STDIO_EXIT_GRACE)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            await self._proc.wait()

    def describe(self) -> str:
        return f"stdio server pid {self._proc.pid}"
