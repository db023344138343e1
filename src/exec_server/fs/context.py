"""The route of an ``fs/*`` call (direct or confined) from its decoded ``sandbox`` member.

The one seam both the server handlers and ``LocalFileSystem`` call, so the
two route identically. The context is converted by
:func:`exec_server.sandbox.convert.fs_context`.
"""

from __future__ import annotations

from exec_server.fs.pool import WorkerPool
from exec_server.fs.service import DIRECT, FsRoute
from exec_server.protocol.types.sandbox import SandboxContext
from exec_server.sandbox.convert import fs_context

__all__ = ["route", "route_for"]


def route(ctx: SandboxContext | None) -> FsRoute:
    """Direct for no context and for full access, external and disabled contexts
    (PROTOCOL.md §9.1); confined otherwise, carrying the converted request.

    Raises:
        InvalidParamsError: a sandbox value the structs cannot refuse (-32602).
    """
    request = fs_context(ctx)
    if request is None:
        return DIRECT
    return FsRoute(confined=not request.direct, context=request)


async def route_for(ctx: SandboxContext | None, pool: WorkerPool) -> FsRoute:
    """:func:`route` for the event loop: the conversion runs in a worker of ``pool``,
    since it looks at the filesystem (the server's cwd; legacy policies: root
    aliases and protected subpaths)."""
    if ctx is None:
        return DIRECT
    return await pool.run(route, ctx)
