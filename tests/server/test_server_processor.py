"""Connection processor in-process: handshake, gating, dispatch order, sessions.

PROTOCOL.md §3.5, §4, §15.1-§15.2. Uses memory transports and test-only
routes, so it does not depend on the process or filesystem handlers.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

import exec_server
from exec_server.exceptions import InternalError
from exec_server.server.router import RequestContext

TIMEOUT = 10.0


class Empty(msgspec.Struct):
    pass


class WaitParams(msgspec.Struct):
    key: str


class Done(msgspec.Struct):
    key: str


class Events(dict[str, asyncio.Event]):
    """``events[key]`` releases a waiting handler; ``events["started:" + key]`` is
    set once it waits."""

    def __missing__(self, key: str) -> asyncio.Event:
        ev = self[key] = asyncio.Event()
        return ev


def add_test_routes(srv: Any) -> Events:
    """``test/echo`` (exec), ``test/fs`` (filesystem), ``test/hold`` (holds the
    connection), ``test/poll`` (unblocks, waits, re-checks attachment)."""
    events = Events()
    router = srv.server.router

    def event(key: str) -> asyncio.Event:
        events["started:" + key].set()
        return events[key]

    async def echo(ctx: RequestContext, params: WaitParams) -> Done:
        return Done(params.key)

    async def hold(ctx: RequestContext, params: WaitParams) -> Done:
        await event(params.key).wait()
        return Done(params.key)

    async def poll(ctx: RequestContext, params: WaitParams) -> Done:
        ctx.unblock()
        await event(params.key).wait()
        ctx.ensure_attached()
        return Done(params.key)

    async def boom(ctx: RequestContext, params: Empty | None) -> Done:
        raise RuntimeError("secret detail")

    async def typed(ctx: RequestContext, params: Empty | None) -> Done:
        raise InternalError("spawn failed: No such file or directory (os error 2)")

    router.add("test/echo", WaitParams, echo, "exec")
    router.add("test/fs", WaitParams, echo, "filesystem")
    router.add("test/hold", WaitParams, hold, "exec")
    router.add("test/poll", WaitParams, poll, "exec", may_block=True)
    async def nested(ctx: RequestContext, params: Empty | None) -> Done:
        msgspec.json.decode(b'{"a":1}', type=WaitParams)
        raise AssertionError("unreachable")

    router.add("test/nested", Empty | None, nested, None)
    router.add("test/boom", Empty | None, boom, None)
    router.add("test/typed", Empty | None, typed, None)
    return events


async def test_initialize_returns_uuid_and_environment_info(
    inprocess_server: Callable[..., Any],
) -> None:
    srv = inprocess_server()
    client = await srv.connect()
    result = await client.call("initialize", {"clientName": "t", "resumeSessionId": None})
    assert uuid.UUID(result["sessionId"]).version == 4
    info = result["environmentInfo"]
    assert info["shell"]["name"] in ("bash", "zsh", "sh")
    assert info["shell"]["path"].startswith("/")
    assert info["cwd"].startswith("file:///")
    assert info["tempDir"].startswith("file:///")
    assert info["capabilities"] == {
        "environmentConfigRead": True,
        "httpHeaderEnvVars": True,
        "sandboxedFileStreaming": True,
        "fileWriteStreaming": True,
    }
    assert info["executorVersion"] == exec_server.__version__
    assert info["prependPathDirs"] == []
    assert info["providerId"].startswith("sha256:") and len(info["providerId"]) == 71


async def test_gating_texts_in_spec_order(inprocess_server: Callable[..., Any]) -> None:
    srv = inprocess_server()
    add_test_routes(srv)
    client = await srv.connect()
    reply = await client.request("test/echo", {"key": "a"})
    assert reply["error"] == {
        "code": -32600,
        "message": "client must call initialize before using exec methods",
    }
    reply = await client.request("test/fs", {"key": "a"})
    assert (
        reply["error"]["message"] == "client must call initialize before using filesystem methods"
    )
    await client.call("initialize", {"clientName": "t"})
    reply = await client.request("test/echo", {"key": "a"})
    assert reply["error"] == {
        "code": -32600,
        "message": "client must send initialized before using exec methods",
    }
    await client.notify("initialized")
    assert await client.call("test/echo", {"key": "a"}) == {"key": "a"}
    await client.notify("initialized", {"ignored": True})  # twice is harmless
    assert await client.call("test/fs", {"key": "b"}) == {"key": "b"}


async def test_initialize_twice_and_failed_resume_allows_retry(
    inprocess_server: Callable[..., Any],
) -> None:
    srv = inprocess_server()
    client = await srv.connect()
    reply = await client.request("initialize", {"clientName": "t", "resumeSessionId": "nope"})
    assert reply["error"] == {"code": -32600, "message": "unknown session id nope"}
    await client.call("initialize", {"clientName": "t"})
    reply = await client.request("initialize", {"clientName": "t"})
    assert reply["error"] == {
        "code": -32600,
        "message": "initialize may only be sent once per connection",
    }


async def test_params_errors_are_32602_with_decoder_text(
    inprocess_server: Callable[..., Any],
) -> None:
    srv = inprocess_server()
    add_test_routes(srv)
    client = await srv.connect()
    await client.initialize()
    reply = await client.request("test/echo", {})
    assert reply["error"]["code"] == -32602
    assert reply["error"]["message"] == "missing field `key`"  # upstream's (serde's) words
    reply = await client.request("test/echo", None, omit_params=True)
    assert reply["error"]["code"] == -32602
    reply = await client.request("initialize", {"clientName": 5})
    assert reply["error"]["code"] == -32602
    # {} works for a method without params (retried as null)
    reply = await client.request("environment/status", {})
    assert reply["result"] == {"status": "ready"}


async def test_unknown_method_and_internal_errors(inprocess_server: Callable[..., Any]) -> None:
    srv = inprocess_server()
    add_test_routes(srv)
    client = await srv.connect()
    reply = await client.request("no/such", {}, msg_id="s1")
    assert reply == {
        "id": "s1",
        "error": {"code": -32601, "message": "exec-server stub does not implement `no/such` yet"},
    }
    reply = await client.request("test/boom")
    assert reply["error"] == {"code": -32603, "message": "internal error"}
    reply = await client.request("test/nested")
    assert reply["error"] == {"code": -32602, "message": "missing field `key`"}
    reply = await client.request("test/typed")
    assert reply["error"] == {
        "code": -32603,
        "message": "spawn failed: No such file or directory (os error 2)",
    }
    assert await client.call("environment/status") == {"status": "ready"}


@pytest.mark.parametrize(
    "message",
    [
        {"method": "process/output", "params": {}},
        {"method": "bogus"},
        {"id": 1, "result": {}},
        {"id": 1, "error": {"code": 1, "message": "x"}},
    ],
)
async def test_unexpected_messages_close_the_connection(
    inprocess_server: Callable[..., Any], message: dict[str, Any]
) -> None:
    srv = inprocess_server()
    client = await srv.connect()
    await client.initialize()
    await client.send(message)
    await client.wait_closed()
    await asyncio.wait_for(client.task, TIMEOUT)
    assert len(client.all_messages) == 1  # only the initialize reply


async def test_initialized_before_initialize_closes(inprocess_server: Callable[..., Any]) -> None:
    srv = inprocess_server()
    client = await srv.connect()
    await client.notify("initialized", {})
    await client.wait_closed()
    assert client.all_messages == []


async def test_malformed_line_keeps_connection(inprocess_server: Callable[..., Any]) -> None:
    srv = inprocess_server()
    client = await srv.connect()
    await client.send_raw("{broken")
    reply = await client.response(-1)
    assert reply["error"]["code"] == -32600
    assert reply["error"]["message"].startswith(
        "failed to parse JSON-RPC message from exec-server test b: "
    )
    await client.initialize()


async def test_requests_are_answered_in_order_by_default(
    inprocess_server: Callable[..., Any],
) -> None:
    srv = inprocess_server()
    events = add_test_routes(srv)
    client = await srv.connect()
    await client.initialize()
    await client.send({"id": 1, "method": "test/hold", "params": {"key": "h"}})
    await client.send({"id": 2, "method": "test/echo", "params": {"key": "e"}})
    with pytest.raises(TimeoutError):
        await client.response(2, timeout=0.2)
    events["h"].set()
    assert (await client.response(1))["result"] == {"key": "h"}
    assert (await client.response(2))["result"] == {"key": "e"}
    ids = [m["id"] for m in client.all_messages if "id" in m]
    assert ids[-2:] == [1, 2]


async def test_unblocked_long_poll_does_not_delay_later_requests(
    inprocess_server: Callable[..., Any],
) -> None:
    srv = inprocess_server()
    events = add_test_routes(srv)
    client = await srv.connect()
    await client.initialize()
    await client.send({"id": 1, "method": "test/poll", "params": {"key": "p"}})
    for i in range(2, 10):
        await client.send({"id": i, "method": "test/echo", "params": {"key": str(i)}})
    for i in range(2, 10):
        assert (await client.response(i))["result"] == {"key": str(i)}
    assert not any(m.get("id") == 1 for m in client.all_messages)
    events["p"].set()
    assert (await client.response(1))["result"] == {"key": "p"}


async def test_resume_after_disconnect_and_ttl_expiry(inprocess_server: Callable[..., Any]) -> None:
    srv = inprocess_server(detach_ttl=0.3)
    a = await srv.connect()
    session_id = await a.initialize()
    await a.aclose()
    await asyncio.wait_for(a.task, TIMEOUT)
    b = await srv.connect()
    assert await b.initialize(resume_session_id=session_id) == session_id
    await b.aclose()
    await asyncio.wait_for(b.task, TIMEOUT)
    registry = srv.server.registry
    session = registry.get(session_id)
    assert session is not None
    await asyncio.wait_for(session.closed.wait(), TIMEOUT)  # expired after the TTL
    assert registry.get(session_id) is None
    c = await srv.connect()
    reply = await c.request("initialize", {"clientName": "t", "resumeSessionId": session_id})
    assert reply["error"] == {"code": -32600, "message": f"unknown session id {session_id}"}


async def test_resume_cancels_the_detach_timer(inprocess_server: Callable[..., Any]) -> None:
    srv = inprocess_server(detach_ttl=0.3)
    a = await srv.connect()
    session_id = await a.initialize()
    await a.aclose()
    await asyncio.wait_for(a.task, TIMEOUT)
    session = srv.server.registry.get(session_id)
    assert session is not None
    timer = session.expiry
    assert timer is not None
    b = await srv.connect()
    assert await b.initialize(resume_session_id=session_id) == session_id
    await asyncio.wait_for(asyncio.gather(timer, return_exceptions=True), TIMEOUT)
    assert timer.cancelled()
    assert srv.server.registry.get(session_id) is session
    assert not session.closed.is_set()


async def test_resume_of_attached_session_is_rejected(
    inprocess_server: Callable[..., Any],
) -> None:
    srv = inprocess_server()
    a = await srv.connect()
    session_id = await a.initialize()
    b = await srv.connect()
    reply = await b.request("initialize", {"clientName": "t", "resumeSessionId": session_id})
    assert reply["error"] == {
        "code": -32600,
        "message": f"session {session_id} is already attached to another connection",
    }
    # A is unaffected
    assert await a.call("environment/status") == {"status": "ready"}


async def test_in_flight_long_poll_fails_after_eviction(
    inprocess_server: Callable[..., Any],
) -> None:
    """§15.1 test 3: A detaches while its poll waits; B resumes; A's poll fails."""
    srv = inprocess_server()
    events = add_test_routes(srv)
    a = await srv.connect()
    session_id = await a.initialize()
    await a.send({"id": 7, "method": "test/poll", "params": {"key": "p"}})
    await asyncio.wait_for(events["started:p"].wait(), TIMEOUT)
    # detach A without dropping its transport (upstream's handler-level teardown)
    srv.server.registry.detach(a.processor.attachment)
    b = await srv.connect()
    assert await b.initialize(resume_session_id=session_id) == session_id
    events["p"].set()
    reply = await a.response(7)
    assert reply["error"] == {
        "code": -32600,
        "message": "session has been resumed by another connection",
    }
    # A's next message closes A (§3.5); B keeps working
    await a.send({"id": 8, "method": "test/echo", "params": {"key": "x"}})
    await a.wait_closed()
    assert await b.call("test/echo", {"key": "b"}) == {"key": "b"}


