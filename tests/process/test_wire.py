"""process/* over a real ``exec-server serve`` WebSocket: both generations and bad input."""

from __future__ import annotations

import base64
import os
import urllib.parse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

PATH_ENV = {"PATH": "/usr/bin:/bin"}
LEGACY_NO_SANDBOX = {
    "sandboxPreference": "forbid",
    "policy": {"type": "danger-full-access"},
    "fileSystemPolicy": {"kind": "unrestricted"},
    "networkPolicy": "enabled",
    "sandboxPolicyCwd": "/",
    "additionalPermissions": None,
    "enforceManagedNetwork": False,
    "windowsSandboxLevel": "disabled",
    "windowsSandboxPrivateDesktop": False,
    "useLegacyLandlock": False,
}


def uri(path: str | Path) -> str:
    return "file://" + urllib.parse.quote(str(path))


def legacy_start(process_id: str, argv: list[str], cwd: str = "/", **extra: Any) -> dict[str, Any]:
    params = {
        "processId": process_id,
        "argv": argv,
        "cwd": cwd,
        "env": dict(PATH_ENV),
        "tty": False,
        "arg0": None,
        "sandbox": LEGACY_NO_SANDBOX,
    }
    params.update(extra)
    return params


def current_start(
    process_id: str, argv: list[str], cwd: str | Path = "/", **extra: Any
) -> dict[str, Any]:
    params = {
        "processId": process_id,
        "metadata": {"threadId": "01a22c1e-52f6-7bf1-baf1-ef3e944cd102", "toolCallId": "call_0"},
        "argv": argv,
        "cwd": uri(cwd),
        "envPolicy": {
            "inherit": "all",
            "ignoreDefaultExcludes": True,
            "exclude": [],
            "set": {},
            "includeOnly": [],
        },
        "env": {"TERM": "dumb"},
        "tty": False,
        "pipeStdin": False,
        "arg0": None,
        "sandbox": None,
        "enforceManagedNetwork": False,
        "managedNetwork": None,
    }
    params.update(extra)
    return params


async def collect(client: Any, process_id: str) -> dict[str, Any]:
    """Notifications of one process until ``process/closed``."""
    out: dict[str, Any] = {"data": b"", "order": [], "exited": None, "closed": None}
    stash: dict[str, list[dict[str, Any]]] = client.__dict__.setdefault("stash", {})
    while True:
        mine = stash.get(process_id)
        msg = mine.pop(0) if mine else await client.notification()
        params = msg["params"]
        if params.get("processId") != process_id:
            stash.setdefault(params.get("processId"), []).append(msg)
            continue
        out["order"].append((msg["method"], params["seq"]))
        if msg["method"] == "process/output":
            out["data"] += base64.b64decode(params["chunk"])
        elif msg["method"] == "process/exited":
            out["exited"] = params
        elif msg["method"] == "process/closed":
            out["closed"] = params
            return out


@pytest.fixture
async def client(server_factory: Callable[..., Any], rpc: Callable[[str], Awaitable[Any]]) -> Any:
    env = dict(os.environ, EXEC_TEST_MARKER="from-the-server")
    srv = server_factory("--closed-retention", "0.2", env=env)
    c = await rpc(srv.url)
    await c.initialize()
    c.server = srv
    return c


async def test_legacy_start_true_answers_kebab_sandbox(client: Any) -> None:
    result = await client.call("process/start", legacy_start("proc-1", ["true"], env={}))
    assert result == {"processId": "proc-1", "sandbox": "none"}
    got = await collect(client, "proc-1")
    assert got["exited"] == {"processId": "proc-1", "seq": got["exited"]["seq"], "exitCode": 0}
    assert got["closed"] == {"processId": "proc-1", "seq": got["exited"]["seq"] + 1}
    read = await client.call(
        "process/read", {"processId": "proc-1", "afterSeq": None, "maxBytes": None, "waitMs": 0}
    )
    assert read == {
        "chunks": [],
        "nextSeq": 3,
        "exited": True,
        "exitCode": 0,
        "closed": True,
        "failure": None,
    }
    assert await client.call("process/terminate", {"processId": "proc-1"}) == {"running": False}


