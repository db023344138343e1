"""Client behaviour against a scripted in-memory server (no sockets)."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest

from exec_server.client import ClientClosedError, ConnectionLostError, ExecServerClient
from exec_server.exceptions import (
    AlreadyAttachedError,
    ExecServerError,
    InternalError,
    InvalidParamsError,
    InvalidRequestError,
    MethodNotFoundError,
    NotFoundError,
)
from exec_server.protocol.types.process import (
    ProcessStream,
    TerminateParams,
    TerminateResult,
    WriteStatus,
)

# The fixture's server side is conftest.MemoryTransport (tests never import each other).
Fake = tuple[ExecServerClient, Any]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def test_handshake_sends_client_name_and_records_session(fake: Fake) -> None:
    client, _ = fake
    assert client.session_id == "s-1"
    assert client.connected


async def test_out_of_order_responses_are_matched_by_id(fake: Fake) -> None:
    client, t = fake
    first = asyncio.create_task(
        client.call("process/terminate", TerminateParams(process_id="a"), TerminateResult)
    )
    second = asyncio.create_task(
        client.call("process/terminate", TerminateParams(process_id="b"), TerminateResult)
    )
    r1 = await t.next_request()
    r2 = await t.next_request()
    assert isinstance(r1["id"], int) and r2["id"] == r1["id"] + 1
    t.reply(r2["id"], {"running": False})
    t.reply(r1["id"], {"running": True})
    assert (await first).running is True
    assert (await second).running is False
    assert client._pending == {}


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (-32600, InvalidRequestError),
        (-32601, MethodNotFoundError),
        (-32602, InvalidParamsError),
        (-32603, InternalError),
        (-32004, NotFoundError),
        (-32010, AlreadyAttachedError),
        (-31999, ExecServerError),
    ],
)
async def test_error_codes_map_to_exception_classes(
    fake: Fake, code: int, cls: type[ExecServerError]
) -> None:
    client, t = fake
    call = asyncio.create_task(
        client.call("process/terminate", TerminateParams(process_id="a"), TerminateResult)
    )
    req = await t.next_request()
    t.error(req["id"], code, "boom")
    with pytest.raises(cls, match="boom") as info:
        await call
    assert type(info.value) is cls
    assert info.value.code == code


async def test_an_attached_session_is_an_invalid_request_to_callers(fake: Fake) -> None:
    """0.163 servers answer a resume of an attached session with -32010."""
    client, t = fake
    call = asyncio.create_task(
        client.call("process/terminate", TerminateParams(process_id="a"), TerminateResult)
    )
    req = await t.next_request()
    t.error(req["id"], -32010, "session is already attached")
    with pytest.raises(InvalidRequestError):
        await call


async def test_transport_loss_fails_pending_calls_and_handles(fake: Fake) -> None:
    client, t = fake
    spawn = asyncio.create_task(client.spawn(["true"], cwd="/"))
    start = await t.next_request()
    t.reply(start["id"], {"processId": start["params"]["processId"], "sandboxType": "none"})
    handle = await spawn
    call = asyncio.create_task(
        client.call("process/terminate", TerminateParams(process_id="a"), TerminateResult)
    )
    await t.next_request()
    t.drop("network down")
    with pytest.raises(ConnectionLostError, match="exec-server transport disconnected"):
        await call
    with pytest.raises(ConnectionLostError):
        await handle.wait()
    with pytest.raises(ConnectionLostError):
        await client.call("process/terminate", TerminateParams(process_id="a"), TerminateResult)
    assert not client.connected


async def test_closed_client_refuses_calls(fake: Fake) -> None:
    client, _ = fake
    await client.aclose()
    with pytest.raises(ClientClosedError):
        await client.call("process/terminate", TerminateParams(process_id="a"), TerminateResult)


async def test_start_uses_current_generation_shape(fake: Fake) -> None:
    client, t = fake
    spawn = asyncio.create_task(
        client.spawn(["sh", "-c", "x"], cwd="/tmp/a b", env={"A": "1"}, tty=True, process_id="p")
    )
    req = await t.next_request()
    assert req["method"] == "process/start"
    params = req["params"]
    assert params["processId"] == "p"
    assert params["cwd"] == "file:///tmp/a%20b"
    assert params["env"] == {"A": "1"}
    assert params["tty"] is True
    assert params["sandbox"] is None
    t.reply(req["id"], {"processId": "p", "sandboxType": "none"})
    handle = await spawn
    write = asyncio.create_task(handle.write(b"hi\n"))
    req = await t.next_request()
    assert req["params"] == {"processId": "p", "chunk": b64(b"hi\n"), "writeId": "1"}
    t.reply(req["id"], {"status": "accepted"})
    assert await write is WriteStatus.ACCEPTED


async def test_notifications_feed_the_handle_in_seq_order(fake: Fake) -> None:
    client, t = fake
    spawn = asyncio.create_task(client.spawn(["x"], cwd="/", process_id="p"))
    req = await t.next_request()
    # Notifications may overtake the start reply.
    t.notify("process/output", {"processId": "p", "seq": 1, "stream": "stdout", "chunk": b64(b"a")})
    t.reply(req["id"], {"processId": "p", "sandboxType": "none"})
    handle = await spawn
    t.notify("process/output", {"processId": "p", "seq": 2, "stream": "stderr", "chunk": b64(b"b")})
    t.notify("process/exited", {"processId": "p", "seq": 3, "exitCode": 7})
    t.notify("process/closed", {"processId": "p", "seq": 4})
    result = await handle.collect()
    assert (result.stdout, result.stderr, result.exit_code) == (b"a", b"b", 7)
    # A closed process gets no more events: its handle is no longer routed.
    assert client._handles == {}


async def test_gap_in_notifications_is_filled_by_read(fake: Fake) -> None:
    client, t = fake
    spawn = asyncio.create_task(client.spawn(["x"], cwd="/", process_id="p"))
    req = await t.next_request()
    t.reply(req["id"], {"processId": "p", "sandboxType": "none"})
    handle = await spawn
    t.notify("process/output", {"processId": "p", "seq": 1, "stream": "stdout", "chunk": b64(b"1")})
    # seq 2 is lost; 3 arrives.
    t.notify("process/output", {"processId": "p", "seq": 3, "stream": "stdout", "chunk": b64(b"3")})
    first = await handle.read_chunk()
    assert first is not None and first.chunk == b"1"
    second = asyncio.create_task(handle.read_chunk())
    read = await t.next_request()
    assert read["method"] == "process/read"
    assert read["params"]["afterSeq"] == 1
    assert read["params"]["waitMs"] == 0
    t.reply(
        read["id"],
        {
            "chunks": [
                {"seq": 2, "stream": "stdout", "chunk": b64(b"2")},
                {"seq": 3, "stream": "stdout", "chunk": b64(b"3")},
            ],
            "nextSeq": 4,
            "exited": False,
            "exitCode": None,
            "closed": False,
            "failure": None,
        },
    )
    got = await second
    assert got is not None and (got.seq, got.chunk, got.stream) == (2, b"2", ProcessStream.STDOUT)
    third = await handle.read_chunk()
    assert third is not None and (third.seq, third.chunk) == (3, b"3")
    # The read returned chunks, so the handle confirms it reached the end.
    nxt = asyncio.create_task(handle.read_chunk())
    read = await t.next_request()
    assert read["params"]["afterSeq"] == 3
    t.reply(
        read["id"],
        {"chunks": [], "nextSeq": 6, "exited": True, "exitCode": 0, "closed": True},
    )
    assert await nxt is None
    assert (await handle.wait()).code == 0


async def test_second_concurrent_reader_is_refused(fake: Fake) -> None:
    client, t = fake
    spawn = asyncio.create_task(client.spawn(["x"], cwd="/", process_id="p"))
    req = await t.next_request()
    t.reply(req["id"], {"processId": "p", "sandboxType": "none"})
    handle = await spawn
    reader = asyncio.create_task(handle.read_chunk())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="already being read"):
        await handle.read_chunk()
    t.notify("process/closed", {"processId": "p", "seq": 1})
    assert await reader is None
