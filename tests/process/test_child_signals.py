"""Children of a server that inherited ignored/blocked signals start clean.

The server runs under a wrapper that does what ``nohup`` and a non-interactive
shell's ``&`` do (SIGHUP, SIGINT, SIGQUIT ignored) and also blocks SIGUSR2;
every kind of launch (pipes, PTY, each sandbox backend, the Landlock spawn
zygote) must still start its command with nothing ignored and nothing blocked.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest

from exec_server.client import ExecServerClient
from exec_server.client.sandbox_contexts import read_only
from exec_server.sandbox.select import SandboxUnavailableError, select_backend

_WRAPPER = (
    "import os, signal, sys\n"
    "for s in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT):\n"
    "    signal.signal(s, signal.SIG_IGN)\n"
    "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'exec_server', 'serve',"
    " '--listen', 'stdio', *sys.argv[1:]])\n"
)
_ZERO = "0" * 16


async def _status(client: ExecServerClient, cwd: str, *, tty: bool,
                  sandbox: Any) -> tuple[dict[str, str], bool]:
    """The child's SigIgn/SigBlk fields, and whether pid 1 of its PID namespace
    (sandboxed: its parent) is a fork of the spawn zygote."""
    handle = await client.spawn(
        ["grep", "-ahE", "^(Sig(Ign|Blk)|PPid):|--zygote", "/proc/self/status", "/proc/1/cmdline"],
        cwd=cwd, env={"PATH": "/usr/bin:/bin"}, tty=tty, sandbox=sandbox,
    )
    done = await handle.collect()
    assert done.exit_code == 0, done
    text = done.stdout.decode().replace("\r", "")
    fields = {k: v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}
    return fields, "--zygote" in text


@pytest.fixture
async def make_client() -> AsyncIterator[Any]:
    clients: list[ExecServerClient] = []

    async def factory(*args: str) -> ExecServerClient:
        client = await ExecServerClient.spawn_stdio([sys.executable, "-c", _WRAPPER, *args])
        clients.append(client)
        return client

    yield factory
    for client in clients:
        await client.aclose()


@pytest.mark.parametrize("tty", [False, True], ids=["pipes", "pty"])
async def test_unsandboxed_children_start_clean(make_client: Any, tmp_path: Any,
                                                tty: bool) -> None:
    client = await make_client()
    fields, _ = await _status(client, str(tmp_path), tty=tty, sandbox=None)
    assert (fields["SigIgn"], fields["SigBlk"]) == (_ZERO, _ZERO)


@pytest.mark.parametrize("backend", ["bwrap", "landlock", "landlock-zygote"])
@pytest.mark.parametrize("tty", [False, True], ids=["pipes", "pty"])
async def test_sandboxed_children_start_clean(make_client: Any, tmp_path: Any, backend: str,
                                              tty: bool) -> None:
    name = backend.removesuffix("-zygote")
    try:
        select_backend(name)
    except SandboxUnavailableError as exc:
        pytest.skip(str(exc))
    args = ["--sandbox-backend", name]
    if backend == "landlock":
        args.append("--no-launch-zygote")
    client = await make_client(*args)
    sandbox = read_only(tmp_path)
    for _ in range(200):
        fields, via_zygote = await _status(client, str(tmp_path), tty=tty, sandbox=sandbox)
        assert (fields["SigIgn"], fields["SigBlk"]) == (_ZERO, _ZERO), (backend, fields)
        if backend != "landlock-zygote" or via_zygote:
            break
    else:
        raise AssertionError("launches never went through the spawn zygote")
