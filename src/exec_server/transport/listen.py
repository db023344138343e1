"""``--listen`` URL parsing with upstream's exact error texts (PROTOCOL.md §2.2).

``ws://IP:PORT`` only: IPv4 ``a.b.c.d:port`` or bracketed IPv6 ``[::1]:port``;
host names, a missing port and any path are rejected. ``stdio`` (and
``stdio://``, as later upstream versions spell it) selects line framing on
stdin/stdout.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Final

__all__ = ["STDIO", "ListenAddress", "ListenUrlError", "format_ws_url", "parse_listen_url"]

#: returned by :func:`parse_listen_url` for the stdio transport.
STDIO: Final = "stdio"


class ListenUrlError(ValueError):
    """The ``--listen`` value is not usable; ``str()`` is the upstream text."""


@dataclass(frozen=True, slots=True)
class ListenAddress:
    """A socket address to bind."""

    host: str
    port: int


def format_ws_url(host: str, port: int, *, scheme: str = "ws") -> str:
    """``ws://IP:PORT`` (or ``wss://``); IPv6 in brackets."""
    if ":" in host:
        return f"{scheme}://[{host}]:{port}"
    return f"{scheme}://{host}:{port}"


def _parse_port(text: str) -> int | None:
    if not text.isascii() or not text.isdigit():
        return None
    port = int(text)
    return port if port <= 0xFFFF else None


def _parse_socket_addr(text: str) -> ListenAddress | None:
    host: ipaddress.IPv4Address | ipaddress.IPv6Address
    if text.startswith("["):
        close = text.find("]")
        if close < 0 or text[close + 1 : close + 2] != ":":
            return None
        host_text, port_text = text[1:close], text[close + 2 :]
        try:
            host = ipaddress.IPv6Address(host_text)
        except ValueError:
            return None
    else:
        host_text, sep, port_text = text.rpartition(":")
        if not sep:
            return None
        try:
            host = ipaddress.IPv4Address(host_text)
        except ValueError:
            return None
    port = _parse_port(port_text)
    if port is None:
        return None
    return ListenAddress(str(host), port)


def parse_listen_url(url: str) -> ListenAddress | str:
    """Parse a ``--listen`` value into an address, or :data:`STDIO`.

    Raises:
        ListenUrlError: with upstream's text.
    """
    if url in ("stdio", "stdio://"):
        return STDIO
    prefix = "ws://"
    if not url.startswith(prefix):
        raise ListenUrlError(f"unsupported --listen URL `{url}`; expected `ws://IP:PORT`")
    addr = _parse_socket_addr(url[len(prefix) :])
    if addr is None:
        raise ListenUrlError(f"invalid websocket --listen URL `{url}`; expected `ws://IP:PORT`")
    return addr
