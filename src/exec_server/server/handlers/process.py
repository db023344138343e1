"""``process/*`` handlers: wire structs ↔ :class:`ProcessManager` calls.

Validation order of ``process/start`` follows PROTOCOL.md §8.1: argv, cwd,
sandbox transform, then the duplicate check and spawn (in the manager). The
request's generation (CLIENT_COMPAT.md §1.2 rule 4) is decided here and kept
on the process record: it picks the result member (``sandbox`` kebab-case vs
``sandboxType`` camelCase) and whether ``sandboxDenied`` is reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Final

import msgspec

from exec_server.exceptions import (
    InternalError,
    InvalidParamsError,
)
from exec_server.process.envpolicy import build_child_env
from exec_server.process.events import Snapshot
from exec_server.process.manager import ProcessManager
from exec_server.process.spec import LaunchSpec
from exec_server.protocol.paths import PathForm, parse_wire_path
from exec_server.protocol.types.process import (
    METHOD_CLOSE_STDIN,
    METHOD_READ,
    METHOD_RESIZE_PTY,
    METHOD_SIGNAL,
    METHOD_START,
    METHOD_TERMINATE,
    METHOD_WRITE,
    CloseStdinParams,
    CloseStdinResult,
    ReadParams,
    ReadResult,
    ResizePtyParams,
    ResizePtyResult,
    SignalParams,
    SignalResult,
    StartParams,
    StartResult,
    TerminateParams,
    TerminateResult,
    WriteParams,
    WriteResult,
)
from exec_server.protocol.types.sandbox import (
    CurrentSandboxContext,
    SandboxContext,
    decode_launch_sandbox,
    sandbox_raw,
)
from exec_server.server.notifications import denial
from exec_server.server.router import RequestContext, Router

__all__ = ["is_current_start", "register"]

_UNSET = msgspec.UNSET
_CURRENT_ONLY_FIELDS = (
    "env_policy",
    "metadata",
    "pipe_stdin",
    "enforce_managed_network",
    "managed_network",
    "network_proxy",
    "shell_snapshot",
)


def is_current_start(
    params: StartParams, cwd_form: PathForm, sandbox: SandboxContext | None
) -> bool:
    """CLIENT_COMPAT.md §1.2 rule 4: does this ``process/start`` come from the current client?"""
    if cwd_form is PathForm.URI:
        return True
    if any(getattr(params, name) is not _UNSET for name in _CURRENT_ONLY_FIELDS):
        return True
    return sandbox is None or isinstance(sandbox, CurrentSandboxContext)


def _parse_cwd(cwd: str) -> tuple[str, PathForm]:
    try:
        wire = parse_wire_path(cwd, normalize=False)
    except InvalidParamsError as exc:
        if cwd[:5].lower() == "file:":
            raise InvalidParamsError(
                f"cwd URI `{cwd}` is not valid on this exec-server host: {exc.message}"
            ) from exc
        raise InvalidParamsError(f"cwd must be absolute: {exc.message}") from exc
    return wire.path, wire.form


def _manager(ctx: RequestContext) -> ProcessManager:
    processes: ProcessManager = ctx.session.processes
    return processes


async def _prepare_sandbox(
    ctx: RequestContext, spec: LaunchSpec, sandbox: SandboxContext | None
) -> LaunchSpec:
    manager = ctx.services.sandbox
    if manager is None:
        if sandbox is not None:
            raise InternalError("failed to build sandbox launch: no sandbox support in this server")
        return spec
    prepared: LaunchSpec = await manager.aprepare(spec, sandbox)
    return prepared


async def handle_start(ctx: RequestContext, params: StartParams) -> StartResult:
    if not params.argv:
        raise InvalidParamsError("argv must not be empty")
    cwd, form = _parse_cwd(params.cwd)
    sandbox = decode_launch_sandbox(sandbox_raw(params.sandbox))
    current = is_current_start(params, form, sandbox)
    if params.enforce_managed_network is True:
        raise InternalError(
            "failed to build sandbox launch: enforceManagedNetwork is not supported by this "
            "exec-server (no managed network proxy)"
        )
    policy = params.env_policy
    if isinstance(policy, msgspec.Struct):
        env = build_child_env(
            inherit=policy.inherit,
            ignore_default_excludes=policy.ignore_default_excludes,
            exclude=policy.exclude,
            set_vars=policy.set,
            include_only=policy.include_only,
            env=params.env,
            server_env=os.environ,
        )
    else:
        env = dict(params.env)
    spec = LaunchSpec(
        argv=list(params.argv),
        cwd=cwd,
        env=env,
        tty=params.tty,
        arg0=params.arg0,
        pipe_stdin=params.pipe_stdin is True and not params.tty,
    )
    spec = await _prepare_sandbox(ctx, spec, sandbox)
    await _manager(ctx).start(params.process_id, spec, report_denial=current)
    kind = spec.sandbox_type
    if current:
        return StartResult(process_id=params.process_id, sandbox_type=kind.camel)
    return StartResult(process_id=params.process_id, sandbox=kind.value)


_U64_MAX: Final = 2**64 - 1


def _u64(value: int | None, name: str) -> int | None:
    """Upstream's ``u64`` bound: JSON numbers are unbounded and msgspec's ``int`` is too,
    so ``2**70`` used to be taken (a cursor past every chunk, a wait of ages) where
    upstream refuses it."""
    if value is not None and not 0 <= value <= _U64_MAX:
        raise InvalidParamsError(f"invalid value: integer `{value}`, expected u64 for `{name}`")
    return value


async def handle_read(ctx: RequestContext, params: ReadParams) -> ReadResult:
    after_seq = _u64(params.after_seq, "afterSeq") or 0
    max_bytes = _u64(params.max_bytes, "maxBytes")
    wait_ms = _u64(params.wait_ms, "waitMs") or 0
    manager = _manager(ctx)
    now = await manager.read(params.process_id, after_seq=after_seq, max_bytes=max_bytes)
    if wait_ms <= 0 or now.chunks or now.closed or (now.exited and after_seq < now.next_seq - 1):
        return _read_result(now)
    # Long poll: let later requests of this connection proceed, and give up as
    # soon as another connection resumes the session (PROTOCOL.md §8.4 step 4).
    read = asyncio.ensure_future(
        manager.read(params.process_id, after_seq=after_seq, max_bytes=max_bytes, wait_ms=wait_ms)
    )
    ctx.unblock()
    try:
        while True:
            watch = asyncio.ensure_future(ctx.session.attachment_changed.wait())
            try:
                done, _ = await asyncio.wait((read, watch), return_when=asyncio.FIRST_COMPLETED)
            finally:
                watch.cancel()
            if read in done:
                break
            ctx.ensure_attached()
    finally:
        if not read.done():
            read.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await read
    result = read.result()
    ctx.ensure_attached()
    return _read_result(result)


def _read_result(snapshot: Snapshot) -> ReadResult:
    return ReadResult(
        chunks=snapshot.chunks,
        next_seq=snapshot.next_seq,
        exited=snapshot.exited,
        exit_code=snapshot.exit_code,
        closed=snapshot.closed,
        sandbox_denied=denial(snapshot.sandbox_denied),
    )


def _write_id(params: WriteParams) -> str | None:
    if params.write_id is _UNSET:
        return None
    write_id = str(params.write_id)
    if not write_id:
        raise InvalidParamsError("writeId must not be empty")
    return write_id


async def handle_write(ctx: RequestContext, params: WriteParams) -> WriteResult:
    status = await _manager(ctx).write(params.process_id, params.chunk, _write_id(params))
    return WriteResult(status=status)


async def handle_terminate(ctx: RequestContext, params: TerminateParams) -> TerminateResult:
    return TerminateResult(running=_manager(ctx).terminate(params.process_id))


async def handle_signal(ctx: RequestContext, params: SignalParams) -> SignalResult:
    _manager(ctx).signal(params.process_id, signal.SIGINT)
    return SignalResult()


async def handle_resize_pty(ctx: RequestContext, params: ResizePtyParams) -> ResizePtyResult:
    """Extension (upstream reserves the name, unimplemented): see docs/processes.md."""
    _manager(ctx).resize(params.process_id, params.rows, params.cols)
    return ResizePtyResult()


async def handle_close_stdin(ctx: RequestContext, params: CloseStdinParams) -> CloseStdinResult:
    """Extension: end of input for a ``pipeStdin`` child (the protocol has no EOF)."""
    _manager(ctx).close_stdin(params.process_id)
    return CloseStdinResult()


def register(router: Router) -> None:
    """Add the ``process/*`` methods (family ``exec``) to ``router``."""
    router.add(METHOD_START, StartParams, handle_start, "exec")
    router.add(METHOD_READ, ReadParams, handle_read, "exec", may_block=True)
    router.add(METHOD_WRITE, WriteParams, handle_write, "exec")
    router.add(METHOD_TERMINATE, TerminateParams, handle_terminate, "exec")
    router.add(METHOD_SIGNAL, SignalParams, handle_signal, "exec")
    router.add(METHOD_RESIZE_PTY, ResizePtyParams, handle_resize_pty, "exec")
    router.add(METHOD_CLOSE_STDIN, CloseStdinParams, handle_close_stdin, "exec")
