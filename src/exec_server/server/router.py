"""Method table, params decoding, gating and error translation (PROTOCOL.md §3.2-§3.5, §4.3).

Feature modules call :meth:`Router.add` from their ``register(router)``.
:meth:`Router.dispatch` is the one place where typed exceptions from
:mod:`exec_server.exceptions` become JSON-RPC error objects; any other
exception is logged with its traceback and answered ``-32603 internal error``
(nothing of it reaches the peer).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import msgspec

from exec_server.exceptions import (
    ErrorCode,
    ExecServerError,
    InvalidRequestError,
    ProtocolClosedError,
)
from exec_server.protocol.codec import decode_params, encode_error, encode_result
from exec_server.protocol.connection import (
    NO_SESSION,
    SESSION_RESUMED,
    Family,
    method_not_found_text,
)
from exec_server.protocol.messages import Request, RequestId
from exec_server.server.services import ServerServices
from exec_server.server.session import Attachment, Session, SessionRegistry

__all__ = ["INTERNAL_ERROR_TEXT", "Handler", "RequestContext", "Route", "Router"]

logger = logging.getLogger("exec_server.server")

P = TypeVar("P")
R = TypeVar("R", bound=msgspec.Struct)

#: ``async def handler(ctx, params) -> ResultStruct``
Handler = Callable[["RequestContext", P], Awaitable[R]]

INTERNAL_ERROR_TEXT: Final = "internal error"


class RequestContext:
    """What a handler may use besides its params.

    Attributes:
        request_id: the id being answered.
        method: the method name.
        services: server-wide services (``config``, ``sandbox``, ``fs_sandbox``).
        attachment: this connection's state (handshake, session, sink).
        registry: the process-wide session registry.
    """

    def __init__(
        self,
        request_id: RequestId,
        method: str,
        attachment: Attachment,
        services: ServerServices,
        registry: SessionRegistry,
    ) -> None:
        self.request_id = request_id
        self.method = method
        self.attachment = attachment
        self.services = services
        self.registry = registry
        #: set when later messages of this connection may be dispatched.
        self.released = asyncio.Event()

    @property
    def session(self) -> Session:
        """The attached session (gating guarantees one for gated families).

        Raises:
            InvalidRequestError: no session (only reachable from ungated methods).
        """
        session = self.attachment.session
        if session is None:
            raise InvalidRequestError(NO_SESSION)
        return session

    def ensure_attached(self) -> None:
        """Re-check after a wait that this connection still owns its session (§4.3).

        Raises:
            InvalidRequestError: ``session has been resumed by another connection``.
        """
        if not self.attachment.attached:
            raise InvalidRequestError(SESSION_RESUMED)

    def unblock(self) -> None:
        """Let the connection dispatch its next messages while this handler waits.

        Requests run one at a time in arrival order (the reference behaviour,
        PROTOCOL.md §2.7). A handler registered with ``may_block=True`` (a
        long-poll ``process/read``) calls this after its ordered part
        (validation, lookups) so later requests of the same connection are
        not delayed. A no-op for inline handlers.
        """
        self.released.set()


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    params_type: Any
    handler: Callable[[RequestContext, Any], Awaitable[msgspec.Struct]]
    family: Family
    may_block: bool = False


class Router:
    """``method -> Route``; decode, gate, call, encode."""

    def __init__(self) -> None:
        self._routes: dict[str, Route] = {}

    def add(
        self,
        method: str,
        params_type: type[P] | Any,
        handler: Callable[[RequestContext, P], Awaitable[R]],
        family: Family,
        *,
        may_block: bool = False,
    ) -> None:
        """Register ``handler`` for ``method``.

        ``may_block=True`` marks a handler that can wait long (a long poll):
        it runs in its own task and may call ``ctx.unblock()`` so the
        connection reads on. Other handlers run inline, in order.

        Raises:
            ValueError: the method is already registered.
        """
        if method in self._routes:
            raise ValueError(f"method {method!r} registered twice")
        self._routes[method] = Route(method, params_type, handler, family, may_block)

    def set_may_block(self, method: str) -> None:
        """Mark an already registered method as possibly long-waiting."""
        route = self._routes[method]
        self._routes[method] = Route(
            route.method, route.params_type, route.handler, route.family, True
        )

    def may_block(self, method: str) -> bool:
        route = self._routes.get(method)
        return route is not None and route.may_block

    def __contains__(self, method: object) -> bool:
        return method in self._routes

    @property
    def methods(self) -> list[str]:
        return sorted(self._routes)

    async def dispatch(self, ctx: RequestContext, request: Request) -> bytes:
        """Handle one request and return the encoded Response or Error.

        Raises:
            ProtocolClosedError: the connection must be closed unanswered.
            asyncio.CancelledError: the connection went away.
        """
        route = self._routes.get(request.method)
        if route is None:
            return encode_error(
                request.id, ErrorCode.METHOD_NOT_FOUND, method_not_found_text(request.method)
            )
        try:
            try:
                params = decode_params(request.params, route.params_type)
            except msgspec.ValidationError as exc:
                return encode_error(request.id, ErrorCode.INVALID_PARAMS, str(exc))
            att = ctx.attachment
            att.handshake.gate(
                route.family, has_session=att.session is not None, attached=att.attached
            )
            result = await route.handler(ctx, params)
            return encode_result(request.id, result)
        except ExecServerError as exc:
            return encode_error(request.id, exc.code, exc.message)
        except msgspec.ValidationError as exc:
            # a handler decoding a nested raw member (e.g. a sandbox object)
            return encode_error(request.id, ErrorCode.INVALID_PARAMS, str(exc))
        except (ProtocolClosedError, asyncio.CancelledError):
            raise
        except Exception:
            logger.exception("handler for %s (id %r) failed", request.method, request.id)
            return encode_error(request.id, ErrorCode.INTERNAL_ERROR, INTERNAL_ERROR_TEXT)
