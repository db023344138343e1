"""``process/*`` handlers: wire structs ↔ :class:`ProcessManager` calls.

``process/start`` validates in PROTOCOL.md §8.1's order. The request's generation
(CLIENT_COMPAT.md §1.2 rule 4) picks the result member (``sandbox`` vs
``sandboxType``) and whether ``sandboxDenied`` is reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

import msgspec

from exec_server.exceptions import InternalError, InvalidParamsError, u64_param
from exec_server.process.envpolicy import child_env
from exec_server.process.events import Snapshot
from exec_server.process.spec import LaunchSpec
from exec_server.protocol.paths import PathForm, parse_wire_path
from exec_server.protocol.types import process as t
from exec_server.protocol.types.sandbox import (
    CurrentSandboxContext,
    SandboxContext,
    decode_launch_sandbox,
    sandbox_raw,
)
from exec_server.server.notifications import denial
from exec_server.server.router import RequestContext, Router

__all__ = ["is_current_start", "register"]

_CURRENT_ONLY_FIELDS = (
    "env_policy", "metadata", "pipe_stdin", "enforce_managed_network",
    "managed_network", "network_proxy", "shell_snapshot",
)


def is_current_start(
    params: t.StartParams, cwd_form: PathForm, sandbox: SandboxContext | None
) -> bool:
    """CLIENT_COMPAT.md §1.2 rule 4: does this ``process/start`` come from the current client?"""
    if cwd_form is PathForm.URI:
        return True
    if any(getattr(params, name) is not msgspec.UNSET for name in _CURRENT_ONLY_FIELDS):
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


async def handle_start(ctx: RequestContext, params: t.StartParams) -> t.StartResult:
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
    env = child_env(policy if isinstance(policy, msgspec.Struct) else None, params.env, os.environ)
    spec = LaunchSpec(
        argv=list(params.argv),
        cwd=cwd,
        env=env,
        tty=params.tty,
        arg0=params.arg0,
        pipe_stdin=params.pipe_stdin is True and not params.tty,
    )
    sandboxes = ctx.services.sandbox
    if sandboxes is not None:
        spec = await sandboxes.aprepare(spec, sandbox)
    elif sandbox is not None:
        raise InternalError("failed to build sandbox launch: no sandbox support in this server")
    await ctx.session.processes.start(params.process_id, spec, report_denial=current)
    kind = spec.sandbox_type
    if current:
        return t.StartResult(process_id=params.process_id, sandbox_type=kind.camel)
    return t.StartResult(process_id=params.process_id, sandbox=kind.value)


async def handle_read(ctx: RequestContext, params: t.ReadParams) -> t.ReadResult:
    after_seq = u64_param(params.after_seq, "afterSeq") or 0
    max_bytes = u64_param(params.max_bytes, "maxBytes")
    wait_ms = u64_param(params.wait_ms, "waitMs") or 0
    manager = ctx.session.processes
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


def _read_result(snapshot: Snapshot) -> t.ReadResult:
    return t.ReadResult(
        chunks=snapshot.chunks,
        next_seq=snapshot.next_seq,
        exited=snapshot.exited,
        exit_code=snapshot.exit_code,
        closed=snapshot.closed,
        sandbox_denied=denial(snapshot.sandbox_denied),
    )


def _write_id(params: t.WriteParams) -> str | None:
    if params.write_id is msgspec.UNSET:
        return None
    write_id = str(params.write_id)
    if not write_id:
        raise InvalidParamsError("writeId must not be empty")
    return write_id


async def handle_write(ctx: RequestContext, params: t.WriteParams) -> t.WriteResult:
    status = await ctx.session.processes.write(params.process_id, params.chunk, _write_id(params))
    return t.WriteResult(status=status)


async def handle_terminate(ctx: RequestContext, params: t.TerminateParams) -> t.TerminateResult:
    return t.TerminateResult(running=ctx.session.processes.terminate(params.process_id))


async def handle_signal(ctx: RequestContext, params: t.SignalParams) -> t.SignalResult:
    ctx.session.processes.signal(params.process_id, signal.SIGINT)
    return t.SignalResult()


async def handle_resize_pty(ctx: RequestContext, params: t.ResizePtyParams) -> t.ResizePtyResult:
    """Extension (upstream reserves the name, unimplemented): see docs/processes.md."""
    ctx.session.processes.resize(params.process_id, params.rows, params.cols)
    return t.ResizePtyResult()


async def handle_close_stdin(ctx: RequestContext, params: t.CloseStdinParams) -> t.CloseStdinResult:
    """Extension: end of input for a ``pipeStdin`` child (the protocol has no EOF)."""
    ctx.session.processes.close_stdin(params.process_id)
    return t.CloseStdinResult()


def register(router: Router) -> None:
    router.add(t.METHOD_START, t.StartParams, handle_start, "exec")
    router.add(t.METHOD_READ, t.ReadParams, handle_read, "exec", may_block=True)
    router.add(t.METHOD_WRITE, t.WriteParams, handle_write, "exec")
    router.add(t.METHOD_TERMINATE, t.TerminateParams, handle_terminate, "exec")
    router.add(t.METHOD_SIGNAL, t.SignalParams, handle_signal, "exec")
    router.add(t.METHOD_RESIZE_PTY, t.ResizePtyParams, handle_resize_pty, "exec")
    router.add(t.METHOD_CLOSE_STDIN, t.CloseStdinParams, handle_close_stdin, "exec")
