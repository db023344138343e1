"""``ExecBackend``: one interface to start processes, over a client or in this process
(the server's own ``ProcessManager``, feeding the same :class:`ProcessHandle` class)."""

from __future__ import annotations

import contextlib
import os
import signal as _signal
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, Unpack, final, runtime_checkable

import msgspec

from exec_server.client.connection import ExecServerClient
from exec_server.client.errors import ClientClosedError
from exec_server.client.http import HttpOptions, HttpResponse, body_failed, request_headers
from exec_server.client.process import (
    CompletedProcess,
    ProcessHandle,
    SpawnOptions,
    starting,
)
from exec_server.client.run import RunOptions, run_command
from exec_server.config import ServerConfig
from exec_server.exceptions import InvalidParamsError, from_domain_error
from exec_server.http.errors import HttpBodyFailed, HttpError
from exec_server.process.errors import ProcessError
from exec_server.process.events import Exited, Output, ProcessEvent
from exec_server.process.spec import LaunchSpec
from exec_server.protocol.types import process as p
from exec_server.protocol.types.sandbox import decode_launch_sandbox, encode_client_context
from exec_server.sandbox.errors import SandboxError

if TYPE_CHECKING:
    from exec_server.http.client import HttpClient
    from exec_server.http.client import HttpResponse as RawHttpResponse
    from exec_server.process.manager import ProcessManager
    from exec_server.sandbox.manager import SandboxManager

__all__ = ["ExecBackend", "LocalExecBackend", "RemoteExecBackend"]


def _notification(
    event: ProcessEvent,
) -> p.OutputNotification | p.ExitedNotification | p.ClosedNotification:
    if isinstance(event, Output):
        return p.OutputNotification(
            process_id=event.process_id, seq=event.seq, stream=event.stream, chunk=event.data
        )
    if isinstance(event, Exited):
        denied = msgspec.UNSET if event.sandbox_denied is None else event.sandbox_denied
        return p.ExitedNotification(
            process_id=event.process_id, seq=event.seq, exit_code=event.exit_code,
            sandbox_denied=denied,
        )
    return p.ClosedNotification(process_id=event.process_id, seq=event.seq)


@runtime_checkable
class ExecBackend(Protocol):
    """Starts processes and hands back :class:`ProcessHandle` objects."""

    @property
    def is_remote(self) -> bool: ...

    async def start(self, argv: Sequence[str], **options: Unpack[SpawnOptions]) -> ProcessHandle:
        """Start ``argv``; the arguments are :meth:`ExecServerClient.spawn`'s."""

    async def http_request(
        self, method: str, url: str, **options: Unpack[HttpOptions]
    ) -> HttpResponse:
        """Send an HTTP request from the environment's host (as the client's)."""

    async def run(
        self, cmd: str | Sequence[str], **options: Unpack[RunOptions]
    ) -> CompletedProcess:
        """Run to completion; the arguments are :meth:`ExecServerClient.run`'s."""

    def list_processes(self) -> list[ProcessHandle]:
        """Processes started through this backend that are not closed yet."""

    async def aclose(self) -> None:
        """Remote: close the connection; local: kill the children."""


@final
class RemoteExecBackend:
    """Processes on an exec-server, through ``client``."""

    is_remote = True

    def __init__(self, client: ExecServerClient) -> None:
        self.client = client

    async def start(self, argv: Sequence[str], **options: Unpack[SpawnOptions]) -> ProcessHandle:
        return await self.client.spawn(argv, **options)

    async def http_request(
        self, method: str, url: str, **options: Unpack[HttpOptions]
    ) -> HttpResponse:
        return await self.client.http_request(method, url, **options)

    async def run(
        self, cmd: str | Sequence[str], **options: Unpack[RunOptions]
    ) -> CompletedProcess:
        return await self.client.run(cmd, **options)

    def list_processes(self) -> list[ProcessHandle]:
        return self.client.list_processes()

    async def aclose(self) -> None:
        await self.client.aclose()


