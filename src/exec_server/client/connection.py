"""``ExecServerClient``: an asyncio JSON-RPC client for an exec-server. One reader task
resolves calls by id (replies come in any order) and routes notifications to handles."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from ssl import SSLContext
from typing import Final, TypeVar, Unpack, final

import msgspec

from exec_server.client._opening import AsyncClosing, opening
from exec_server.client._transport import (
    StdioTransport,
    Transport,
    WebSocketTransport,
)
from exec_server.client.errors import (
    ClientClosedError,
    ConnectionLostError,
    HandshakeError,
    NotSupportedError,
    ServerProtocolError,
)
from exec_server.client.http import HeaderArg, HttpResponse, body_failed, request_headers
from exec_server.client.process import (
    CompletedProcess,
    ProcessHandle,
    starting,
)
from exec_server.client.run import RunOptions, run_command
from exec_server.exceptions import ExecServerError, MethodNotFoundError, error_for_code
from exec_server.protocol.codec import (
    ProtocolError,
    decode_message,
    decode_result,
    encode_notification,
    encode_request,
)
from exec_server.protocol.messages import ErrorResponse, InitializeParams, Notification, Response
from exec_server.protocol.paths import PathForm, render_path
from exec_server.protocol.types import process as p
from exec_server.protocol.types.http import (
    BUFFERED_REQUEST_ID,
    METHOD_HTTP_REQUEST,
    NOTIFY_BODY_DELTA,
    BodyDelta,
    HttpRequestParams,
    HttpRequestResult,
)
from exec_server.protocol.types.sandbox import encode_client_context

__all__ = [
    "DEFAULT_CLIENT_NAME",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_INITIALIZE_TIMEOUT",
    "ExecServerClient",
    "InitializeResult",
]

logger = logging.getLogger("exec_server.client")

T = TypeVar("T")

DEFAULT_CLIENT_NAME: Final = "exec-server-client"
#: PROTOCOL.md §14: client connect / initialize timeouts (seconds).
DEFAULT_CONNECT_TIMEOUT: Final = 5.0
DEFAULT_INITIALIZE_TIMEOUT: Final = 5.0

_METHOD_INITIALIZE: Final = "initialize"
_NOTIFY_INITIALIZED: Final = "initialized"
#: no server knows this process: any answer but -32601 means the extension exists.
_PROBE_ID: Final = "exec-server-client-probe"
_PROBES: Final[dict[str, msgspec.Struct]] = {
    p.METHOD_RESIZE_PTY: p.ResizePtyParams(process_id=_PROBE_ID, rows=1, cols=1),
    p.METHOD_CLOSE_STDIN: p.CloseStdinParams(process_id=_PROBE_ID),
}


class InitializeResult(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """``environmentInfo`` (raw JSON) comes only from current-generation servers."""

    session_id: str
    environment_info: msgspec.Raw = msgspec.Raw()


class _Empty(msgspec.Struct, frozen=True):
    pass


_Event = p.OutputNotification | p.ExitedNotification | p.ClosedNotification
#: notification method -> decoder of its params.
_DECODERS: Final[dict[str, msgspec.json.Decoder[_Event | BodyDelta]]] = {
    p.NOTIFY_OUTPUT: msgspec.json.Decoder(p.OutputNotification),
    p.NOTIFY_EXITED: msgspec.json.Decoder(p.ExitedNotification),
    p.NOTIFY_CLOSED: msgspec.json.Decoder(p.ClosedNotification),
    NOTIFY_BODY_DELTA: msgspec.json.Decoder(BodyDelta),
}

#: opens the connection again (for ``reconnect()``) within a timeout in seconds.
_Reopen = Callable[[float], Awaitable[Transport]]


@final
class ExecServerClient(AsyncClosing):
    """A connection (plus session) to one exec-server: :meth:`connect` or
    :meth:`spawn_stdio`, then :meth:`aclose` or ``async with``."""

    def __init__(
        self,
        transport: Transport,
        *,
        client_name: str = DEFAULT_CLIENT_NAME,
        url: str | None = None,
        reopen: _Reopen | None = None,
    ) -> None:
        self._transport = transport
        self._client_name = client_name
        #: the WebSocket URL, or None for a stdio server
        self.url = url
        self._reopen = reopen
        self._next_id = 0
        self._pending: dict[int | str, asyncio.Future[Response | ErrorResponse]] = {}
        self._handles: dict[str, ProcessHandle] = {}
        self._http_bodies: dict[str, asyncio.Queue[BodyDelta | Exception]] = {}
        self._next_http_id = 0
        self._lost: ConnectionLostError | None = None
        self._closed = False
        self._session_id: str | None = None
        self._disconnecting = False
        self.initialize_result: InitializeResult | None = None
        #: extension method -> implemented (learnt from the first answer)
        self._extensions: dict[str, bool] = {}
        self._reader = asyncio.create_task(self._read_loop(transport))

    @classmethod
    @opening
    async def connect(
        cls,
        url: str,
        *,
        client_name: str = DEFAULT_CLIENT_NAME,
        resume_session_id: str | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        initialize_timeout: float = DEFAULT_INITIALIZE_TIMEOUT,
        token: str | None = None,
        ssl: SSLContext | None = None,
    ) -> ExecServerClient:
        """Connect to ``ws://HOST:PORT`` (or ``wss://``, verified by ``ssl``, default the
        system's CAs) and run ``initialize``; ``token`` is the server's ``--ws-auth`` token.
        ``HandshakeError`` if that fails, ``InvalidRequestError`` for a refused resume."""

        async def reopen(limit: float) -> Transport:
            try:
                async with asyncio.timeout(limit):
                    return await WebSocketTransport.open(url, token=token, ssl_context=ssl)
            except TimeoutError as exc:
                raise HandshakeError(f"connecting to {url} timed out after {limit} s") from exc

        client = cls(await reopen(connect_timeout), client_name=client_name, url=url, reopen=reopen)
        return await client._start(resume_session_id, initialize_timeout)

    @classmethod
    @opening
    async def spawn_stdio(
        cls,
        argv: Sequence[str] | None = None,
        *,
        client_name: str = DEFAULT_CLIENT_NAME,
        initialize_timeout: float = DEFAULT_INITIALIZE_TIMEOUT,
    ) -> ExecServerClient:
        """Start ``python -m exec_server serve --listen stdio`` (or ``argv``) and connect;
        ``aclose()`` ends the child."""
        client = cls(await StdioTransport.spawn(argv), client_name=client_name)
        return await client._start(None, initialize_timeout)

    async def _start(self, resume_session_id: str | None, limit: float) -> ExecServerClient:
        try:
            await self._handshake(resume_session_id, limit)
        except BaseException:
            await self.aclose()
            raise
        return self

    async def _handshake(self, resume: str | None, limit: float) -> None:
        params = InitializeParams(client_name=self._client_name, resume_session_id=resume)
        try:
            async with asyncio.timeout(limit):
                result = await self.call(_METHOD_INITIALIZE, params, InitializeResult)
        except TimeoutError as exc:
            raise HandshakeError(f"initialize timed out after {limit} s") from exc
        except ConnectionLostError as exc:
            raise HandshakeError(f"connection lost during initialize: {exc}") from exc
        self.initialize_result = result
        self._session_id = result.session_id
        await self.notify(_NOTIFY_INITIALIZED, _Empty())

    @property
    def session_id(self) -> str:
        assert self._session_id is not None
        return self._session_id

    @property
    def connected(self) -> bool:
        return not self._closed and self._lost is None

    def __repr__(self) -> str:
        state = "closed" if self._closed else "lost" if self._lost else "connected"
        return (
            f"<ExecServerClient {self._transport.describe()} {state} "
            f"session={self._session_id} processes={len(self._handles)}>"
        )

    async def aclose(self) -> None:
        """Close; the server keeps the session's processes for its detach TTL (§4.6)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            await self._transport.aclose()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        self._fail_all(ClientClosedError("client closed"))

    async def disconnect(self) -> None:
        """Drop the transport (calls fail with :class:`ConnectionLostError`) but keep
        the client for :meth:`reconnect`."""
        self._disconnecting = True
        try:
            with contextlib.suppress(Exception):
                await self._transport.aclose()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        finally:
            self._disconnecting = False

    async def reconnect(self) -> None:
        """Resume this session on a new connection; handles catch up from their cursors.
        Raises as :meth:`connect` (the session may have expired)."""
        if self._closed:
            raise ClientClosedError("client closed")
        if self._reopen is None:
            raise HandshakeError("a stdio client cannot reconnect")
        await self.disconnect()
        transport = await self._reopen(DEFAULT_CONNECT_TIMEOUT)
        self._transport = transport
        self._lost = None
        self._reader = asyncio.create_task(self._read_loop(transport))
        try:
            await self._handshake(self.session_id, DEFAULT_INITIALIZE_TIMEOUT)
        except BaseException:
            await self.disconnect()
            raise
        for handle in list(self._handles.values()):
            handle._on_resumed()

    async def call(self, method: str, params: msgspec.Struct | None, result_type: type[T]) -> T:
        """Send one request and decode its result as ``result_type``; an error answer
        raises its :mod:`exec_server.exceptions` class."""
        if self._closed:
            raise ClientClosedError("client closed")
        if self._lost is not None:
            raise ConnectionLostError(self._lost.reason)
        self._next_id += 1
        request_id = self._next_id
        fut: asyncio.Future[Response | ErrorResponse] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = fut
        try:
            await self._transport.send(encode_request(request_id, method, params))
            reply = await fut
        finally:
            self._pending.pop(request_id, None)
        if isinstance(reply, ErrorResponse):
            raise error_for_code(reply.error.code, reply.error.message)
        try:
            return decode_result(reply.result, result_type)
        except msgspec.ValidationError as exc:
            raise ServerProtocolError(f"unexpected {method} result: {exc}") from exc

    async def notify(self, method: str, params: msgspec.Struct | None = None) -> None:
        if self._closed:
            raise ClientClosedError("client closed")
        await self._transport.send(encode_notification(method, params))

    async def _read_loop(self, transport: Transport) -> None:
        reason: str | None = None
        try:
            while True:
                data = await transport.recv()
                if data is None:
                    reason = (
                        "disconnected by the client"
                        if self._disconnecting
                        else "server closed the connection"
                    )
                    break
                try:
                    msg = decode_message(data)
                except ProtocolError as exc:
                    logger.warning("ignoring malformed message from server: %s", exc.message)
                    continue
                if isinstance(msg, Notification):
                    self._dispatch(msg)
                elif isinstance(msg, Response | ErrorResponse):
                    fut = self._pending.get(msg.id)
                    if fut is not None and not fut.done():
                        fut.set_result(msg)
        except ConnectionLostError as exc:
            reason = exc.reason
        finally:
            if transport is self._transport and not self._closed:
                self._lost = ConnectionLostError(reason)
                self._fail_all(self._lost)

    def _fail_all(self, exc: Exception) -> None:
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(exc)
        for handle in self._handles.values():
            handle._on_failure(exc)
        for body in self._http_bodies.values():
            body.put_nowait(exc)

    def _dispatch(self, msg: Notification) -> None:
        decoder = _DECODERS.get(msg.method)
        if decoder is None or msg.params is None:
            logger.debug("ignoring notification %s", msg.method)
            return
        try:
            event = decoder.decode(msg.params)
        except msgspec.ValidationError as exc:
            logger.warning("ignoring malformed %s notification: %s", msg.method, exc)
            return
        if isinstance(event, BodyDelta):
            body = self._http_bodies.get(event.request_id)
            if body is not None:
                body.put_nowait(event)
            return
        handle = self._handles.get(event.process_id)
        if handle is not None:
            handle._on_event(event)

    async def http_request(
        self,
        method: str,
        url: str,
        *,
        headers: Sequence[HeaderArg] = (),
        body: bytes | None = None,
        timeout_ms: int | None = None,
        follow_redirects: bool = True,
        stream: bool = False,
    ) -> HttpResponse:
        """Have the server send an HTTP request (``http/request``); ``stream=True`` returns
        at the head. ``InvalidParamsError`` if refused, ``InternalError`` if it failed."""
        if stream:
            self._next_http_id += 1
        request_id = f"http-{self._next_http_id}" if stream else BUFFERED_REQUEST_ID
        params = HttpRequestParams(
            method=method,
            url=url,
            request_id=request_id,
            headers=request_headers(headers),
            body_base64=body,
            timeout_ms=timeout_ms,
            redirect_policy="follow" if follow_redirects else "stop",
            stream_response=stream,
        )
        queue: asyncio.Queue[BodyDelta | Exception] = asyncio.Queue()
        if stream:  # registered before sending: deltas may arrive right behind the answer
            self._http_bodies[request_id] = queue
        try:
            result = await self.call(METHOD_HTTP_REQUEST, params, HttpRequestResult)
        except BaseException:
            self._http_bodies.pop(request_id, None)
            raise
        pairs = [(h.name, h.value) for h in result.headers]
        if not stream:
            return HttpResponse(result.status, pairs, result.body_base64)

        async def close() -> None:
            self._http_bodies.pop(request_id, None)

        return HttpResponse(result.status, pairs, chunks=self._body(request_id, queue), close=close)

    async def _body(
        self, request_id: str, queue: asyncio.Queue[BodyDelta | Exception]
    ) -> AsyncIterator[bytes]:
        expected = 1
        try:
            while True:
                item = await queue.get()
                if isinstance(item, Exception):
                    raise item
                if item.seq != expected:
                    raise ServerProtocolError(
                        f"http/request/bodyDelta for {request_id}: seq {item.seq}, "
                        f"expected {expected}"
                    )
                expected += 1
                if item.done:
                    if item.error is not None:
                        raise body_failed(item.error)
                    return
                if item.delta_base64:
                    yield item.delta_base64
        finally:
            self._http_bodies.pop(request_id, None)

    async def start_process(self, params: p.StartParams) -> p.StartResult:
        """Prefer :meth:`spawn`, which also returns a handle."""
        return await self.call(p.METHOD_START, params, p.StartResult)

    async def read_process(self, params: p.ReadParams) -> p.ReadResult:
        return await self.call(p.METHOD_READ, params, p.ReadResult)

    async def write_process(self, params: p.WriteParams) -> p.WriteResult:
        return await self.call(p.METHOD_WRITE, params, p.WriteResult)

    async def terminate_process(self, params: p.TerminateParams) -> p.TerminateResult:
        return await self.call(p.METHOD_TERMINATE, params, p.TerminateResult)

    async def signal_process(self, params: p.SignalParams) -> p.SignalResult:
        return await self.call(p.METHOD_SIGNAL, params, p.SignalResult)

    async def resize_pty(self, process_id: str, rows: int, cols: int) -> None:
        params = p.ResizePtyParams(process_id=process_id, rows=rows, cols=cols)
        await self._extension(p.METHOD_RESIZE_PTY, params, p.ResizePtyResult)

    async def close_stdin(self, process_id: str) -> None:
        params = p.CloseStdinParams(process_id=process_id)
        await self._extension(p.METHOD_CLOSE_STDIN, params, p.CloseStdinResult)

    async def supports(self, method: str) -> bool:
        """Whether the server implements extension ``method`` (asked once per connection)."""
        known = self._extensions.get(method)
        if known is not None:
            return known
        if method not in _PROBES:
            raise ValueError(f"not an extension method: {method}")
        try:
            await self._extension(method, _PROBES[method], _Empty)
        except NotSupportedError:
            return False
        except ExecServerError:
            pass
        self._extensions[method] = True
        return True

    async def _extension(self, method: str, params: msgspec.Struct, result: type[T]) -> T:
        if self._extensions.get(method) is False:
            raise NotSupportedError(f"the server does not implement {method}")
        try:
            reply = await self.call(method, params, result)
        except MethodNotFoundError as exc:
            self._extensions[method] = False
            raise NotSupportedError(f"the server does not implement {method}") from exc
        self._extensions[method] = True
        return reply

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        env_policy: p.EnvPolicy | None = None,
        tty: bool = False,
        pipe_stdin: bool = False,
        arg0: str | None = None,
        process_id: str | None = None,
        sandbox: msgspec.Struct | None = None,
    ) -> ProcessHandle:
        """Start a process and return its handle (docs/client.md, "Process handles"):
        ``env`` is the whole environment unless ``env_policy`` filters the *server's*;
        ``sandbox`` is a context from :mod:`exec_server.client.sandbox_contexts`."""
        with starting(self, self._handles, argv, cwd, process_id, tty) as (work_dir, handle):
            sandbox_json = b"null" if sandbox is None else encode_client_context(sandbox)
            params = p.StartParams(
                process_id=handle.process_id,
                argv=list(argv),
                cwd=render_path(work_dir, PathForm.URI),
                env=dict(env or {}),
                tty=tty,
                arg0=arg0,
                sandbox=msgspec.Raw(sandbox_json),
                env_policy=env_policy if env_policy is not None else msgspec.UNSET,
                pipe_stdin=pipe_stdin,
            )
            await self.start_process(params)
        return handle

    async def run(
        self, cmd: str | Sequence[str], **options: Unpack[RunOptions]
    ) -> CompletedProcess:
        """Run ``cmd`` to completion; ``options`` are :class:`~exec_server.client.run.RunOptions`
        (``ProcessTimeoutError`` on ``timeout``, ``ProcessError`` with ``check``)."""
        return await run_command(self.spawn, cmd, **options)

    def list_processes(self) -> list[ProcessHandle]:
        """This client's processes (started or adopted) that are not closed yet."""
        return list(self._handles.values())

    def adopt(self, process_id: str, *, tty: bool = False, after_seq: int = 0) -> ProcessHandle:
        """A handle for a process started earlier in this session, reading from
        ``after_seq`` (0: the oldest retained output)."""
        if process_id in self._handles:
            raise ValueError(f"process {process_id} already has a handle")
        handle = ProcessHandle(self, process_id, tty=tty, after_seq=after_seq)
        handle._need_read = True
        self._handles[process_id] = handle
        return handle

    def _release(self, process_id: str) -> None:
        self._handles.pop(process_id, None)
