"""``serve --listen stdio`` and the command line (PROTOCOL.md §2.1-§2.3, §2.6, §15.3)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from exec_server.transport.listen import STDIO, ListenAddress, ListenUrlError, parse_listen_url

TIMEOUT = 10.0


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("ws://127.0.0.1:0", ListenAddress("127.0.0.1", 0)),
        ("ws://127.0.0.1:1234", ListenAddress("127.0.0.1", 1234)),
        ("ws://[::1]:80", ListenAddress("::1", 80)),
        ("ws://0.0.0.0:65535", ListenAddress("0.0.0.0", 65535)),
        ("stdio", STDIO),
        ("stdio://", STDIO),
    ],
)
def test_parse_listen_url_accepts(url: str, expected: object) -> None:
    assert parse_listen_url(url) == expected


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (
            "ws://localhost:1234",
            "invalid websocket --listen URL `ws://localhost:1234`; expected `ws://IP:PORT`",
        ),
        (
            "http://127.0.0.1:1234",
            "unsupported --listen URL `http://127.0.0.1:1234`; expected `ws://IP:PORT`",
        ),
        (
            "ws://127.0.0.1",
            "invalid websocket --listen URL `ws://127.0.0.1`; expected `ws://IP:PORT`",
        ),
        (
            "ws://127.0.0.1:0/",
            "invalid websocket --listen URL `ws://127.0.0.1:0/`; expected `ws://IP:PORT`",
        ),
        (
            "ws://127.0.0.1:65536",
            "invalid websocket --listen URL `ws://127.0.0.1:65536`; expected `ws://IP:PORT`",
        ),
        ("ws://::1:80", "invalid websocket --listen URL `ws://::1:80`; expected `ws://IP:PORT`"),
        (
            "wss://127.0.0.1:1",
            "unsupported --listen URL `wss://127.0.0.1:1`; expected `ws://IP:PORT`",
        ),
    ],
)
def test_parse_listen_url_rejects_with_upstream_text(url: str, message: str) -> None:
    with pytest.raises(ListenUrlError) as info:
        parse_listen_url(url)
    assert str(info.value) == message


def test_serve_rejects_bad_url_on_stderr_and_prints_nothing() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "exec_server", "serve", "--listen", "ws://localhost:1"],
        capture_output=True,
        timeout=TIMEOUT * 3,
        check=False,
    )
    assert proc.returncode != 0
    assert proc.stdout == b""
    assert (
        b"invalid websocket --listen URL `ws://localhost:1`; expected `ws://IP:PORT`" in proc.stderr
    )


def test_url_is_the_only_stdout_line_and_sigterm_stops_cleanly(
    server_factory: Callable[..., Any],
) -> None:
    srv = server_factory(listen=None)  # the default is ws://127.0.0.1:0
    assert srv.url.startswith("ws://127.0.0.1:")
    assert srv.stop() == 0
    assert srv.proc.stdout is not None


async def test_stdio_transport_round_trip(stdio_rpc: Callable[..., Awaitable[Any]]) -> None:
    client = await stdio_rpc()
    await client.send_raw("")  # blank lines are ignored
    await client.send_raw("{nope")
    reply = await client.response(-1)
    assert reply["error"]["code"] == -32600
    assert reply["error"]["message"].startswith(
        "failed to parse JSON-RPC message from exec-server stdio: "
    )
    session_id = await client.initialize()
    assert uuid.UUID(session_id)
    reply = await client.request("no/such", {})
    assert reply["error"]["code"] == -32601
    # pipelined
    for i in range(1, 6):
        await client.send({"id": f"s{i}", "method": "environment/status"})
    for i in range(1, 6):
        assert (await client.response(f"s{i}"))["result"] == {"status": "ready"}


async def test_stdio_oversized_line(stdio_rpc: Callable[..., Awaitable[Any]]) -> None:
    client = await stdio_rpc("--max-message-size", "100K")
    await client.send_raw(json.dumps({"id": 9, "method": "x", "params": "y" * 300_000}))
    reply = await client.response(9)
    assert "too large" in reply["error"]["message"]
    assert await client.call("environment/status") == {"status": "ready"}


async def test_stdio_eof_ends_the_server(stdio_rpc: Callable[..., Awaitable[Any]]) -> None:
    client = await stdio_rpc()
    await client.initialize()
    await client.close_sending()  # closes the child's stdin
    await client.wait_closed()  # the server exits and its stdout ends


async def test_processes_over_stdio(
    stdio_rpc: Callable[..., Awaitable[Any]], tmp_path: Any
) -> None:
    client = await stdio_rpc()
    await client.initialize()
    await client.call(
        "process/start",
        {
            "processId": "p",
            "argv": ["/bin/sh", "-c", "echo hi"],
            "cwd": str(tmp_path),
            "env": {"PATH": "/usr/bin:/bin"},
            "tty": False,
            "sandbox": None,
        },
    )
    closed = await client.notification("process/closed")
    assert closed["params"]["processId"] == "p"
    read = await client.call("process/read", {"processId": "p", "afterSeq": 0})
    assert read["closed"] is True and read["exitCode"] == 0


async def test_stdio_eof_kills_processes_and_leaves_nothing(
    no_leaks: None, stdio_rpc: Callable[..., Awaitable[Any]], tmp_path: Any
) -> None:
    client = await stdio_rpc()
    await client.initialize()
    await client.call(
        "process/start",
        {
            "processId": "bg",
            "argv": ["/bin/sh", "-c", "sleep 30 & echo started; wait"],
            "cwd": str(tmp_path),
            "env": {"PATH": "/usr/bin:/bin"},
            "tty": False,
            "sandbox": None,
        },
    )
    note = await client.notification("process/output")
    assert note["params"]["processId"] == "bg"
    await client.close_sending()  # stdin EOF: the server kills the session and exits
    await client.wait_closed()  # ... and its stdout ends


def test_bad_exec_server_log_is_one_line() -> None:
    import os
    import subprocess
    import sys

    env = dict(os.environ, EXEC_SERVER_LOG="verbose")
    res = subprocess.run([sys.executable, "-m", "exec_server", "serve", "--listen", "stdio"],
                         env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
                         check=False)
    assert res.returncode == 2
    assert res.stdout == b""
    assert res.stderr == (b"Error: EXEC_SERVER_LOG='verbose' is not a log level (choose from "
                          b"debug, info, warning, error)\n")
