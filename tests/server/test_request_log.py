"""``--log-level debug`` logs each request (never data or the environment);
a failed ``process/start`` shows at info; SIGTERM closes every WebSocket cleanly."""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosedOK

SECRET = "hunter2-c30-secret"


async def _run_to_close(client: Any, process_id: str) -> None:
    while True:
        msg = await client.notification("process/closed")
        if msg["params"]["processId"] == process_id:
            return


async def test_debug_logs_each_request_without_data(
    server_factory: Callable[..., Any], rpc: Any, tmp_path: Path
) -> None:
    srv = server_factory("--log-level", "debug")
    client = await rpc(srv.url)
    await client.initialize()
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text(SECRET)
    await client.call("process/start", {
        "processId": "p1", "argv": ["echo", "hello-argv"], "cwd": str(tmp_path),
        "env": {"PATH": "/usr/bin:/bin", "API_TOKEN": SECRET}, "tty": False, "arg0": None})
    await _run_to_close(client, "p1")
    await client.call("fs/readFile", {"path": str(secret_file)})
    await client.call("fs/writeFile", {"path": str(tmp_path / "w.txt"),
                                       "dataBase64": base64.b64encode(SECRET.encode()).decode()})
    reply = await client.request("process/start", {
        "processId": "p2", "argv": ["no-such-program-c30"], "cwd": str(tmp_path), "env": {},
        "tty": False, "arg0": None})
    assert "error" in reply
    srv.stop()
    log = srv.stderr_text()
    assert re.search(r"request process/start id=\d+ process=p1 argv=\['echo', 'hello-argv'\] "
                     r"[\d.]+ms ok", log), log
    assert re.search(rf"request fs/readFile id=\d+ path={re.escape(str(secret_file))} "
                     r"[\d.]+ms ok", log), log
    assert re.search(r"INFO .*request process/start id=\d+ process=p2 "
                     r"argv=\['no-such-program-c30'\] [\d.]+ms error -32\d+: ", log), log
    assert SECRET not in log
    assert base64.b64encode(SECRET.encode()).decode() not in log


async def test_failed_start_is_logged_at_info(
    server_factory: Callable[..., Any], rpc: Any, tmp_path: Path
) -> None:
    srv = server_factory("--log-level", "info")
    client = await rpc(srv.url)
    await client.initialize()
    await client.call("process/start", {
        "processId": "ok", "argv": ["true"], "cwd": str(tmp_path),
        "env": {"PATH": "/usr/bin:/bin"}, "tty": False, "arg0": None})
    await _run_to_close(client, "ok")
    reply = await client.request("process/start", {
        "processId": "bad", "argv": ["/nonexistent-c30/x"], "cwd": str(tmp_path), "env": {},
        "tty": False, "arg0": None})
    assert "error" in reply
    srv.stop()
    log = srv.stderr_text()
    assert "process=bad argv=['/nonexistent-c30/x']" in log
    assert "process=ok" not in log  # successes are debug only


async def test_sigterm_sends_a_close_frame_to_every_connection(
    server_factory: Callable[..., Any],
) -> None:
    srv = server_factory()
    conns = [await connect(srv.url, compression=None) for _ in range(3)]
    try:
        srv.proc.terminate()
        for ws in conns:
            try:
                async with asyncio.timeout(30):
                    await ws.recv()
            except ConnectionClosedOK as exc:
                assert exc.rcvd is not None and exc.rcvd.code == 1001, exc
            else:
                raise AssertionError("message instead of a close frame")
    finally:
        for ws in conns:
            await ws.close()
    assert srv.proc.wait(timeout=30) == 0
