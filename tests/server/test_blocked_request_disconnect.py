"""A request that waits for ever (a ``process/write`` to a child that never reads
its stdin) must not outlive its connection, nor hold up server shutdown
(PROTOCOL.md §2.7: a disconnect aborts the request in progress; docs/server.md,
"Sessions and resume"). Over a real server (WebSocket and stdio), and in process
for the order of the messages read ahead meanwhile."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from exec_server.server.connection import READ_AHEAD_MESSAGES

TIMEOUT = 10.0
#: 100 KB per write; WRITES of them exceed both bounds of a child's stdin queue
#: (128 writes, 16 MiB) plus its pipe, so one of them waits while the child sleeps.
CHUNK = base64.b64encode(b"x" * 100_000).decode()
WRITES = 200
#: writes that are surely accepted (under both bounds): their replies come back.
ACCEPTED = 100


def _start(process_id: str, script: str, cwd: str) -> dict[str, Any]:
    """A pipe child with a writable stdin (current client's ``pipeStdin``)."""
    return {
        "processId": process_id,
        "argv": ["/bin/sh", "-c", script],
        "cwd": cwd,
        "env": {"PATH": "/usr/bin:/bin"},
        "tty": False,
        "arg0": None,
        "pipeStdin": True,
    }


async def _start_sleeper(client: Any, cwd: str) -> int:
    """Start a child that never reads stdin; returns its pid (it prints it first)."""
    await client.call("process/start", _start("w", "echo $$; exec sleep 1000", cwd))
    note = await client.notification("process/output", timeout=TIMEOUT)
    return int(base64.b64decode(note["params"]["chunk"]))


async def _block_a_write(client: Any) -> None:
    """Pipeline writes until one of them must wait; the first ACCEPTED are answered."""
    for i in range(WRITES):
        await client.send(
            {"id": i, "method": "process/write", "params": {"processId": "w", "chunk": CHUNK}}
        )
    for i in range(ACCEPTED):
        reply = await client.response(i, timeout=TIMEOUT)
        assert reply.get("result") == {"status": "accepted"}, reply


async def _queue_behind(client: Any, count: int, tmp_path: Path) -> dict[str, Any]:
    """Send ``count`` requests behind the blocked write; returns their params."""
    metadata = {"path": str(tmp_path), "sandbox": None}
    for i in range(count):
        await client.send({"id": f"m{i}", "method": "fs/getMetadata", "params": metadata})
    return metadata


def _alive(pid: int) -> bool:
    """Running or a zombie nobody reaped (a reaped child has no /proc entry)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] != b"Z"


@pytest.mark.parametrize("behind", [0, READ_AHEAD_MESSAGES + 300], ids=["alone", "past-bound"])
async def test_a_disconnect_ends_a_blocked_write_and_the_session_expires(
    no_leaks: None,
    wait_until: Callable[..., Awaitable[None]],
    server_factory: Callable[..., Any],
    rpc: Callable[[str], Awaitable[Any]],
    tmp_path: Path,
    behind: int,
) -> None:
    """``past-bound``: more requests queued behind the blocked write than are read
    ahead (4096), so the connection is no longer read, but its descriptor is
    watched for the peer leaving (the reset used to go unseen for good)."""
    srv = server_factory("--detach-ttl", "0.5")
    client = await rpc(srv.url)
    await client.initialize()
    child = await _start_sleeper(client, str(tmp_path))
    await _block_a_write(client)
    metadata = await _queue_behind(client, behind, tmp_path)
    client.ws.transport.abort()  # a TCP reset, no close frame (as Codex leaves)
    # The blocked write used to keep the session attached: `sleep 1000` lived on.
    await wait_until(lambda: not _alive(child), timeout=TIMEOUT)
    other = await rpc(srv.url)
    await other.initialize()
    assert (await other.call("fs/getMetadata", metadata))["isDirectory"] is True
    await other.call("process/start", _start("again", "exit 7", str(tmp_path)))
    exited = await other.notification("process/exited", timeout=TIMEOUT)
    assert exited["params"]["exitCode"] == 7
    assert srv.stop() == 0
    assert "Traceback" not in srv.stderr_text()


async def test_a_disconnect_ends_a_write_file_stuck_on_a_fifo(
    no_leaks: None,
    wait_until: Callable[..., Awaitable[None]],
    server_factory: Callable[..., Any],
    rpc: Callable[[str], Awaitable[Any]],
    tmp_path: Path,
) -> None:
    """Any request that waits, not only ``process/write``: a big ``fs/writeFile``
    (handled in the read loop) to a FIFO whose reader never reads."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # there, but never reads
    try:
        srv = server_factory("--detach-ttl", "0.5")
        client = await rpc(srv.url)
        await client.initialize()
        child = await _start_sleeper(client, str(tmp_path))
        data = base64.b64encode(b"y" * (4 << 20)).decode()  # more than the pipe takes
        await client.send(
            {"id": 1, "method": "fs/writeFile", "params": {"path": str(fifo), "dataBase64": data}}
        )
        await client.close_sending()  # a close frame while the write waits
        await wait_until(lambda: not _alive(child), timeout=TIMEOUT)
    finally:
        os.close(reader)  # the server's worker gets EPIPE and lets go
    assert srv.stop() == 0


async def test_sigterm_ends_a_server_with_a_blocked_write(
    no_leaks: None,
    server_factory: Callable[..., Any],
    rpc: Callable[[str], Awaitable[Any]],
    tmp_path: Path,
) -> None:
    srv = server_factory()
    client = await rpc(srv.url)
    await client.initialize()
    child = await _start_sleeper(client, str(tmp_path))
    await _block_a_write(client)
    srv.proc.send_signal(signal.SIGTERM)
    # It used to close its listener and then wait for ever for that write.
    status = await asyncio.to_thread(srv.proc.wait, TIMEOUT)
    assert status == 0
    assert not _alive(child)
    await client.wait_closed()
    assert "Traceback" not in srv.stderr_text()


@pytest.mark.parametrize("behind", [0, READ_AHEAD_MESSAGES + 300], ids=["alone", "past-bound"])
async def test_stdin_eof_ends_a_stdio_server_with_a_blocked_write(
    no_leaks: None,
    stdio_rpc: Callable[..., Awaitable[Any]],
    tmp_path: Path,
    behind: int,
) -> None:
    """``past-bound``: stdin is no longer read, but its hang-up is watched."""
    client = await stdio_rpc()
    await client.initialize()
    child = await _start_sleeper(client, str(tmp_path))
    await _block_a_write(client)
    await _queue_behind(client, behind, tmp_path)
    await client.close_sending()  # end of stdin stops a stdio server
    await client.wait_closed()  # stdout ends: the server exited
    assert not _alive(child)


async def test_messages_read_ahead_behind_a_waiting_write_keep_their_order(
    no_leaks: None,
    wait_until: Callable[..., Awaitable[None]],
    inprocess_server: Callable[..., Any],
    tmp_path: Path,
) -> None:
    """The read loop reads on while a write waits, but later requests still run
    after it, in order, once the child reads."""
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    gate_fd = os.open(gate, os.O_RDWR | os.O_NONBLOCK)  # the child's open never waits
    try:
        srv = inprocess_server()
        client = await srv.connect()
        processor = client.processor
        await client.initialize()
        # Reads nothing until the gate opens, then everything.
        script = f"read go < {gate}; exec cat > /dev/null"
        await client.call("process/start", _start("w", script, str(tmp_path)))
        for i in range(WRITES):
            await client.send(
                {"id": i, "method": "process/write", "params": {"processId": "w", "chunk": CHUNK}}
            )
        for i in range(ACCEPTED):
            await client.response(i, timeout=TIMEOUT)
        later = [("process/read", {"processId": "w"}), ("fs/getMetadata", {"path": str(gate)})]
        for i, (method, params) in enumerate(later, start=WRITES):
            await client.send({"id": i, "method": method, "params": params})
        # Read ahead while a write waits (the last one too), and not answered yet.
        last = b'{"id": %d,' % (WRITES + len(later) - 1)
        await wait_until(
            lambda: bool(processor._ahead) and bytes(processor._ahead[-1]).startswith(last),
            timeout=TIMEOUT,
        )
        answered = {m["id"] for m in client.all_messages if "id" in m}
        assert answered.isdisjoint(range(WRITES - 1, WRITES + len(later)))
        os.write(gate_fd, b"go\n")
        for i in range(WRITES + len(later)):
            reply = await client.response(i, timeout=TIMEOUT)
            assert "result" in reply, reply
        ids = [m["id"] for m in client.all_messages if "id" in m and m["id"] in range(500)]
        assert ids == list(range(WRITES + len(later)))
        await client.call("process/terminate", {"processId": "w"})
        await client.notification("process/closed", timeout=TIMEOUT)
    finally:
        os.close(gate_fd)
