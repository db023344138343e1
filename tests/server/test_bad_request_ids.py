"""Messages whose ``id`` is no RequestId, on the wire (PROTOCOL.md §3.1, §3.5, §3.6).

F1: a request such as ``{"id":1.5,"method":"fs/getMetadata",..}`` (or id
``null``, ``true``, ``{}``, ``[]``, ``1e3``, an integer past i64) was read as a
notification: the WebSocket server closed the connection (1000, no reply, the
replies to requests in flight lost) and the stdio server exited. Upstream 0.163
answers ``-32600`` under id ``-1`` and keeps serving; so do we now.

F3: an oversized message starting ``{"id":1.5,`` got its "too large" error under
id ``1`` (``7e3`` -> ``7``, ``2.0`` -> ``2``): the id sniffed from its head was
the digits before the dot. A float is no id: ``-1``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from exec_server.server.connection import _sniff_id

TIMEOUT = 10.0
BAD_ID = "data did not match any variant of untagged enum RequestId"
PREFIX = {
    "websocket": "failed to parse websocket JSON-RPC message from exec-server websocket 127.0.0.1:",
    "stdio": "failed to parse JSON-RPC message from exec-server stdio: ",
}

#: (id text, the detail upstream 0.163 gives for it)
BAD_IDS = [
    ("1.5", BAD_ID),
    ("null", BAD_ID),
    ("true", BAD_ID),
    ("{}", BAD_ID),
    ("[]", BAD_ID),
    ("1e3", BAD_ID),
    ("2.0", BAD_ID),
    ("9223372036854775808", BAD_ID),
    (
        "18446744073709551616",
        "invalid type: integer `18446744073709551616` as u128, expected any value",
    ),
]

#: other shapes with a bad id: upstream answers them all the same way
BAD_SHAPES = [
    '{"id":1.5,"method":"initialized"}',
    '{"id":null,"method":"no/such"}',
    '{"id":1.5,"result":{}}',
    '{"id":null,"error":{"code":1,"message":"x"}}',
    '{"id":true}',
    # big enough for the one-pass and deferred-string decoders, which need a valid id
    '{"id":1.5,"method":"fs/writeFile","params":{"path":"/nonexistent/x","dataBase64":"'
    + "QUFB" * 30_000
    + '"}}',
]


@pytest.fixture(params=["websocket", "stdio"])
async def client(
    request: pytest.FixtureRequest,
    server_factory: Callable[..., Any],
    rpc: Callable[[str], Awaitable[Any]],
    stdio_rpc: Callable[..., Awaitable[Any]],
) -> Any:
    """An initialized client of a real ``exec-server serve`` child, per transport."""
    if request.param == "websocket":
        made = await rpc(server_factory().url)
    else:
        made = await stdio_rpc()
    made.transport = request.param
    await made.initialize()
    return made


def _malformed_replies(client: Any) -> list[dict[str, Any]]:
    return [m for m in client.all_messages if m.get("id") == -1]


async def _send_bad_between_good(client: Any, bad: str, tmp_path: Path, n: int) -> dict[str, Any]:
    """Two requests in flight, ``bad``, another request: all answered, in order.

    Returns the one reply to ``bad``.
    """
    before = len(_malformed_replies(client))
    first, second, after = 10 * n + 1, 10 * n + 2, 10 * n + 3
    await client.send({"id": first, "method": "fs/getMetadata", "params": {"path": str(tmp_path)}})
    await client.send(
        {"id": second, "method": "fs/readDirectory", "params": {"path": str(tmp_path)}}
    )
    await client.send_raw(bad)
    await client.send({"id": after, "method": "fs/getMetadata", "params": {"path": str(tmp_path)}})
    assert (await client.response(first, TIMEOUT))["result"]["isDirectory"] is True
    assert "entries" in (await client.response(second, TIMEOUT))["result"]
    assert (await client.response(after, TIMEOUT))["result"]["isDirectory"] is True
    # the error came before the reply to ``after`` (one ordered outbound stream)
    replies = _malformed_replies(client)
    assert len(replies) == before + 1, replies
    order = [m.get("id") for m in client.all_messages]
    assert order.index(after) > len(order) - 1 - order[::-1].index(-1)
    assert not client.closed.is_set()
    return replies[-1]


def _check_malformed(reply: dict[str, Any], transport: str, detail: str) -> None:
    assert reply["id"] == -1 and type(reply["id"]) is int
    assert reply["error"]["code"] == -32600
    assert reply["error"]["message"].startswith(PREFIX[transport])
    assert reply["error"]["message"].endswith(": " + detail)


async def test_request_with_bad_id_is_answered_and_the_connection_goes_on(
    client: Any, tmp_path: Path
) -> None:
    for n, (bad_id, detail) in enumerate(BAD_IDS, start=1):
        bad = f'{{"id":{bad_id},"method":"fs/getMetadata","params":{{"path":"{tmp_path}"}}}}'
        reply = await _send_bad_between_good(client, bad, tmp_path, n)
        _check_malformed(reply, client.transport, detail)


async def test_any_shape_with_bad_id_is_answered_and_the_connection_goes_on(
    client: Any, tmp_path: Path
) -> None:
    for n, bad in enumerate(BAD_SHAPES, start=1):
        reply = await _send_bad_between_good(client, bad, tmp_path, n)
        _check_malformed(reply, client.transport, BAD_ID)


async def test_initialized_with_bad_id_is_not_taken_as_initialized(
    server: Any, rpc: Callable[[str], Awaitable[Any]], tmp_path: Path
) -> None:
    """``{"id":null,"method":"initialized"}`` used to complete the handshake."""
    client = await rpc(server.url)
    assert "sessionId" in await client.call("initialize", {"clientName": "pytest"})
    await client.send_raw('{"id":null,"method":"initialized","params":{}}')
    _check_malformed(await client.response(-1), "websocket", BAD_ID)
    reply = await client.request("fs/getMetadata", {"path": str(tmp_path)})
    assert reply["error"]["code"] == -32600
    assert "initialized" in reply["error"]["message"]
    await client.notify("initialized", {})
    assert (await client.call("fs/getMetadata", {"path": str(tmp_path)}))["isDirectory"] is True


@pytest.mark.parametrize(
    "message",
    [
        {"method": "process/output", "params": {"id": 1.5}},  # no id member: a notification
        {"id": "s", "result": None},  # a valid id: a response from the client
    ],
)
async def test_valid_ids_and_no_ids_still_close(
    inprocess_server: Callable[..., Any], message: dict[str, Any]
) -> None:
    """Only the malformed id changed: a notification other than ``initialized``
    and a response from the client still close the connection (§3.5)."""
    srv = inprocess_server()
    client = await srv.connect()
    await client.initialize()
    await client.send(message)
    await client.wait_closed()
    assert len(client.all_messages) == 1  # only the initialize reply


# -- F3: the id of an oversized message ------------------------------------


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (b'{"id":1.5,"method":"fs/writeFile"', -1),
        (b'{"id":7e3,"method":"fs/writeFile"', -1),
        (b'{"id":7E+3,"method":"fs/writeFile"', -1),
        (b'{"id":2.0,"method":"fs/writeFile"', -1),
        (b'{"id":12345678901234567890,"method"', -1),  # past i64
        (b'{"id":01,"method"', -1),  # not JSON
        (b'{"id":null,"method"', -1),
        (b'{"id":"a"x', -1),
        (b'{"id":12', -1),  # the head ends inside the number: more digits may follow
        (b'{"id":"abc', -1),
        (b'{"id":' + b"1" * 250, -1),  # a whole head of digits
        (b'{"id":"' + b"a" * 248 + b'"x', -1),
        (b'{"id":"' + b'\\"' * 124, -1),
        (b'{"method":"x","id":5,', -1),  # id not first
        (b'\x0c{"id":5,', -1),  # not JSON whitespace
        (b'{"id":42,"method":"fs/writeFile"', 42),
        (b'{"id":42}', 42),
        (b'{"id":-42 ,', -42),
        (b' {\t"id" :\r\n9223372036854775807\n}', 9223372036854775807),
        (b'{"id":-9223372036854775808,', -9223372036854775808),
        (b'{"id":-0,', 0),
        (b'{"id":"req-8","method"', "req-8"),
        (b'{"id":"a\\"b\\\\" }', 'a"b\\'),
        (b'{"id":"\\u00e9",', "\u00e9"),
        (b'{"id":""}', ""),
    ],
)
def test_sniffed_id_of_a_refused_message(head: bytes, expected: object) -> None:
    got = _sniff_id(head)
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize(
    ("id_text", "expected"),
    [("1.5", -1), ("7e3", -1), ("2.0", -1), ("12345678901234567890", -1), ("3", 3), ('"s"', "s")],
)
async def test_oversized_message_with_float_id_is_answered_with_minus_one(
    server_factory: Callable[..., Any],
    rpc: Callable[[str], Awaitable[Any]],
    id_text: str,
    expected: object,
) -> None:
    srv = server_factory("--max-message-size", "64K")
    client = await rpc(srv.url)
    await client.initialize()
    big = '{"id":' + id_text + ',"method":"fs/writeFile","params":{"dataBase64":"'
    await client.send_raw(big + "A" * 100_000 + '"}}')
    reply = await client.response(expected)
    assert reply["id"] == expected and type(reply["id"]) is type(expected)
    assert reply["error"]["code"] == -32600
    assert "too large" in reply["error"]["message"]
    # the id alone, then padding: ``}`` ends the member
    await client.send_raw('{"id":' + json.dumps(900) + "}" + " " * 70_000)
    assert "too large" in (await client.response(900))["error"]["message"]
    assert await client.call("environment/status") == {"status": "ready"}
    assert [m["id"] for m in client.all_messages if "error" in m] == [expected, 900]