@final
class LocalExecBackend:
    """Processes run by an in-process :class:`ProcessManager` (no server, no socket)."""

    is_remote = False

    def __init__(self, config: ServerConfig | None = None) -> None:
        from exec_server.process.manager import ProcessManager

        self._config = config or ServerConfig()
        self._sandbox_manager: SandboxManager | None = None
        self._manager: ProcessManager = ProcessManager(self._config)
        self._manager.set_sink(self._on_event)
        self._handles: dict[str, ProcessHandle] = {}
        self._http: HttpClient | None = None
        self._closed = False

    async def _on_event(self, event: ProcessEvent) -> None:
        handle = self._handles.get(event.process_id)
        if handle is not None:
            handle._on_event(_notification(event))

    async def start(
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
        from exec_server.process import envpolicy

        if self._closed:
            raise ClientClosedError("backend closed")
        # The server validates these in its handler (PROTOCOL.md §8.1 step 2); same here.
        if not argv:
            raise InvalidParamsError("argv must not be empty")
        # Local mode: "the server's environment" is this process's.
        child_env = envpolicy.child_env(env_policy, env or {}, os.environ)
        with starting(self, self._handles, argv, cwd, process_id, tty) as (work_dir, handle):
            spec = LaunchSpec(argv=list(argv), cwd=work_dir, env=child_env, tty=tty, arg0=arg0,
                              pipe_stdin=pipe_stdin)
            if sandbox is not None:
                spec = await self._confine(spec, sandbox)
            with _wire_errors():
                await self._manager.start(handle.process_id, spec, report_denial=True)
        return handle

    async def _confine(self, spec: LaunchSpec, sandbox: msgspec.Struct) -> LaunchSpec:
        from exec_server.sandbox.manager import SandboxManager

        ctx = decode_launch_sandbox(encode_client_context(sandbox))
        if self._sandbox_manager is None:
            self._sandbox_manager = SandboxManager(self._config)
        with _wire_errors():
            return await self._sandbox_manager.aprepare(spec, ctx)

    async def http_request(
        self, method: str, url: str, **options: Unpack[HttpOptions]
    ) -> HttpResponse:
        """Send from this process, validated as the server validates ``http/request``."""
        from exec_server.http.client import HttpClient
        from exec_server.http.request import HeaderSpec, build_request

        if self._closed:
            raise ClientClosedError("backend closed")
        headers = request_headers(options.get("headers", ()))
        specs = [HeaderSpec(h.name, h.value, h.value_env_var) for h in headers]
        body, timeout_ms = options.get("body"), options.get("timeout_ms")
        follow_redirects = options.get("follow_redirects", True)
        try:
            request = build_request(
                method, url, specs, body, timeout_ms, follow_redirects, os.environ
            )
            if self._http is None:
                self._http = HttpClient()
            raw = await self._http.send(request)
        except HttpError as exc:
            raise _wire(exc) from None
        if not options.get("stream", False):
            try:
                data = await raw.read()
            except HttpError as exc:
                raise _wire(exc) from None
            finally:
                await raw.aclose()
            return HttpResponse(raw.status, raw.headers, data)
        return HttpResponse(raw.status, raw.headers, chunks=_local_body(raw), close=raw.aclose)

    async def run(
        self, cmd: str | Sequence[str], **options: Unpack[RunOptions]
    ) -> CompletedProcess:
        """As :meth:`ExecServerClient.run`; the policy's "server" is this process."""
        return await run_command(self.start, cmd, **options)

    def list_processes(self) -> list[ProcessHandle]:
        return list(self._handles.values())

    async def aclose(self) -> None:
        """Kill every process this backend started (PROTOCOL.md §8.11)."""
        if self._closed:
            return
        self._closed = True
        if self._http is not None:
            await self._http.aclose()
        await self._manager.shutdown()
        for handle in self._handles.values():
            handle._on_failure(ClientClosedError("backend closed"))
        self._handles.clear()

    # The client's typed process calls, which the handles use.

    async def read_process(self, params: p.ReadParams) -> p.ReadResult:
        with _wire_errors():
            snap = await self._manager.read(
                params.process_id, after_seq=params.after_seq or 0, max_bytes=params.max_bytes,
                wait_ms=params.wait_ms or 0,
            )
        denied = msgspec.UNSET if snap.sandbox_denied is None else snap.sandbox_denied
        return p.ReadResult(
            chunks=snap.chunks, next_seq=snap.next_seq, exited=snap.exited,
            exit_code=snap.exit_code, closed=snap.closed, sandbox_denied=denied,
        )

    async def write_process(self, params: p.WriteParams) -> p.WriteResult:
        write_id = params.write_id or None
        status = await self._manager.write(params.process_id, params.chunk, write_id)
        return p.WriteResult(status=status)

    async def terminate_process(self, params: p.TerminateParams) -> p.TerminateResult:
        return p.TerminateResult(running=self._manager.terminate(params.process_id))

    async def signal_process(self, params: p.SignalParams) -> p.SignalResult:
        # Only ``interrupt`` exists (CLIENT_COMPAT.md §5.4).
        self._manager.signal(params.process_id, _signal.SIGINT)
        return p.SignalResult()

    async def resize_pty(self, process_id: str, rows: int, cols: int) -> None:
        if not (1 <= rows <= 65535 and 1 <= cols <= 65535):
            raise InvalidParamsError("rows and cols must be within 1..65535")
        with _wire_errors():
            self._manager.resize(process_id, rows, cols)

    async def close_stdin(self, process_id: str) -> None:
        with _wire_errors():
            self._manager.close_stdin(process_id)

    def _release(self, process_id: str) -> None:
        self._handles.pop(process_id, None)


def _wire(exc: HttpError | SandboxError | ProcessError) -> Exception:
    return from_domain_error(exc) or exc


@contextlib.contextmanager
def _wire_errors() -> Iterator[None]:
    """The server's answer to a failed process or sandbox call, as the remote backend raises."""
    try:
        yield
    except (ProcessError, SandboxError) as exc:
        raise _wire(exc) from exc


async def _local_body(raw: RawHttpResponse) -> AsyncIterator[bytes]:
    try:
        async for chunk in raw.chunks():
            yield chunk
    except HttpBodyFailed as exc:
        raise body_failed(exc.cause) from None
    finally:
        await raw.aclose()
