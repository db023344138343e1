"""The route of an ``fs/*`` call (direct or confined) from its decoded ``sandbox`` member:
the one seam the server handlers and ``LocalFileSystem`` both call."""

from __future__ import annotations

from exec_server.fs.pool import WorkerPool
from exec_server.fs.service import DIRECT, FsRoute
from exec_server.protocol.types.sandbox import SandboxContext
from exec_server.sandbox.convert import fs_context

__all__ = ["route", "route_for"]


def route(ctx: SandboxContext | None) -> FsRoute:
    """Direct for no context and for unrestricted ones (§9.1), else confined."""
    request = fs_context(ctx)
    if request is None:
        return DIRECT
    return FsRoute(confined=not request.direct, context=request)


async def route_for(ctx: SandboxContext | None, pool: WorkerPool) -> FsRoute:
    """:func:`route` in a worker of ``pool``: the conversion looks at the filesystem."""
    if ctx is None:
        return DIRECT
    return await pool.run(route, ctx)
