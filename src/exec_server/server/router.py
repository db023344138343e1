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
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import msgspec

from exec_server.exceptions import (
    ErrorCode,
    ExecServerError,
    InvalidRequestError,
    ProtocolClosedError,
    from_domain_error,
    params_error_text,
)
from exec_server.protocol.codec import (
    EncodedReply,
    decode_error_text,
    decode_params,
    encode_error,
    encode_result,
    params_decoder,
)
from exec_server.protocol.connection import (
    NO_SESSION,
    SESSION_RESUMED,
    Family,
    malformed_message_text,
    method_not_found_text,
)
from exec_server.protocol.messages import Request, RequestId
from exec_server.rpc.transport import Outbound
from exec_server.server.services import ServerServices
from exec_server.server.session import Attachment, Session, SessionRegistry

__all__ = [
    "INTERNAL_ERROR_TEXT",
    "Done",
    "Handler",
    "NotNow",
    "NowHandler",
    "RequestContext",
    "Route",
    "Router",
    "StartHandler",
]

logger = logging.getLogger("exec_server.server")

P = TypeVar("P")
#: a handler returns its result struct, or (for a big one) its whole reply, encoded.
R = TypeVar("R", bound=msgspec.Struct | EncodedReply)

#: ``async def handler(ctx, params) -> ResultStruct``
Handler = Callable[["RequestContext", P], Awaitable[R]]

#: ``def handler(ctx, params) -> ResultStruct``, answering without waiting (or
#: raising :class:`NotNow`).
NowHandler = Callable[["RequestContext", P], R]

#: ``def handler(ctx, params, done) -> None``: starts the work (a worker-thread
#: job) without waiting and arranges for ``done`` to be called (or raises
#: :class:`NotNow` before starting anything).
StartHandler = Callable[["RequestContext", P, "Done"], None]

INTERNAL_ERROR_TEXT: Final = "internal error"
#: a logged argv is cut to this many characters.
_LOGGED_ARGV_CHARS: Final = 300
_clock = time.monotonic


def _log_request(request: Request, params: Any, started: float | None,
                 error: Exception | None) -> None:
    """One line per request at debug: method, id, process id, argv or path,
    duration, outcome. Never data (file contents, stdin chunks) or the
    environment (secrets live there). A failed ``process/start`` is logged at
    info, so it shows without debug."""
    level = logging.DEBUG
    if error is not None and request.method == "process/start":
        level = logging.INFO
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
    elif isinstance(error, ExecServerError):
        fields.append(f"error {error.code}: {error.message}")
    else:
        fields.append(f"error: {type(error).__name__}")
    logger.log(level, "request %s", " ".join(fields))


class Done:
    """How a ``start`` handler reports its outcome (exactly one of the two is not None).

    ``done(result, error)``, on the event loop, always answers. The worker
    thread that produced the outcome may first offer it to
    :meth:`from_thread`: when the transport takes the reply at once it is
    sent from that thread, sparing the loop wake-up before the reply, and
    True means the loop call must not follow.
    """

    __slots__ = ("_encode", "_reply", "_reply_from_thread")

    def __init__(
        self,
        encode: Callable[[msgspec.Struct | None, BaseException | None], Outbound],
        reply: Callable[[Outbound], None],
        reply_from_thread: Callable[[Outbound], bool] | None = None,
    ) -> None:
        self._encode = encode
        self._reply = reply
        self._reply_from_thread = reply_from_thread

    def __call__(self, result: msgspec.Struct | None, error: BaseException | None) -> None:
        self._reply(self._encode(result, error))

    def from_thread(self, result: msgspec.Struct | None, error: BaseException | None) -> bool:
        """Answer from the calling (worker) thread if possible; False: call ``done`` on the loop."""
        send = self._reply_from_thread
        if send is None or (error is not None and not isinstance(error, Exception)):
            return False
        try:
            data = self._encode(result, error)
        except Exception:  # the loop call answers (or logs) it
            return False
        return send(data)