async def test_disconnect_aborts_in_flight_long_poll_and_resume_is_immediate(
    inprocess_server: Callable[..., Any], tmp_path: Any
) -> None:
    """§15.2 test 7: A's in-flight long-poll read must not delay B's resume."""
    srv = inprocess_server()
    a = await srv.connect()
    session_id = await a.initialize()
    await a.call(
        "process/start",
        {
            "processId": "late",
            "argv": ["/bin/sh", "-c", "sleep 1; printf late"],
            "cwd": str(tmp_path),
            "env": {"PATH": "/usr/bin:/bin"},
            "tty": False,
            "sandbox": None,
        },
    )
    await a.send(
        {"id": 3, "method": "process/read", "params": {"processId": "late", "waitMs": 5000}}
    )
    assert await a.call("environment/status") == {"status": "ready"}  # read is in flight
    await a.aclose()
    async with asyncio.timeout(1.0):  # A's processor ends without waiting for the read
        await a.task
    b = await srv.connect()
    async with asyncio.timeout(1.0):
        assert await b.initialize(resume_session_id=session_id) == session_id
    result = await b.call("process/terminate", {"processId": "late"})
    assert set(result) == {"running"}


async def test_process_read_long_poll_fails_after_resume(
    inprocess_server: Callable[..., Any], tmp_path: Any
) -> None:
    """§15.1 test 3 with the real ``process/read`` handler."""
    srv = inprocess_server()
    a = await srv.connect()
    session_id = await a.initialize()
    await a.call(
        "process/start",
        {
            "processId": "quiet",
            "argv": ["/bin/sleep", "5"],
            "cwd": str(tmp_path),
            "env": {"PATH": "/usr/bin:/bin"},
            "tty": False,
            "sandbox": None,
        },
    )
    await a.send(
        {"id": 50, "method": "process/read", "params": {"processId": "quiet", "waitMs": 5000}}
    )
    # the read is in flight once a later request on the same connection is answered
    assert await a.call("environment/status") == {"status": "ready"}
    srv.server.registry.detach(a.processor.attachment)
    b = await srv.connect()
    await b.initialize(resume_session_id=session_id)
    reply = await a.response(50, timeout=3.0)
    assert reply["error"] == {
        "code": -32600,
        "message": "session has been resumed by another connection",
    }
    assert (await b.call("process/terminate", {"processId": "quiet"}))["running"] is True
    await b.notification("process/closed")


class _UnresolvableParams(msgspec.Struct):
    value: NoSuchType  # type: ignore[name-defined]  # noqa: F821


def test_router_makes_each_params_decoder_when_the_method_is_registered() -> None:
    """A params decoder is made when its method is added, not on the first request
    (making one costs ~0.2 ms); so a type it cannot decode fails at once."""
    from exec_server.server.router import Router

    async def handler(ctx: RequestContext, params: object) -> None:
        raise AssertionError("never called")

    router = Router()
    with pytest.raises(NameError, match="NoSuchType"):
        router.add("test/unresolvable", _UnresolvableParams, handler, None)
    assert "test/unresolvable" not in router.methods

    class Fine(msgspec.Struct):
        value: int

    router.add("test/fine", Fine, handler, None)
    assert "test/fine" in router.methods