async def test_current_start_inherits_server_env_and_reports_camel_type(
    client: Any, tmp_path: Path
) -> None:
    params = current_start(
        "c-1",
        ["/bin/sh", "-c", "echo $EXEC_TEST_MARKER $TERM > proof.txt; cat proof.txt; pwd"],
        cwd=tmp_path,
    )
    assert await client.call("process/start", params) == {"processId": "c-1", "sandboxType": "none"}
    got = await collect(client, "c-1")
    assert got["data"] == f"from-the-server dumb\n{tmp_path}\n".encode()
    assert got["exited"]["exitCode"] == 0 and got["exited"]["sandboxDenied"] is False
    assert got["order"][-1][0] == "process/closed"
    assert (tmp_path / "proof.txt").read_text() == "from-the-server dumb\n"
    read = await client.call("process/read", {"processId": "c-1"})
    assert read["sandboxDenied"] is False and read["closed"] is True


async def test_tty_write_with_write_id_echoes(client: Any) -> None:
    params = current_start("tty", ["/bin/sh", "-c", "read line; echo got:$line"], tty=True)
    await client.call("process/start", params)
    write = {"processId": "tty", "chunk": base64.b64encode(b"hello\n").decode(), "writeId": "1"}
    assert await client.call("process/write", write) == {"status": "accepted"}
    got = await collect(client, "tty")
    text = got["data"].replace(b"\r\n", b"\n")
    assert b"hello\n" in text and b"got:hello\n" in text
    assert got["exited"]["exitCode"] == 0


async def test_pipe_stdin_and_write_statuses(client: Any) -> None:
    await client.call("process/start", current_start("ps", ["head", "-n", "1"], pipeStdin=True))
    chunk = base64.b64encode(b"line\n").decode()
    assert await client.call(
        "process/write", {"processId": "ps", "chunk": chunk, "writeId": "1"}
    ) == {"status": "accepted"}
    assert (await collect(client, "ps"))["data"] == b"line\n"
    await client.call("process/start", legacy_start("closed-stdin", ["sleep", "5"]))
    assert await client.call("process/write", {"processId": "closed-stdin", "chunk": chunk}) == {
        "status": "stdinClosed"
    }
    assert await client.call("process/write", {"processId": "nope", "chunk": chunk}) == {
        "status": "unknownProcess"
    }
    assert await client.call("process/terminate", {"processId": "closed-stdin"}) == {
        "running": True
    }
    got = await collect(client, "closed-stdin")
    assert got["exited"]["exitCode"] == 143


async def test_signal_interrupt(client: Any) -> None:
    await client.call("process/start", current_start("sig", ["sleep", "30"]))
    assert await client.call("process/signal", {"processId": "sig", "signal": "interrupt"}) == {}
    assert (await collect(client, "sig"))["exited"]["exitCode"] == 130
    assert await client.call("process/signal", {"processId": "gone", "signal": "interrupt"}) == {}


async def test_read_long_poll_and_cursor(client: Any) -> None:
    await client.call(
        "process/start", legacy_start("lp", ["/bin/sh", "-c", "sleep 0.1; printf 'a\\n'"])
    )
    result = await client.call("process/read", {"processId": "lp", "afterSeq": 0, "waitMs": 10000})
    assert [base64.b64decode(c["chunk"]) for c in result["chunks"]] == [b"a\n"]
    assert result["chunks"][0]["stream"] == "stdout"
    assert result["nextSeq"] == result["chunks"][0]["seq"] + 1


async def expect_error(client: Any, method: str, params: Any, code: int, text: str) -> str:
    reply = await client.request(method, params)
    assert "error" in reply, reply
    assert reply["error"]["code"] == code, reply
    assert text in reply["error"]["message"], reply
    return str(reply["error"]["message"])


