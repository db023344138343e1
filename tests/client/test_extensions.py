"""``process/resizePty`` and ``process/closeStdin``: this server's extensions.

Both backends implement them; against a server answering -32601 (upstream)
the client raises :class:`NotSupportedError` and never sends them again.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from exec_server.client import NotSupportedError
from exec_server.exceptions import InvalidParamsError, InvalidRequestError
from exec_server.protocol.types.process import METHOD_CLOSE_STDIN, METHOD_RESIZE_PTY


async def test_resize_reaches_the_pty(backend: Any, sh_env: dict[str, str]) -> None:
    proc = await backend.start(["sh", "-c", "read l; stty size"], env=sh_env, tty=True)
    await proc.resize(40, 123)
    await proc.write(b"\n")
    done = await proc.collect()
    assert done.exit_code == 0
    assert b"40 123" in done.stdout


async def test_resize_refuses_a_pipe_process_and_bad_sizes(backend: Any,
                                                           sh_env: dict[str, str]) -> None:
    proc = await backend.start(["cat"], env=sh_env, pipe_stdin=True)
    with pytest.raises(InvalidParamsError, match="no PTY"):
        await proc.resize(10, 10)
    tty = await backend.start(["cat"], env=sh_env, tty=True)
    with pytest.raises(InvalidParamsError):
        await tty.resize(0, 80)
    await proc.terminate()
    await tty.terminate()
    await proc.wait()
    await tty.wait()


async def test_close_stdin_after_writes(backend: Any, sh_env: dict[str, str]) -> None:
    proc = await backend.start(["cat"], env=sh_env, pipe_stdin=True)
    await proc.write(b"a" * 300_000)
    await proc.close_stdin()
    done = await proc.collect()
    assert (done.exit_code, done.stdout) == (0, b"a" * 300_000)


async def test_remote_server_supports_both(server: Any) -> None:
    from exec_server.client import ExecServerClient

    async with await ExecServerClient.connect(server.url) as client:
        assert await client.supports(METHOD_RESIZE_PTY)
        assert await client.supports(METHOD_CLOSE_STDIN)
        with pytest.raises(InvalidRequestError, match="unknown process"):
            await client.resize_pty("nope", 10, 10)


async def test_method_not_found_is_remembered(fake: Any) -> None:
    client, t = fake
    task = asyncio.create_task(client.resize_pty("p", 24, 80))
    req = await t.next_request()
    assert req["method"] == METHOD_RESIZE_PTY
    assert req["params"] == {"processId": "p", "rows": 24, "cols": 80}
    t.error(req["id"], -32601, "unknown method")
    with pytest.raises(NotSupportedError):
        await task
    # known now: refused without a request
    with pytest.raises(NotSupportedError):
        await client.resize_pty("p", 24, 80)
    assert not await client.supports(METHOD_RESIZE_PTY)
    assert t.to_server.empty()
    # the other extension is asked once, with an id no server knows
    probe = asyncio.create_task(client.supports(METHOD_CLOSE_STDIN))
    req = await t.next_request()
    assert req["method"] == METHOD_CLOSE_STDIN
    t.error(req["id"], -32600, "unknown process id")
    assert await probe
