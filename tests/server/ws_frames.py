"""Raw WebSocket for tests that talk to the server below any library (RFC 6455 §5.2).

Exposed to the tests of this directory by its ``conftest.py`` (``from ws_frames import ...``).
"""

from __future__ import annotations

import asyncio

from websockets.utils import apply_mask

__all__ = ["TIMEOUT", "UPGRADE", "ZERO_MASK", "client_frame", "read_frame", "upgraded"]

#: seconds any single wait may take.
TIMEOUT = 10.0
#: a zero mask leaves the payload as it is (cheap for big frames).
ZERO_MASK = b"\0\0\0\0"
UPGRADE = (
    b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


def client_frame(
    payload: bytes, opcode: int = 1, fin: bool = True, mask: bytes = ZERO_MASK
) -> bytes:
    """A masked client frame: 7-bit, 16-bit or 64-bit length as the payload needs."""
    first = (0x80 if fin else 0) | opcode
    size = len(payload)
    if size < 126:
        head = bytes((first, 0x80 | size))
    elif size < 0x10000:
        head = bytes((first, 0xFE)) + size.to_bytes(2, "big")
    else:
        head = bytes((first, 0xFF)) + size.to_bytes(8, "big")
    return head + mask + (payload if mask == ZERO_MASK else apply_mask(payload, mask))


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """The next server frame (unmasked) as ``(opcode, payload)``."""
    async with asyncio.timeout(TIMEOUT):
        b0, b1 = await reader.readexactly(2)
        size = b1 & 0x7F
        if size == 126:
            size = int.from_bytes(await reader.readexactly(2), "big")
        elif size == 127:
            size = int.from_bytes(await reader.readexactly(8), "big")
        return b0 & 0x0F, await reader.readexactly(size)


async def upgraded(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TCP connection to ``ws://HOST:PORT`` past the WebSocket upgrade (101)."""
    host, port = url.removeprefix("ws://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(UPGRADE)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT)
    assert head.startswith(b"HTTP/1.1 101")
    return reader, writer
