"""``fs/open``, ``fs/readBlock``, ``fs/writeBlock``, ``fs/close`` (PROTOCOL_CURRENT §4-§5).

Handles belong to the connection (``Attachment.file_handles``), closed when it ends.
"""

from __future__ import annotations

import functools
from typing import Final

from exec_server.exceptions import InvalidParamsError
from exec_server.fs.handles import FileHandles
from exec_server.protocol.paths import parse_wire_path
from exec_server.protocol.types import fs as t
from exec_server.server.handlers.fs import sandbox_route
from exec_server.server.router import RequestContext, Router

__all__ = ["register"]

_U64_MAX: Final = 2**64 - 1
_EMPTY: Final = t.EmptyResult()


def _handles(ctx: RequestContext) -> FileHandles:
    attachment = ctx.attachment
    handles = attachment.file_handles
    if handles is None:
        handles = attachment.file_handles = FileHandles()
    return handles


def _offset(offset: int) -> int:
    if offset > _U64_MAX:
        raise InvalidParamsError("invalid number")  # serde's text for a u64 overflow
    return offset


async def open_file(ctx: RequestContext, params: t.OpenParams) -> t.OpenResult:
    handles = _handles(ctx)
    handle = handles.reserve(params.handle_id)
    try:
        path = parse_wire_path(params.path)
        route = await sandbox_route(ctx, params.sandbox)
        install = functools.partial(handles.install, handle)
        await ctx.services.fs_service.open_handle(path.path, params.mode, install, route)
    except BaseException:
        handles.release(params.handle_id, handle)
        raise
    return t.OpenResult(handle_id=params.handle_id)


async def read_block(ctx: RequestContext, params: t.ReadBlockParams) -> t.ReadBlockResult:
    offset = _offset(params.offset)
    chunk, eof = await ctx.services.fs_service.pool.run(
        _handles(ctx).read_block, params.handle_id, offset, params.length
    )
    return t.ReadBlockResult(chunk=chunk, eof=eof)


async def write_block(ctx: RequestContext, params: t.WriteBlockParams) -> t.EmptyResult:
    offset = _offset(params.offset)
    await ctx.services.fs_service.pool.run(
        _handles(ctx).write_block, params.handle_id, offset, params.chunk
    )
    return _EMPTY


async def close_file(ctx: RequestContext, params: t.CloseParams) -> t.EmptyResult:
    await ctx.services.fs_service.pool.run(_handles(ctx).close, params.handle_id)
    return _EMPTY


def register(router: Router) -> None:
    router.add(t.METHOD_OPEN, t.OpenParams, open_file, "filesystem")
    router.add(t.METHOD_READ_BLOCK, t.ReadBlockParams, read_block, "filesystem")
    router.add(t.METHOD_WRITE_BLOCK, t.WriteBlockParams, write_block, "filesystem")
    router.add(t.METHOD_CLOSE, t.CloseParams, close_file, "filesystem")
