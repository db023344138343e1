"""``exec-server serve``: flags -> :class:`ServerConfig`, logging to stderr, run. The bound
``ws://IP:PORT`` is the only line ever written to stdout (PROTOCOL.md §2.3); with
``--listen stdio`` stdout carries the protocol and nothing else."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import sys
from typing import Any

from exec_server.config import (
    DEFAULT_CLOSED_RETENTION,
    DEFAULT_CONCURRENT_REQUESTS,
    DEFAULT_DETACH_TTL,
    DEFAULT_LISTEN,
    DEFAULT_MAX_MESSAGE_SIZE,
    ServerConfig,
)
from exec_server.server.app import run_server
from exec_server.server.listener import INSECURE_FLAG
from exec_server.transport.ws_auth import DEFAULT_CLOCK_SKEW, WsAuthSettings

__all__ = ["register", "run"]

_LOG_LEVELS = ("debug", "info", "warning", "error")


def _size(text: str) -> int:
    """Bytes, with an optional K/M/G suffix (binary units)."""
    text = text.strip().lower().removesuffix("ib").removesuffix("b")
    shift = {"k": 10, "m": 20, "g": 30}.get(text[-1:], 0)
    if shift:
        text = text[:-1]
    try:
        value = int(float(text) * (1 << shift))
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("size must be positive")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of seconds {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("seconds must be >= 0")
    return value


def _count(text: str) -> int:
    """An integer >= 1, refused in upstream's words."""
    try:
        value = int(text)
    except ValueError:
        value = -1  # refused as a negative number is
    if value == 0:
        raise argparse.ArgumentTypeError("number would be zero for non-zero type")
    if value < 0:
        raise argparse.ArgumentTypeError(f"invalid digit found in string {text!r}")
    return value


def _skew(text: str) -> int:
    if not text.isascii() or not text.isdigit():
        raise argparse.ArgumentTypeError(f"invalid unsigned integer {text!r}")
    return int(text)


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Serve the exec-server JSON-RPC protocol. Prints the bound ws://IP:PORT (wss:// with "
        "TLS) as the only line on stdout. A non-loopback address needs --ws-auth. SIGHUP "
        "re-reads the token or secret file."
    )
    add = parser.add_argument
    add("--listen", default=DEFAULT_LISTEN, metavar="URL",
        help=f"ws://IP:PORT (port 0 = any) or stdio (default {DEFAULT_LISTEN})")
    add("--detach-ttl", type=_seconds, default=DEFAULT_DETACH_TTL, metavar="SECONDS",
        help="keep a disconnected session's processes this long for resume "
        f"(default {DEFAULT_DETACH_TTL:g})")
    add("--closed-retention", type=_seconds, default=DEFAULT_CLOSED_RETENTION, metavar="SECONDS",
        help=f"keep closed processes readable this long (default {DEFAULT_CLOSED_RETENTION:g})")
    add("--lossless-output", action="store_true",
        help="pause a child's output instead of dropping the oldest bytes when its "
        "1 MiB buffer is full")
    add("--max-message-size", type=_size, default=DEFAULT_MAX_MESSAGE_SIZE, metavar="BYTES",
        help="largest inbound message (K/M/G suffixes; default 1G); larger ones get an error")
    add("--allow-unsandboxed", action="store_true",
        help="allow running when no platform sandbox is available")
    add("--sandbox-backend", choices=("auto", "bwrap", "landlock"), default="auto",
        help="Linux sandbox mechanism (default auto)")
    add("--no-launch-zygote", dest="launch_zygote", action="store_false",
        help="start every Landlock-backend launch with a fresh launcher interpreter")
    add("--log-level", default=None, choices=_LOG_LEVELS,
        help="stderr log level (default: $EXEC_SERVER_LOG or warning); debug logs every request")
    g = parser.add_argument_group(
        "WebSocket security",
        "Whoever can open a connection can run commands as this user. Browser "
        "requests (any Origin header) are always refused.",
    )
    # dest ws_<field> feeds WsAuthSettings.<field> (see _config).
    g.add_argument("--ws-auth", dest="ws_mode", metavar="MODE",
                   choices=("capability-token", "signed-bearer-token"),
                   help="require `Authorization: Bearer <token>` on the upgrade: "
                   "capability-token or signed-bearer-token (HS256 JWT)")
    for flag, metavar, help_text in (
        ("--ws-token-file", "PATH", "capability token file (trimmed)"),
        ("--ws-token-sha256", "HEX", "SHA-256 of the capability token (64 hex digits)"),
        ("--ws-shared-secret-file", "PATH",
         "HS256 secret for signed bearer tokens (trimmed, at least 32 bytes)"),
        ("--ws-issuer", "ISSUER", "required JWT `iss` (blank: not checked)"),
        ("--ws-audience", "AUDIENCE", "required JWT `aud` (blank: not checked)"),
    ):
        g.add_argument(flag, metavar=metavar, help=help_text)
    g.add_argument("--ws-max-clock-skew-seconds", dest="ws_max_clock_skew", type=_skew,
                   metavar="SECONDS",
                   help=f"slack for JWT exp and nbf (default {DEFAULT_CLOCK_SKEW})")
    g.add_argument("--tls-cert-file", metavar="PATH",
                   help="serve wss:// with this certificate chain")
    g.add_argument("--tls-key-file", metavar="PATH", help="the TLS certificate's private key")
    g.add_argument(INSECURE_FLAG, dest="allow_unauthenticated_network", action="store_true",
                   help="allow a non-loopback --listen address without --ws-auth (dangerous: "
                   "anyone who can reach the port runs commands as this user)")
    add("--concurrent-requests", type=_count, default=DEFAULT_CONCURRENT_REQUESTS,
        metavar="COUNT", help="requests of one connection in progress at once; later ones wait "
        f"(default {DEFAULT_CONCURRENT_REQUESTS}; upstream's default is 1)")
    parser.set_defaults(func=run)


def _log_level(ns: argparse.Namespace) -> str | None:
    """``--log-level``, else ``$EXEC_SERVER_LOG`` (checked like the flag), else warning."""
    if ns.log_level is not None:
        return str(ns.log_level)
    level = os.environ.get("EXEC_SERVER_LOG", "warning").strip().lower() or "warning"
    return level if level in _LOG_LEVELS else None


def _fields(cls: Any, ns: argparse.Namespace, prefix: str = "") -> dict[str, Any]:
    """The flags whose dest is ``prefix`` + a field name of the dataclass ``cls``."""
    names = (f.name for f in dataclasses.fields(cls))
    return {n: getattr(ns, prefix + n) for n in names if hasattr(ns, prefix + n)}


def _announce(url: str) -> None:
    sys.stdout.write(url + "\n")
    sys.stdout.flush()


def run(ns: argparse.Namespace) -> int:
    """Run the server until SIGTERM/SIGINT; 0 on a clean stop, 1 on start-up errors."""
    level = _log_level(ns)
    if level is None:
        print(f"Error: EXEC_SERVER_LOG={os.environ.get('EXEC_SERVER_LOG')!r} is not a log "
              f"level (choose from {', '.join(_LOG_LEVELS)})", file=sys.stderr)
        return 2
    logging.basicConfig(stream=sys.stderr, level=getattr(logging, level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        ws_auth = WsAuthSettings(**_fields(WsAuthSettings, ns, "ws_"))
        config = ServerConfig(ws_auth=ws_auth, **_fields(ServerConfig, ns))
    except ValueError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    try:
        asyncio.run(run_server(config, announce=_announce))
    except (ValueError, OSError) as exc:  # --listen, auth, TLS and listener checks, binding
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    return 0
