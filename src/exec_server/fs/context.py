"""Turn an ``fs/*`` call's raw ``sandbox`` member into a route (direct or confined).

Decoding and validating both generations' contexts (legacy
``FileSystemSandboxContext``, PROTOCOL.md §6.8; current permission context,
CLIENT_COMPAT.md §1.4) belongs to the sandbox-policy layer
(:func:`exec_server.sandbox.convert.fs_route_from_wire`); this module is the
one seam both the server handlers and ``LocalFileSystem`` call, so the two
route identically. Malformed contexts are ``-32602`` naming the member.
"""

from __future__ import annotations

from exec_server.fs.service import DIRECT, Route
from exec_server.fs.workers import WorkerPool
from exec_server.sandbox.convert import cached_fs_route, fs_route_from_wire

__all__ = ["cached_route_from_wire", "route_for", "route_from_wire"]


def route_from_wire(raw: bytes | None) -> Route:
    """Route for a call whose ``sandbox`` member is ``raw`` JSON (``None``: absent).

    Raises:
        InvalidParamsError: the context does not decode (-32602).
    """
    if raw is None or raw.strip() in (b"", b"null"):
        return DIRECT
    return fs_route_from_wire(raw)


def cached_route_from_wire(raw: bytes) -> Route | None:
    """The route of a context decoded before (cheap), else None: use :func:`route_from_wire`."""
    if raw.strip() in (b"", b"null"):
        return DIRECT
    return cached_fs_route(raw)


async def route_for(raw: bytes | None, pool: WorkerPool) -> Route:
    """:func:`route_from_wire` for the event loop: a context decoded before comes from
    the cache, a new one is decoded in a worker of ``pool``.

    Why: decoding looks at the filesystem (the server's cwd, the policy's roots:
    ``realpath``, ``isdir``), which under a hung network or FUSE mount would
    stall every connection (see :mod:`exec_server.fs.nonblocking`).
    """
    if raw is None:
        return DIRECT
    cached = cached_route_from_wire(raw)
    if cached is not None:
        return cached
    return await pool.run(route_from_wire, raw)