async def test_bad_input_gets_errors_and_connection_keeps_serving(client: Any) -> None:
    await expect_error(client, "process/start", legacy_start("x", "true"), -32602, "argv")  # type: ignore[arg-type]
    no_env = legacy_start("x", ["true"])
    del no_env["env"]
    await expect_error(client, "process/start", no_env, -32602, "env")
    await expect_error(
        client, "process/start", legacy_start("x", []), -32602, "argv must not be empty"
    )
    await expect_error(
        client,
        "process/start",
        legacy_start("x", ["true"], cwd="relative/dir"),
        -32602,
        "cwd must be absolute: path must be absolute",
    )
    await expect_error(
        client,
        "process/start",
        legacy_start("x", ["/no/such/program"]),
        -32603,
        "No such file or directory (os error 2)",
    )
    await expect_error(
        client,
        "process/start",
        current_start("x", ["true"], enforceManagedNetwork=True),
        -32603,
        "enforceManagedNetwork",
    )
    await expect_error(
        client, "process/read", {"processId": "missing"}, -32600, "unknown process id missing"
    )
    await expect_error(client, "process/read", {"processId": 7}, -32602, "processId")
    await expect_error(
        client, "process/write", {"processId": "missing", "chunk": "!!!"}, -32602, "base64"
    )
    await expect_error(
        client,
        "process/write",
        {"processId": "missing", "chunk": "", "writeId": ""},
        -32602,
        "writeId must not be empty",
    )
    await expect_error(
        client, "process/signal", {"processId": "x", "signal": "kill"}, -32602, "signal"
    )
    await expect_error(client, "process/terminate", {}, -32602, "processId")
    # duplicate id, while the first is running
    await client.call("process/start", legacy_start("dup", ["sleep", "5"]))
    await expect_error(
        client, "process/start", legacy_start("dup", ["true"]), -32600, "process dup already exists"
    )
    # still serving, and the running process was not disturbed
    assert await client.call("process/terminate", {"processId": "dup"}) == {"running": True}
    assert (await collect(client, "dup"))["exited"]["exitCode"] == 143
    await client.call("process/start", legacy_start("ok", ["true"]))
    assert (await collect(client, "ok"))["exited"]["exitCode"] == 0


@pytest.mark.parametrize(
    ("member", "value"),
    [
        ("afterSeq", -1),
        ("afterSeq", 2**64),
        ("maxBytes", 2**64),
        ("maxBytes", -5),
        ("waitMs", 2**70),
    ],
)
async def test_read_numbers_outside_u64_are_refused(client: Any, member: str, value: int) -> None:
    # Upstream's members are u64: a number past it is -32602, not a cursor past
    # every chunk or a wait of 10^13 years (it used to be taken).
    await client.call("process/start", legacy_start("u64", ["/bin/sh", "-c", "echo hi"]))
    params = {"processId": "u64", "afterSeq": 0, "waitMs": 0, member: value}
    text = await expect_error(client, "process/read", params, -32602, f"`{value}`")
    assert text == f"invalid value: integer `{value}`, expected u64 for `{member}`"
    # The largest u64 is taken, and the process's output is all still there.
    edge = await client.call(
        "process/read", {"processId": "u64", "afterSeq": 0, "maxBytes": 2**64 - 1, "waitMs": 10000}
    )
    assert [base64.b64decode(c["chunk"]) for c in edge["chunks"]] == [b"hi\n"]
    past = await client.call("process/read", {"processId": "u64", "afterSeq": 2**64 - 1})
    assert past["chunks"] == []


async def test_closed_process_is_removed_after_retention(client: Any) -> None:
    await client.call("process/start", legacy_start("ret", ["true"]))
    await collect(client, "ret")
    # --closed-retention 0.2: the read fails once the record is gone
    reply = await client.request("process/read", {"processId": "ret", "waitMs": 0})
    while "result" in reply:
        reply = await client.request(
            "process/read", {"processId": "ret", "afterSeq": 2, "waitMs": 50}
        )
    assert reply["error"] == {"code": -32600, "message": "unknown process id ret"}
    await client.call("process/start", legacy_start("ret", ["true"]))  # id reusable
    await collect(client, "ret")


