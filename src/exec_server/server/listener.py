"""Start-up checks for the WebSocket listener: who may connect, and over what.

Whatever reaches the listener can run commands as the server's user, so a
non-loopback listener must authenticate unless
``--dangerously-allow-unauthenticated-network`` (stricter than upstream).
"""

from __future__ import annotations

import ipaddress
import logging
import ssl
from dataclasses import dataclass

from exec_server.config import ServerConfig
from exec_server.exceptions import os_error_message
from exec_server.transport.http_gate import UpgradeGate
from exec_server.transport.listen import ListenAddress
from exec_server.transport.ws_auth import AuthConfigError, load_authenticator

__all__ = [
    "INSECURE_FLAG", "Listener", "ListenerRefused", "check_stdio", "prepare_listener",
    "reload_authenticator",
]

logger = logging.getLogger("exec_server.server")

INSECURE_FLAG = "--dangerously-allow-unauthenticated-network"


class ListenerRefused(ValueError):
    """The listener flags cannot start a server safely; ``str()`` names the fix."""


@dataclass(frozen=True, slots=True)
class Listener:
    gate: UpgradeGate
    ssl_context: ssl.SSLContext | None


def check_stdio(config: ServerConfig) -> None:
    """stdio has no HTTP layer: AuthConfigError, ListenerRefused for WebSocket-only flags."""
    load_authenticator(config.ws_auth, stdio=True)
    if config.tls_cert_file is not None:
        raise ListenerRefused("TLS requires a WebSocket listener, not stdio")


def _tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_file, key_file)
    except ssl.SSLError as exc:
        reason = exc.reason or str(exc)
    except OSError as exc:
        reason = os_error_message(exc)
    else:
        return context
    raise ListenerRefused(f"failed to load TLS certificate {cert_file} / key {key_file}: {reason}")


def prepare_listener(config: ServerConfig, address: ListenAddress) -> Listener:
    """Validate the auth and TLS flags against the address, read their files once."""
    authenticator = load_authenticator(config.ws_auth, stdio=False)
    loopback = ipaddress.ip_address(address.host).is_loopback
    if not loopback and authenticator is None:
        if not config.allow_unauthenticated_network:
            raise ListenerRefused(
                f"refusing to serve {address.host} without authentication (anyone who can "
                "reach it could run commands as this user): add `--ws-auth capability-token "
                "--ws-token-file FILE`, listen on 127.0.0.1, or pass " + INSECURE_FLAG
            )
        logger.warning(
            "serving %s WITHOUT AUTHENTICATION (%s): anyone who can reach this port "
            "can run commands as this user",
            address.host,
            INSECURE_FLAG,
        )
    context = None
    if config.tls_cert_file is not None and config.tls_key_file is not None:
        context = _tls_context(config.tls_cert_file, config.tls_key_file)
    return Listener(UpgradeGate(authenticator), context)


def reload_authenticator(listener: Listener) -> None:
    """SIGHUP: a bad file keeps the old one."""
    authenticator = listener.gate.authenticator
    if authenticator is None:
        return
    try:
        if authenticator.reload():
            logger.info("reloaded the websocket auth secret (%s)", authenticator.mode)
    except AuthConfigError as exc:
        logger.error("keeping the previous websocket auth secret: %s", exc)
