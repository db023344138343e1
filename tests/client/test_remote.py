"""ExecServerClient against a real ``exec-server serve`` child (WebSocket and stdio)."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest

from exec_server.client import (
    ConnectionLostError,
    ExecServerClient,
    HandshakeError,
)
from exec_server.exceptions import InvalidRequestError, MethodNotFoundError
from exec_server.protocol.types.process import (
    ReadParams,
    StartParams,
    TerminateParams,
)

ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin"}


async def test_handshake_returns_session_and_environment_info(server: Any) -> None:
    async with await ExecServerClient.connect(server.url, client_name="t") as client:
        assert uuid.UUID(client.session_id).version == 4
        assert client.initialize_result is not None
        info = msgspec.json.decode(client.initialize_result.environment_info)
        assert info["shell"]["name"] in ("bash", "sh")


async def test_typed_calls_start_read_terminate(server: Any) -> None:
    async with await ExecServerClient.connect(server.url) as client:
        started = await client.start_process(
            StartParams(
                process_id="typed",
                argv=["sh", "-c", "echo hi"],
                cwd="/",
                env=ENV,
                tty=False,
                sandbox=msgspec.Raw(b"null"),
            )
        )
        assert started.process_id == "typed"
        after = 0
        out = b""
        while True:
            r = await client.read_process(
                ReadParams(process_id="typed", after_seq=after, wait_ms=5000)
            )
            out += b"".join(c.chunk for c in r.chunks)
            after = r.next_seq - 1
            if r.closed:
                break
        assert out == b"hi\n"
        assert r.exit_code == 0
        term = await client.terminate_process(TerminateParams(process_id="typed"))
        assert term.running is False


async def test_server_errors_map_to_exception_classes(server: Any) -> None:
    async with await ExecServerClient.connect(server.url) as client:
        with pytest.raises(InvalidRequestError, match="unknown process id nope"):
            await client.read_process(ReadParams(process_id="nope"))
        with pytest.raises(MethodNotFoundError, match="no/such"):
            await client.call("no/such", None, dict)


async def test_duplicate_process_id_is_refused_by_server(server: Any) -> None:
    async with await ExecServerClient.connect(server.url) as client:
        first = await client.spawn(["sleep", "30"], cwd="/", env=ENV, process_id="dup")
        with pytest.raises(InvalidRequestError, match="process dup already exists"):
            await client.start_process(
                StartParams(
                    process_id="dup",
                    argv=["true"],
                    cwd="/",
                    env={},
                    tty=False,
                    sandbox=msgspec.Raw(b"null"),
                )
            )
        assert await first.terminate() is True
        assert (await first.wait()).code != 0


async def test_connect_failure_is_a_handshake_error() -> None:
    with pytest.raises(HandshakeError):
        await ExecServerClient.connect("ws://127.0.0.1:1", connect_timeout=5)


async def test_transport_loss_surfaces_on_pending_work(server_factory: Any) -> None:
    srv = server_factory()
    client = await ExecServerClient.connect(srv.url)
    try:
        proc = await client.spawn(["sleep", "30"], cwd="/", env=ENV)
        waiter = asyncio.create_task(proc.wait())
        srv.proc.kill()
        srv.proc.wait()
        with pytest.raises(ConnectionLostError, match="exec-server transport disconnected"):
            await asyncio.wait_for(waiter, 10)
        with pytest.raises(ConnectionLostError):
            await proc.write(b"x")
        assert not client.connected
        assert proc.failure is not None
        assert proc.failure.startswith("exec-server transport disconnected")
    finally:
        await client.aclose()


def _read_fifo(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _poke_fifo(path: Path) -> None:
    with open(path, "wb") as f:
        f.write(b"go\n")


async def test_resume_after_disconnect_loses_no_output(
    server_factory: Any, tmp_path: Path
) -> None:
    srv = server_factory("--detach-ttl", "30")
    gate, done = tmp_path / "gate", tmp_path / "done"
    os.mkfifo(gate)
    os.mkfifo(done)
    script = (
        f"echo first; read x < {gate}; "
        "i=0; while [ $i -lt 200 ]; do echo line$i; i=$((i+1)); done; "
        f"echo finished > {done}"
    )
    client = await ExecServerClient.connect(srv.url)
    try:
        proc = await client.spawn(["sh", "-c", script], cwd="/", env=ENV)
        first = await proc.read_chunk()
        assert first is not None and first.chunk == b"first\n"
        await client.disconnect()
        # Everything after this point is produced while no connection is attached.
        await asyncio.wait_for(asyncio.to_thread(_poke_fifo, gate), 10)
        assert await asyncio.wait_for(asyncio.to_thread(_read_fifo, done), 10) == b"finished\n"
        with pytest.raises(ConnectionLostError):
            await proc.read_chunk()
        await client.reconnect()
        rest = await proc.collect()
        expected = "".join(f"line{i}\n" for i in range(200)).encode()
        assert rest.stdout == expected
        assert rest.exit_code == 0
    finally:
        await client.aclose()


async def test_resume_with_new_client_and_adopted_handle(server_factory: Any) -> None:
    srv = server_factory("--detach-ttl", "30")
    first = await ExecServerClient.connect(srv.url)
    proc = await first.spawn(["sh", "-c", "echo one; echo two"], cwd="/", env=ENV,
                             process_id="kept")
    status = await proc.wait()
    assert status.code == 0
    session = first.session_id
    await first.aclose()
    async with await ExecServerClient.connect(srv.url, resume_session_id=session) as second:
        assert second.session_id == session
        again = second.adopt("kept")
        result = await again.collect()
        assert result.stdout == b"one\ntwo\n"


async def test_resume_unknown_session_is_rejected(server: Any) -> None:
    with pytest.raises(InvalidRequestError, match="unknown session id"):
        await ExecServerClient.connect(server.url, resume_session_id=str(uuid.uuid4()))


async def test_spawn_stdio_server() -> None:
    async with await ExecServerClient.spawn_stdio() as client:
        proc = await client.spawn(["sh", "-c", "echo via-stdio; exit 4"], cwd="/", env=ENV)
        result = await proc.collect()
    assert result.stdout == b"via-stdio\n"
    assert result.exit_code == 4