class NotNow(Exception):
    """Raised by a ``now`` handler: this request needs the async handler.

    Raise it before any side effect (the async handler runs from scratch).
    """


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
        self._released: asyncio.Event | None = None
        self._replied: asyncio.Event | None = None

    @property
    def released(self) -> asyncio.Event:
        """Set when later messages of this connection may be dispatched."""
        if self._released is None:  # only blocking routes need it: made on demand
            self._released = asyncio.Event()
        return self._released

    @property
    def replied(self) -> asyncio.Event:
        """Set once this request's answer was handed to the transport (or never will be).

        Work a handler leaves running after its result (a streamed HTTP body)
        waits for it, so its notifications follow the answer on the wire.
        """
        if self._replied is None:
            self._replied = asyncio.Event()
        return self._replied

    def mark_replied(self) -> None:
        """The connection calls this once the answer was handed over (or dropped)."""
        if self._replied is not None:
            self._replied.set()

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
    handler: Callable[[RequestContext, Any], Awaitable[msgspec.Struct | EncodedReply]]
    family: Family
    may_block: bool = False
    now: Callable[[RequestContext, Any], msgspec.Struct | EncodedReply] | None = None
    start: Callable[[RequestContext, Any, Done], None] | None = None


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
        now: NowHandler[P, R] | None = None,
        start: StartHandler[P] | None = None,
    ) -> None:
        """Register ``handler`` for ``method``.

        ``may_block=True`` marks a handler that can wait long (a long poll):
        it runs in its own task and may call ``ctx.unblock()`` so the
        connection reads on. Other handlers run inline, in order.

        ``now`` is an optional synchronous twin for the common case that
        needs no waiting (see :meth:`dispatch_now`); it raises
        :class:`NotNow` when the request needs ``handler``. ``start`` is the
        twin for work that runs in a worker thread: it starts the job and
        reports through a callback (see :meth:`dispatch_start`).

        Raises:
            ValueError: the method is already registered.
        """
        if method in self._routes:
            raise ValueError(f"method {method!r} registered twice")
        params_decoder(params_type)  # now, not on the method's first request
        self._routes[method] = Route(method, params_type, handler, family, may_block, now, start)

    def add_now(
        self, method: str, params_type: type[P] | Any, now: NowHandler[P, R], family: Family
    ) -> None:
        """Register a handler that never waits: it serves both paths."""

        async def handler(ctx: RequestContext, params: P) -> R:
            return now(ctx, params)

        self.add(method, params_type, handler, family, now=now)

    def set_may_block(self, method: str) -> None:
        """Mark an already registered method as possibly long-waiting."""
        route = self._routes[method]
        self._routes[method] = Route(
            route.method, route.params_type, route.handler, route.family, True, route.now,
            route.start,
        )

    def shortcut(self, method: str) -> str | None:
        """``"now"``, ``"start"`` or None: which callback-time path ``method`` offers."""
        route = self._routes.get(method)
        if route is None:
            return None
        if route.now is not None:
            return "now"
        return "start" if route.start is not None else None

    def may_block(self, method: str) -> bool:
        route = self._routes.get(method)
        return route is not None and route.may_block

    def __contains__(self, method: object) -> bool:
        return method in self._routes

    @property
    def methods(self) -> list[str]:
        return sorted(self._routes)

    async def dispatch(self, ctx: RequestContext, request: Request) -> Outbound:
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
        started = _clock() if logger.isEnabledFor(logging.DEBUG) else None
        params: Any = None
        try:
            params = self._params(ctx, route, request)
            result = await route.handler(ctx, params)
            reply = encode_result(request.id, result)
        except (ProtocolClosedError, asyncio.CancelledError):
            raise
        except Exception as exc:
            _log_request(request, params, started, exc)
            return self._error(request, exc)
        if started is not None:
            _log_request(request, params, started, None)
        return reply

    def dispatch_now(self, ctx: RequestContext, request: Request) -> Outbound | None:
        """:meth:`dispatch` without waiting, for routes with a ``now`` handler.

        Returns None when the request needs the async path (no ``now``
        handler, or it raised :class:`NotNow`); nothing was done then. The
        server uses this to answer a request straight from the socket
        callback, a loop iteration and a task switch sooner.

        Raises:
            ProtocolClosedError: the connection must be closed unanswered.
        """
        route = self._routes.get(request.method)
        if route is None or route.now is None:
            return None
        started = _clock() if logger.isEnabledFor(logging.DEBUG) else None
        params: Any = None
        try:
            params = self._params(ctx, route, request)
            result = route.now(ctx, params)
            reply = encode_result(request.id, result)
        except NotNow:
            return None
        except ProtocolClosedError:
            raise
        except Exception as exc:
            _log_request(request, params, started, exc)
            return self._error(request, exc)
        if started is not None:
            _log_request(request, params, started, None)
        return reply

    def dispatch_start(
        self,
        ctx: RequestContext,
        request: Request,
        reply: Callable[[Outbound], None],
        reply_from_thread: Callable[[Outbound], bool] | None = None,
    ) -> bool:
        """Start a request through its ``start`` handler; ``reply(bytes)`` gets the
        encoded answer, now (an error found before starting) or when the job ends.
        ``reply_from_thread(bytes)``, if given, may send it from the worker
        thread instead (see :class:`Done`); True means it did.

        Returns False, having done nothing, when the request needs the async
        path (no ``start`` handler, or it raised :class:`NotNow`).

        Raises:
            ProtocolClosedError: the connection must be closed unanswered.
        """
        route = self._routes.get(request.method)
        if route is None or route.start is None:
            return False

        started = _clock() if logger.isEnabledFor(logging.DEBUG) else None
        params: Any = None

        def encode(result: msgspec.Struct | None, error: BaseException | None) -> Outbound:
            if error is None:
                assert result is not None
                try:
                    reply = encode_result(request.id, result)
                except Exception as exc:  # an unencodable result: a bug
                    error = exc
                else:
                    if started is not None:
                        _log_request(request, params, started, None)
                    return reply
            if not isinstance(error, Exception):
                raise error  # KeyboardInterrupt and the like: not ours to answer
            _log_request(request, params, started, error)
            return self._error(request, error)

        done = Done(encode, reply, reply_from_thread)
        try:
            params = self._params(ctx, route, request)
            route.start(ctx, params, done)
        except NotNow:
            return False
        except ProtocolClosedError:
            raise
        except Exception as exc:
            _log_request(request, params, started, exc)
            reply(self._error(request, exc))
        return True

    @staticmethod
    def _params(ctx: RequestContext, route: Route, request: Request) -> Any:
        """Decode and gate; raises what :meth:`_error` answers."""
        decoded = request.decoded
        if decoded is not None:
            # One-pass decoded (codec.register_one_pass): the module that
            # registered the route registered the shape, and its handler takes it.
            params: Any = decoded
        else:
            try:
                params = decode_params(request.params, route.params_type)
            except msgspec.ValidationError:
                raise  # a ValidationError is a DecodeError too: -32602, as it says
            except (msgspec.DecodeError, RecursionError) as exc:
                # The envelope was JSON, but not the params in it: the envelope's
                # reader skips over them without checking their text (invalid
                # UTF-8 in a string), or they nest deeper than the decoder goes.
                # Upstream reads the whole message at once and answers id -1; we
                # know the id, so the request gets its answer.
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
        """The one place handler exceptions become JSON-RPC errors."""
        if isinstance(exc, ExecServerError):
            return encode_error(request.id, exc.code, exc.message)
        wire = from_domain_error(exc)
        if wire is not None:
            return encode_error(request.id, wire.code, wire.message)
        if isinstance(exc, msgspec.ValidationError):
            # bad params, or a handler decoding a nested raw member (a sandbox object)
            return encode_error(request.id, ErrorCode.INVALID_PARAMS, params_error_text(str(exc)))
        logger.error(
            "handler for %s (id %r) failed", request.method, request.id, exc_info=exc
        )
        return encode_error(request.id, ErrorCode.INTERNAL_ERROR, INTERNAL_ERROR_TEXT)
