"""Method table, params decoding, gating and error translation (PROTOCOL.md §3.2-§3.5, §4.3).

:meth:`Router.dispatch` is the one place handler exceptions become JSON-RPC
errors; an unexpected one is logged and answered ``-32603 internal error``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import msgspec

from exec_server.exceptions import (
    ErrorCode,
    InvalidRequestError,
    ProtocolClosedError,
    params_error_text,
    wire_error,
)
from exec_server.protocol.codec import decode_error_text, decode_params, encode_error, encode_result
from exec_server.protocol.handshake import (
    NO_SESSION,
    SESSION_RESUMED,
    Family,
    malformed_message_text,
    method_not_found_text,
)
from exec_server.protocol.json_span import StringSpan
from exec_server.protocol.messages import Request
from exec_server.server.services import ServerServices
from exec_server.server.session import Attachment, Session, SessionRegistry
from exec_server.transport.base import Outbound

__all__ = ["INTERNAL_ERROR_TEXT", "RequestContext", "Route", "Router"]

logger = logging.getLogger("exec_server.server")

P = TypeVar("P")
R = TypeVar("R", bound=msgspec.Struct)

INTERNAL_ERROR_TEXT: Final = "internal error"
_LOGGED_ARGV_CHARS: Final = 300
_clock = time.monotonic


def _log_request(request: Request, params: Any, started: float | None,
                 error: Exception | None) -> None:
    """One line per request at debug (a failed ``process/start`` at info); never data
    or the environment (secrets live there)."""
    failed_start = error is not None and request.method == "process/start"
    level = logging.INFO if failed_start else logging.DEBUG
    if not logger.isEnabledFor(level):
        return
    fields = [request.method, f"id={request.id!r}"]
    process_id = getattr(params, "process_id", None)
    if isinstance(process_id, str):
        fields.append(f"process={process_id}")
    argv = getattr(params, "argv", None)
    if isinstance(argv, list):
        text = repr(argv)
        if len(text) > _LOGGED_ARGV_CHARS:
            text = text[:_LOGGED_ARGV_CHARS] + "...]"
        fields.append(f"argv={text}")
    path = getattr(params, "path", None)
    if isinstance(path, str):
        fields.append(f"path={path}")
    if started is not None:
        fields.append(f"{(_clock() - started) * 1000:.1f}ms")
    if error is None:
        fields.append("ok")
    elif (wire := wire_error(error)) is not None:
        fields.append(f"error {wire.code}: {wire.message}")
    else:
        fields.append(f"error: {type(error).__name__}")
    logger.log(level, "request %s", " ".join(fields))


class RequestContext:
    """What a handler may use besides its params.

    ``span`` is a big ``fs/writeFile``'s ``dataBase64`` text, left in its message
    by the codec (its params hold ``""`` for it); None for any other request.
    """

    def __init__(
        self, attachment: Attachment, services: ServerServices, registry: SessionRegistry
    ) -> None:
        self.attachment = attachment
        self.services = services
        self.registry = registry
        self.span: StringSpan | None = None
        #: Made by the connection for ``may_block`` routes only. ``released``: later
        #: messages of this connection may be dispatched. ``replied``: the answer was
        #: handed to the transport; work left running after the result (a streamed
        #: HTTP body) waits for it, to follow the answer.
        self.released: asyncio.Event | None = None
        self.replied: asyncio.Event | None = None

    @property
    def session(self) -> Session:
        """The attached session (gating guarantees one for gated families)."""
        session = self.attachment.session
        if session is None:
            raise InvalidRequestError(NO_SESSION)
        return session

    def ensure_attached(self) -> None:
        """Re-check after a wait that this connection still owns its session (§4.3)."""
        if not self.attachment.attached:
            raise InvalidRequestError(SESSION_RESUMED)

    def unblock(self) -> None:
        """A ``may_block`` handler calls this after its ordered part (validation), so
        later requests of the connection go on while it waits."""
        if self.released is not None:
            self.released.set()


@dataclass(frozen=True, slots=True)
class Route:
    decoder: msgspec.json.Decoder[Any]
    handler: Callable[[RequestContext, Any], Awaitable[msgspec.Struct]]
    family: Family
    may_block: bool = False


class Router:
    """``method -> Route``; decode, gate, call, encode."""

    def __init__(self) -> None:
        self._routes: dict[str, Route] = {}

    def add(
        self, method: str, params_type: type[P] | Any,
        handler: Callable[[RequestContext, P], Awaitable[R]], family: Family, *,
        may_block: bool = False,
    ) -> None:
        """``may_block=True``: a handler that can wait long (a long poll) runs in its
        own task and may call ``ctx.unblock()``; others run inline, in order."""
        if method in self._routes:
            raise ValueError(f"method {method!r} registered twice")
        # made now (~0.2 ms each), not on the method's first request
        decoder = msgspec.json.Decoder(params_type)
        self._routes[method] = Route(decoder, handler, family, may_block)

    def may_block(self, method: str) -> bool:
        route = self._routes.get(method)
        return route is not None and route.may_block

    @property
    def methods(self) -> list[str]:
        return sorted(self._routes)

    async def dispatch(self, ctx: RequestContext, request: Request) -> Outbound:
        """The encoded Response or Error; ProtocolClosedError: close unanswered."""
        route = self._routes.get(request.method)
        if route is None:
            return encode_error(
                request.id, ErrorCode.METHOD_NOT_FOUND, method_not_found_text(request.method)
            )
        started = _clock() if logger.isEnabledFor(logging.DEBUG) else None
        params: Any = None
        ctx.span = request.span
        try:
            params = self._params(ctx, route, request)
            result = await route.handler(ctx, params)
            reply = encode_result(request.id, result)
        except ProtocolClosedError:
            raise
        except Exception as exc:
            _log_request(request, params, started, exc)
            return self._error(request, exc)
        if started is not None:
            _log_request(request, params, started, None)
        return reply

    @staticmethod
    def _params(ctx: RequestContext, route: Route, request: Request) -> Any:
        try:
            params = decode_params(request.params, route.decoder)
        except msgspec.ValidationError:
            raise  # a ValidationError is a DecodeError too: -32602, as it says
        except (msgspec.DecodeError, RecursionError) as exc:
            # The envelope was JSON but not its params (skipped unchecked: invalid
            # UTF-8, or nested too deep). Upstream answers id -1; we know the id.
            raise InvalidRequestError(
                malformed_message_text(
                    ctx.attachment.kind,
                    ctx.attachment.label,
                    decode_error_text(exc, request.params or b"")
                    if isinstance(exc, msgspec.DecodeError)
                    else str(exc),
                )
            ) from None
        att = ctx.attachment
        att.handshake.gate(route.family, has_session=att.session is not None, attached=att.attached)
        return params

    @staticmethod
    def _error(request: Request, exc: Exception) -> bytes:
        wire = wire_error(exc)
        if wire is not None:
            return encode_error(request.id, wire.code, wire.message)
        if isinstance(exc, msgspec.ValidationError):
            # bad params, or a handler decoding a nested raw member (a sandbox object)
            return encode_error(request.id, ErrorCode.INVALID_PARAMS, params_error_text(str(exc)))
        logger.error("handler for %s (id %r) failed", request.method, request.id, exc_info=exc)
        return encode_error(request.id, ErrorCode.INTERNAL_ERROR, INTERNAL_ERROR_TEXT)
