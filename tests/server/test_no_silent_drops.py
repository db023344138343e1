"""Bad input on a WebSocket never ends in a silent drop (issue 30, "under load").

Bad JSON-RPC (invalid UTF-8, empty, NUL, deep nesting, a huge id, a binary
frame) gets a JSON-RPC error and the connection goes on; a WebSocket protocol
violation gets a close frame with code 1002 and a reason (RFC 6455 §7.4.1)
before the socket closes. A JSON-RPC message the protocol answers by closing
(PROTOCOL.md §3.5: a notification other than ``initialized``, a response from
the client, ``initialized`` before ``initialize``) ends with 1008 and the
violation as the reason, not a normal closure. Upstream answers the first kind
alike but drops the connection without a close frame on the other two.
``benchmarks/fuzz_frames.py`` compares all of these with upstream.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from ws_frames import client_frame, read_frame, upgraded


async def _open(
    url: str, *, initialize: bool = False
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await upgraded(url)
    if initialize:
        writer.write(client_frame(b'{"id":0,"method":"initialize","params":{"clientName":"t"}}'))
        writer.write(client_frame(b'{"method":"initialized"}'))
        opcode, data = await read_frame(reader)
        assert opcode == 1 and "result" in json.loads(data), data
    return reader, writer


@pytest.mark.parametrize(
    "payload",
    [
        client_frame(b'{"id":1,"method":"x\xff"}'),
        client_frame(b'{"id":1,"method":"x\xff"}', opcode=2),
        client_frame(b'{"id":1,"method":"initialize","params":{"clientName":"t"}', opcode=2),
        client_frame(b""),
        client_frame(b"\x00"),
        client_frame(b"[" * 100_000),
        client_frame(b'{"id":' + b"9" * 400 + b',"method":"x"}'),
    ],
    ids=["text-bad-utf8", "binary-bad-utf8", "binary-truncated", "empty", "nul", "deep", "huge-id"],
)
async def test_bad_json_rpc_gets_an_error_and_the_connection_goes_on(
    server: Any, payload: bytes
) -> None:
    reader, writer = await upgraded(server.url)
    try:
        writer.write(payload)
        opcode, data = await read_frame(reader)
        assert opcode == 1
        reply = json.loads(data)
        assert reply["id"] == -1 and reply["error"]["code"] == -32600, reply
        writer.write(client_frame(b'{"id":7,"method":"environment/status"}'))
        opcode, data = await read_frame(reader)
        assert json.loads(data) == {"id": 7, "result": {"status": "ready"}}
    finally:
        writer.close()


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (client_frame(b'{"id":1}', opcode=0), "unexpected continuation frame"),
        (client_frame(b"{}", opcode=3), "invalid opcode"),
        (bytes((0x81, 2)) + b"{}", "incorrect masking"),
        (bytes((0xC1, 0x82)) + b"\0\0\0\0{}", "reserved bits must be 0"),
        (client_frame(b"x" * 126, opcode=9), "control frame too long"),
        (client_frame(b"x", opcode=9, fin=False), "fragmented control frame"),
        (client_frame((999).to_bytes(2, "big"), opcode=8), "invalid status code"),
    ],
    ids=["continuation", "opcode", "unmasked", "rsv", "long-ping", "fragmented-ping", "close"],
)
async def test_a_protocol_violation_gets_a_close_frame_with_its_reason(
    server: Any, payload: bytes, reason: str
) -> None:
    reader, writer = await upgraded(server.url)
    try:
        writer.write(payload)
        opcode, data = await read_frame(reader)
        assert opcode == 8
        assert int.from_bytes(data[:2], "big") == 1002
        assert data[2:].decode() == reason
    finally:
        writer.close()


@pytest.mark.parametrize(
    ("message", "initialize", "reason"),
    [
        (b'{"method":"no/such"}', True, "unexpected notification `no/such`"),
        (b'{"method":"fs/getMetadata","params":{"path":"/"}}', True,
         "unexpected notification `fs/getMetadata`"),
        (b'{"id":1,"result":{}}', True, "unexpected response from client"),
        (b'{"id":1,"error":{"code":1,"message":"x"}}', True, "unexpected response from client"),
        (b'{"method":"initialized"}', False,
         "received `initialized` notification before `initialize`"),
    ],
    ids=["unknown-notification", "request-as-notification", "response", "error",
         "initialized-first"],
)
async def test_a_json_rpc_violation_that_ends_the_connection_says_why(
    server: Any, message: bytes, initialize: bool, reason: str
) -> None:
    reader, writer = await _open(server.url, initialize=initialize)
    try:
        writer.write(client_frame(message))
        opcode, data = await read_frame(reader)
        assert opcode == 8, data
        assert int.from_bytes(data[:2], "big") == 1008
        assert data[2:].decode() == reason
    finally:
        writer.close()


async def test_a_long_violation_reason_is_cut_to_what_a_close_frame_holds(server: Any) -> None:
    """A close frame's reason holds 123 bytes: a long method name is cut there (on a
    character boundary: multi-byte characters across the cut), not a failed close."""
    reader, writer = await _open(server.url, initialize=True)
    try:
        writer.write(client_frame(b'{"method":"' + "é".encode() * 100 + b'"}'))
        opcode, data = await read_frame(reader)
        assert opcode == 8, data
        assert int.from_bytes(data[:2], "big") == 1008
        text = data[2:].decode()  # valid UTF-8
        assert text.startswith("unexpected notification `éé") and len(data[2:]) <= 123
    finally:
        writer.close()
