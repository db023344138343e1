"""What an HTTP request to the listener gets before any WebSocket exists
(AUTH_AND_DISCOVERY.md §2.4, §3), in upstream's order, first refusal wins.

An ``Origin`` header is refused on any path (every browser sends one on an
upgrade: this also defeats DNS rebinding); ``/readyz`` answers 200 without
authentication. Each decision is logged once, never a header value.
"""

from __future__ import annotations

import email.utils
import logging
from http import HTTPStatus
from typing import Any, Final

from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from exec_server.transport.ws_auth import Authenticator, AuthRefused, Grant

__all__ = ["READY_PATH", "UpgradeGate"]

logger = logging.getLogger("exec_server.transport.http")

READY_PATH: Final = "/readyz"


def _response(status: HTTPStatus, body: str = "") -> Response:
    data = body.encode()
    headers = Headers(Date=email.utils.formatdate(usegmt=True), Connection="close")
    headers["Content-Length"] = str(len(data))
    if data:
        headers["Content-Type"] = "text/plain; charset=utf-8"
    return Response(status.value, status.phrase, headers, data)


def _has_token(headers: Headers, name: str, token: str) -> bool:
    parts = (part.strip().lower() for value in headers.get_all(name) for part in value.split(","))
    return token in parts


def _refused(
    peer: str, status: HTTPStatus, why: str, body: str = "", what: str = "upgrade"
) -> Response:
    logger.info("%s from %s refused: %d (%s)", what, peer, status.value, why)
    return _response(status, body)


class UpgradeGate:
    """Decides every HTTP request the WebSocket listener receives."""

    def __init__(self, authenticator: Authenticator | None = None) -> None:
        self.authenticator = authenticator

    def process_request(self, connection: Any, request: Request) -> Response | None:
        """The library's ``process_request`` hook: the response refusing ``request`` (or
        answering ``/readyz``), else None, the grant kept as ``connection.grant``."""
        remote = getattr(connection, "remote_address", None)
        peer = f"{remote[0]}:{remote[1]}" if isinstance(remote, tuple) else "unknown peer"
        headers = request.headers
        path = request.path.partition("?")[0]
        if "Origin" in headers:
            return _refused(peer, HTTPStatus.FORBIDDEN, "Origin header")
        if path == READY_PATH:
            logger.debug("readiness probe from %s: 200", peer)
            return _response(HTTPStatus.OK)
        if path != "/":
            return _refused(peer, HTTPStatus.NOT_FOUND, f"path {path[:100]!r}", what="request")
        if request.method != "GET":
            status, body = HTTPStatus.METHOD_NOT_ALLOWED, "Request method must be `GET`"
            return _refused(peer, status, request.method[:20], body, "request")
        if not _has_token(headers, "Connection", "upgrade"):
            body = "Connection header did not include 'upgrade'"
            return _refused(peer, HTTPStatus.BAD_REQUEST, "no Connection: upgrade", body)
        if not _has_token(headers, "Upgrade", "websocket"):
            body = "`Upgrade` header did not include 'websocket'"
            return _refused(peer, HTTPStatus.BAD_REQUEST, "no Upgrade: websocket", body)
        grant = Grant()
        if self.authenticator is not None:
            values = headers.get_all("Authorization")
            try:
                grant = self.authenticator.check(values[0] if values else None)
            except AuthRefused as exc:
                return _refused(peer, HTTPStatus.UNAUTHORIZED, exc.reason, exc.reason)
        logger.info(
            "upgrade from %s accepted%s",
            peer,
            f" ({self.authenticator.mode})" if self.authenticator is not None else "",
        )
        connection.grant = grant
        return None
