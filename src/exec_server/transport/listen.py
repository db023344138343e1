"""``--listen`` URL parsing with upstream's exact error texts (PROTOCOL.md §2.2).

``ws://IP:PORT`` only (IPv6 in brackets; no host names, no path), or ``stdio``
(``stdio://`` as later upstream versions spell it).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Final

__all__ = ["STDIO", "ListenAddress", "ListenUrlError", "parse_listen_url"]

STDIO: Final = "stdio"


class ListenUrlError(ValueError):
    """The ``--listen`` value is not usable; ``str()`` is the upstream text."""


@dataclass(frozen=True, slots=True)
class ListenAddress:
    host: str
    port: int


def parse_listen_url(url: str) -> ListenAddress | str:
    """A ``--listen`` value as an address, or :data:`STDIO`; ListenUrlError: upstream's text."""
    if url in ("stdio", "stdio://"):
        return STDIO
    if not url.startswith("ws://"):
        raise ListenUrlError(f"unsupported --listen URL `{url}`; expected `ws://IP:PORT`")
    host_text, sep, port_text = url[len("ws://") :].rpartition(":")
    host: ipaddress.IPv4Address | ipaddress.IPv6Address
    try:
        if not (sep and port_text.isascii() and port_text.isdigit() and int(port_text) <= 0xFFFF):
            raise ValueError(port_text)
        if host_text.startswith("[") and host_text.endswith("]"):
            host = ipaddress.IPv6Address(host_text[1:-1])
        else:
            host = ipaddress.IPv4Address(host_text)
    except ValueError:
        raise ListenUrlError(
            f"invalid websocket --listen URL `{url}`; expected `ws://IP:PORT`"
        ) from None
    return ListenAddress(str(host), int(port_text))