async def test_server_leaves_no_children_or_fds(client: Any) -> None:
    srv = client.server
    await client.call("process/start", legacy_start("warm", ["true"]))  # starts the guard
    await collect(client, "warm")
    fds_before = len(srv.open_fds())
    for i in range(8):
        await client.call("process/start", legacy_start(f"l{i}", ["/bin/sh", "-c", "echo x"]))
        await client.call("process/start", current_start(f"t{i}", ["true"], tty=True))
    for i in range(8):
        await collect(client, f"l{i}")
        await collect(client, f"t{i}")
    assert {cmdline(pid) for pid in srv.child_pids()} <= {GUARD}
    assert len(srv.open_fds()) <= fds_before


GUARD = "python -I -S -c (guard)"


def cmdline(pid: int) -> str:
    """A child's command line; the process guard gets a fixed label."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        args = f.read().split(b"\0")
    if args[1:4] == [b"-I", b"-S", b"-c"]:
        return GUARD
    return " ".join(a.decode() for a in args if a)


async def test_children_die_with_a_killed_server(
    no_leaks: None, server_factory: Callable[..., Any], rpc: Callable[[str], Awaitable[Any]]
) -> None:
    srv = server_factory()
    c = await rpc(srv.url)
    await c.initialize()
    await c.call("process/start", legacy_start("p", ["/bin/sh", "-c", "sleep 60 & echo up; wait"]))
    await c.call(
        "process/start", current_start("t", ["/bin/sh", "-c", "echo up; sleep 60"], tty=True)
    )
    await c.notification("process/output")
    await c.notification("process/output")
    children = {pid for pid in srv.child_pids() if cmdline(pid) != GUARD}
    assert len(children) == 2
    grandchildren = set().union(*(children_of(pid) for pid in children))
    assert grandchildren  # the background sleep of "p"
    srv.proc.kill()  # no chance to clean up: the guard must do it
    srv.proc.wait()
    # no_leaks (the test process is a subreaper) fails the test if any of them survives


def children_of(pid: int) -> set[int]:
    out = set()
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        out.update(int(x) for x in f.read().split())
    return out


async def test_sandboxed_denial_is_reported(client: Any, tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    root = {"type": "special", "value": {"kind": "root"}}
    project = {"type": "special", "value": {"kind": "project_roots"}}
    sandbox = {
        "permissions": {
            "type": "managed",
            "file_system": {
                "type": "restricted",
                "entries": [{"path": root, "access": "read"}, {"path": project, "access": "write"}],
            },
            "network": "restricted",
        },
        "cwd": uri(workspace),
        "workspaceRoots": [uri(workspace)],
        "windowsSandboxLevel": "disabled",
        "useLegacyLandlock": False,
    }
    argv = ["/bin/sh", "-c", "echo ok > in.txt; cat in.txt; echo x > ../outside.txt"]
    reply = await client.request(
        "process/start", current_start("sbx", argv, cwd=workspace, sandbox=sandbox)
    )
    if "error" in reply and "failed to build sandbox launch" in reply["error"]["message"]:
        pytest.skip(f"no usable sandbox here: {reply['error']['message']}")
    assert reply["result"] == {"processId": "sbx", "sandboxType": "linuxSeccomp"}
    got = await collect(client, "sbx")
    assert b"ok\n" in got["data"]
    assert got["exited"]["exitCode"] != 0
    assert got["exited"]["sandboxDenied"] is True
    assert (workspace / "in.txt").exists()
    assert not (tmp_path / "outside.txt").exists()
    # a plain failure inside the sandbox is not a denial
    reply = await client.request(
        "process/start",
        current_start("sbx2", ["/bin/sh", "-c", "exit 3"], cwd=workspace, sandbox=sandbox),
    )
    got = await collect(client, "sbx2")
    assert got["exited"]["exitCode"] == 3 and got["exited"]["sandboxDenied"] is False
