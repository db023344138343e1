"""What an HTTP request to the listener gets before any WebSocket exists.

AUTH_AND_DISCOVERY.md §2.4 and §3.

The gates, in upstream's order, first refusal wins:

1. an ``Origin`` header, on any path: ``403`` (a browser page, whatever its
   origin, including ``http://localhost``: every browser sends ``Origin`` on
   a WebSocket upgrade, so this also defeats DNS rebinding);
2. ``/readyz``: ``200`` with no authentication (health probes); any path
   other than ``/``: ``404``; a method other than ``GET``: ``405``; no
   ``Connection: upgrade`` or ``Upgrade: websocket``: ``400``;
3. authentication (:mod:`exec_server.transport.ws_auth`): ``401`` with the reason;
4. otherwise the upgrade goes on (the library checks the rest of the
   handshake).

Sans-I/O: :meth:`UpgradeGate.decide` takes the parsed request and returns the
response to send, or the :class:`~exec_server.transport.ws_auth.Grant` to open the
connection with. :meth:`UpgradeGate.process_request` is the same decision in
the shape of ``websockets.asyncio.server.serve``'s ``process_request`` hook.
Each decision is logged once at info level (``/readyz`` at debug): the peer,
the outcome and, for a 401, the reason; never a header value.
"""

from __future__ import annotations

import email.utils
import http
import logging
from typing import Any, Final

from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from exec_server.transport.ws_auth import Authenticator, AuthRefused, Grant

__all__ = ["READY_PATH", "UpgradeGate"]

logger = logging.getLogger("exec_server.transport.http")

READY_PATH: Final = "/readyz"


def _response(status: http.HTTPStatus, body: str = "") -> Response:
    data = body.encode()
    headers = Headers(
        [
            ("Date", email.utils.formatdate(usegmt=True)),
            ("Connection", "close"),
            ("Content-Length", str(len(data))),
        ]
    )
    if data:
        headers["Content-Type"] = "text/plain; charset=utf-8"
    return Response(status.value, status.phrase, headers, data)


def _has_token(headers: Headers, name: str, token: str) -> bool:
    return any(
        part.strip().lower() == token
        for value in headers.get_all(name)
        for part in value.split(",")
    )


class UpgradeGate:
    """Decides every HTTP request the WebSocket listener receives."""

    def __init__(self, authenticator: Authenticator | None = None) -> None:
        self.authenticator = authenticator

    def decide(self, request: Request, peer: str) -> Response | Grant:
        """The response refusing ``request`` (or answering ``/readyz``), else the grant."""
        headers = request.headers
        path = request.path.partition("?")[0]
        if "Origin" in headers:
            logger.info("upgrade from %s refused: 403 (Origin header)", peer)
            return _response(http.HTTPStatus.FORBIDDEN)
        if path == READY_PATH:
            logger.debug("readiness probe from %s: 200", peer)
            return _response(http.HTTPStatus.OK)
        if path != "/":
            logger.info("request from %s refused: 404 (path %r)", peer, path[:100])
            return _response(http.HTTPStatus.NOT_FOUND)
        if request.method != "GET":
            logger.info("request from %s refused: 405 (%s)", peer, request.method[:20])
            return _response(http.HTTPStatus.METHOD_NOT_ALLOWED, "Request method must be `GET`")
        if not _has_token(headers, "Connection", "upgrade"):
            logger.info("upgrade from %s refused: 400 (no Connection: upgrade)", peer)
            return _response(
                http.HTTPStatus.BAD_REQUEST, "Connection header did not include 'upgrade'"
            )
        if not _has_token(headers, "Upgrade", "websocket"):
            logger.info("upgrade from %s refused: 400 (no Upgrade: websocket)", peer)
            return _response(
                http.HTTPStatus.BAD_REQUEST, "`Upgrade` header did not include 'websocket'"
            )
        grant = Grant()
        if self.authenticator is not None:
            values = headers.get_all("Authorization")
            try:
                grant = self.authenticator.check(values[0] if values else None)
            except AuthRefused as exc:
                logger.info("upgrade from %s refused: 401 (%s)", peer, exc.reason)
                return _response(http.HTTPStatus.UNAUTHORIZED, exc.reason)
        logger.info(
            "upgrade from %s accepted%s",
            peer,
            f" ({self.authenticator.mode})" if self.authenticator is not None else "",
        )
        return grant

    def process_request(self, connection: Any, request: Request) -> Response | None:
        """``websockets.asyncio.server.serve(process_request=...)``: None lets the
        upgrade go on, with the grant kept on the connection (as ``connection.grant``)."""
        remote = getattr(connection, "remote_address", None)
        peer = f"{remote[0]}:{remote[1]}" if isinstance(remote, tuple) else "unknown peer"
        decision = self.decide(request, peer)
        if isinstance(decision, Response):
            return decision
        connection.grant = decision
        return None
