"""Landlock launches by the helper zygote: through the process manager, exit statuses,
death, leaks.

The escape-regression suite runs on the zygote too (``landlock-zygote`` leg);
this file covers what is specific to it: what the child looks like (group,
session, fds, signals, env, arg0), exec-failure codes, the first-launch
fallback, the config switch, terminate, zygote death and restart, event-loop
changes, server death, and that nothing leaks.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec
import pytest

from exec_server.config import ServerConfig
from exec_server.process.manager import ProcessManager
from exec_server.process.spec import LaunchSpec
from exec_server.protocol.types.process import (
    ClosedNotification,
    ExitedNotification,
    OutputNotification,
    WriteStatus,
)
from exec_server.sandbox.plan import SandboxPlan
from exec_server.sandbox.select import SandboxUnavailableError, select_backend
from exec_server.server.notifications import notifier

TIMEOUT = 10.0
PATH_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin"}

_CHILD_REPORT = r"""
import json, os, sys
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
stat = open("/proc/self/stat").read()
fields = stat[stat.rindex(")") + 2:].split()
print(json.dumps({
    "argv0": open("/proc/self/cmdline", "rb").read().split(b"\0")[0].decode(),
    "pid": os.getpid(), "pgrp": os.getpgrp(), "sid": os.getsid(0), "tty_nr": int(fields[4]),
    "fds": sorted(int(f) for f in os.listdir("/proc/self/fd")),
    "env": dict(e.decode("utf-8", "surrogateescape").split("=", 1)
                for e in open("/proc/self/environ", "rb").read().split(b"\0") if e),
    "cwd": os.getcwd(),
    "nnp": status["NoNewPrivs"].strip(), "seccomp": status["Seccomp"].strip(),
    "capeff": status["CapEff"].strip(),
}))
"""


@pytest.fixture(params=["prefork", "no-prefork"])
def landlock(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The Landlock backend; its zygote keeps a pre-forked spare child or forks per launch."""
    from exec_server.fs.helper.client import Zygote

    try:
        backend = select_backend("landlock")
    except SandboxUnavailableError as exc:
        pytest.skip(f"landlock backend unusable: {exc}")
    shared = getattr(backend, "spawn_zygote", None)
    if shared is None:
        pytest.skip("no spawn zygote")
    if request.param == "prefork":
        yield backend
        return
    backend.spawn_zygote = Zygote(python=backend.python, prefork=False)
    try:
        yield backend
    finally:
        backend.spawn_zygote = shared


class Sink:
    """Collects notifications per process id; ``await sink.closed(id)``."""

    def __init__(self) -> None:
        self.output: dict[str, bytearray] = {}
        self.exit_code: dict[str, int] = {}
        self.events: dict[str, asyncio.Event] = {}

    def _event(self, pid: str) -> asyncio.Event:
        return self.events.setdefault(pid, asyncio.Event())

    async def __call__(self, method: str, params: msgspec.Struct) -> None:
        if isinstance(params, OutputNotification):
            self.output.setdefault(params.process_id, bytearray()).extend(params.chunk)
        elif isinstance(params, ExitedNotification):
            self.exit_code[params.process_id] = params.exit_code
        elif isinstance(params, ClosedNotification):
            self._event(params.process_id).set()

    async def closed(self, pid: str) -> tuple[int, bytes]:
        async with asyncio.timeout(TIMEOUT):
            await self._event(pid).wait()
        return self.exit_code[pid], bytes(self.output.get(pid, b""))


@pytest.fixture
async def make_manager() -> AsyncIterator[Callable[..., tuple[ProcessManager, Sink]]]:
    managers: list[ProcessManager] = []

    def factory(**config: Any) -> tuple[ProcessManager, Sink]:
        manager = ProcessManager(ServerConfig(**config))
        sink = Sink()
        manager.set_sink(notifier(sink))
        managers.append(manager)
        return manager, sink

    yield factory
    for manager in managers:
        await manager.shutdown()


def _plan(root: str, *, full_read: bool = True) -> SandboxPlan:
    return SandboxPlan(full_read=full_read, full_write=False, network=False, cwd=root,
                       writable_roots=(root,),
                       read_only_subpaths=(os.path.join(root, ".git"),))


def _wrap(backend: Any, root: str, argv: list[str], **kw: Any) -> LaunchSpec:
    env = kw.pop("env", dict(PATH_ENV))
    return backend.wrap(LaunchSpec(argv=argv, cwd=root, env=env, **kw), _plan(root))


async def _warm(backend: Any, manager: ProcessManager) -> None:
    await backend.spawn_zygote.ensure_started(manager)


def _via_zygote(manager: ProcessManager, process_id: str) -> bool:
    rec = manager._records[process_id]
    assert rec.child is not None
    return rec.child.popen is None and rec.child.exit_status is not None


@pytest.mark.parametrize("tty", [False, True], ids=["pipes", "pty"])
async def test_child_looks_like_a_launcher_child(no_leaks: None, landlock: Any,
                                                 make_manager: Any, tmp_path: Path,
                                                 tty: bool) -> None:
    manager, sink = make_manager()
    await _warm(landlock, manager)
    env = {"PATH": "/usr/bin:/bin", "ONLY": "1", "ODD": "caf\u00e9 \udcff"}
    spec = _wrap(landlock, str(tmp_path), [sys.executable, "-I", "-S", "-c", _CHILD_REPORT],
                 env=env, tty=tty, arg0="visible-name")
    await manager.start("c", spec)
    assert _via_zygote(manager, "c")
    code, out = await sink.closed("c")
    assert code == 0, out
    report = json.loads(out.decode().strip().splitlines()[-1])
    assert report["argv0"] == "visible-name"
    assert report["env"] == {"PATH": "/usr/bin:/bin", "ONLY": "1", "ODD": "caf\u00e9 \udcff"}
    assert report["cwd"] == str(tmp_path)
    assert report["fds"] == [0, 1, 2, 3]  # 3: the listdir itself; no fd of ours leaked
    # signal dispositions as exec leaves them (python itself ignores SIGPIPE: ask grep)
    await manager.start("s", _wrap(landlock, str(tmp_path),
                             ["grep", "-E", "^Sig(Ign|Blk)", "/proc/self/status"], tty=tty))
    code, out = await sink.closed("s")
    assert code == 0 and out.split() == [b"SigBlk:", b"0" * 16, b"SigIgn:", b"0" * 16], out
    assert report["nnp"] == "1" and report["seccomp"] == "2" and int(report["capeff"], 16) == 0
    # pid 2 of its own PID namespace, under pid 1 (the reaper); its group (and, on a
    # PTY, session) is the monitor's outside the namespace, hence 0 in here
    assert report["pid"] == 2 and report["pgrp"] == 0
    if tty:
        assert report["sid"] == 0 and report["tty_nr"] != 0


@pytest.mark.parametrize("tty", [False, True], ids=["pipes", "pty"])
async def test_exit_and_exec_failure_codes(no_leaks: None, landlock: Any, make_manager: Any,
                                           tmp_path: Path, tty: bool) -> None:
    manager, sink = make_manager()
    await _warm(landlock, manager)
    root = str(tmp_path)
    (tmp_path / "data").write_text("not a program\n")
    cases = {
        "exit3": (["sh", "-c", "exit 3"], 3),
        "killed": (["sh", "-c", "kill -9 $$"], 137),
        "missing": (["no-such-program-xyz"], 127),
        "noexec": ([str(tmp_path / "data")], 126),
        "true": (["true"], 0),
    }
    for pid, (argv, _) in cases.items():
        await manager.start(pid, _wrap(landlock, root, argv, tty=tty))
        assert _via_zygote(manager, pid)
    for pid, (_, expected) in cases.items():
        code, out = await sink.closed(pid)
        assert code == expected, (pid, out)
    _, out = await sink.closed("missing")
    assert b"no-such-program-xyz" in out
    # A setup failure (here: a flag the launcher does not know) is 125 and never runs the command.
    spec = _wrap(landlock, root, ["sh", "-c", f"touch {root}/ran"], tty=tty)
    assert spec.zygote is not None
    bad = replace(spec.zygote.request, args=("--bogus-flag", *spec.zygote.request.args))
    await manager.start("setup", replace(spec, zygote=replace(spec.zygote, request=bad)))
    assert _via_zygote(manager, "setup")
    code, out = await sink.closed("setup")
    assert code == 125
    assert b"unknown launcher flag" in out
    assert not (tmp_path / "ran").exists()


async def test_missing_cwd_fails_the_start(no_leaks: None, landlock: Any, make_manager: Any,
                                           tmp_path: Path) -> None:
    from exec_server.process.errors import ProcessFailedError

    manager, _ = make_manager()
    await _warm(landlock, manager)
    spec = _wrap(landlock, str(tmp_path), ["true"])
    spec.cwd = str(tmp_path / "gone")
    assert spec.zygote is not None
    gone = replace(spec.zygote.request, cwd=spec.cwd)
    with pytest.raises(ProcessFailedError, match="No such file or directory"):
        await manager.start("x", replace(spec, zygote=replace(spec.zygote, request=gone)))


async def test_first_launch_falls_back_then_zygote_is_used(no_leaks: None, landlock: Any,
                                                           make_manager: Any,
                                                           tmp_path: Path) -> None:
    await landlock.spawn_zygote.aclose()
    manager, sink = make_manager()
    await manager.start("first", _wrap(landlock, str(tmp_path), ["true"]))
    assert not _via_zygote(manager, "first")  # the zygote is only starting
    assert (await sink.closed("first"))[0] == 0
    await _warm(landlock, manager)
    before = landlock.spawn_zygote.spawned
    await manager.start("second", _wrap(landlock, str(tmp_path), ["true"]))
    assert _via_zygote(manager, "second")
    assert (await sink.closed("second"))[0] == 0
    assert landlock.spawn_zygote.spawned == before + 1


async def test_config_switch_uses_the_launcher(no_leaks: None, landlock: Any, make_manager: Any,
                                               tmp_path: Path) -> None:
    manager, sink = make_manager(launch_zygote=False)
    await _warm(landlock, manager)
    await manager.start("p", _wrap(landlock, str(tmp_path), ["true"]))
    assert not _via_zygote(manager, "p")
    assert (await sink.closed("p"))[0] == 0
    await landlock.spawn_zygote.release(manager)


async def test_stdin_pipe_and_terminate(no_leaks: None, landlock: Any, make_manager: Any,
                                        tmp_path: Path) -> None:
    manager, sink = make_manager()
    await _warm(landlock, manager)
    await manager.start("in", _wrap(landlock, str(tmp_path), ["head", "-n1"], pipe_stdin=True))
    assert _via_zygote(manager, "in")
    assert await manager.write("in", b"hello\nworld\n") is WriteStatus.ACCEPTED
    assert await sink.closed("in") == (0, b"hello\n")
    await manager.start("sleep", _wrap(landlock, str(tmp_path), ["sh", "-c", "echo up; sleep 30"]))
    assert _via_zygote(manager, "sleep")
    async with asyncio.timeout(TIMEOUT):
        while b"up" not in sink.output.get("sleep", b""):  # noqa: ASYNC110 - no event for it
            await asyncio.sleep(0.01)
    assert manager.terminate("sleep")
    assert (await sink.closed("sleep"))[0] == 128 + signal.SIGTERM


@pytest.mark.parametrize("count", [3, 12], ids=["300k", "over-1MiB"])
async def test_large_requests(no_leaks: None, landlock: Any, make_manager: Any,
                              tmp_path: Path, count: int) -> None:
    """Big environments: through the zygote up to 1 MiB of request, the launcher beyond."""
    manager, sink = make_manager()
    await _warm(landlock, manager)
    env = dict(PATH_ENV)
    env.update({f"BIG{i}": "x" * 100_000 for i in range(count)})  # < ARG_MAX
    last = f"BIG{count - 1}"
    await manager.start("big", _wrap(landlock, str(tmp_path), ["sh", "-c", f"echo ${{#{last}}}"],
                               env=env))
    assert _via_zygote(manager, "big") == (count * 100_000 < 1 << 20)
    assert await sink.closed("big") == (0, b"100000\n")
    # a request that fits still goes through the zygote
    await manager.start("small", _wrap(landlock, str(tmp_path), ["true"]))
    assert _via_zygote(manager, "small")
    assert (await sink.closed("small"))[0] == 0


async def test_zygote_death_kills_its_children_and_it_restarts(no_leaks: None, landlock: Any,
                                                               make_manager: Any,
                                                               tmp_path: Path) -> None:
    manager, sink = make_manager()
    zygote = landlock.spawn_zygote
    await _warm(landlock, manager)
    old = zygote.pid
    tag = f"60.{os.getpid()}{time.monotonic_ns() % 10**9}"
    await manager.start("long", _wrap(landlock, str(tmp_path),
                                ["sh", "-c", f"sleep {tag} & echo started; wait"]))
    assert _via_zygote(manager, "long")
    leader = manager.pid_of("long")
    async with asyncio.timeout(TIMEOUT):
        while b"\n" not in sink.output.get("long", b""):  # noqa: ASYNC110 - no event for it
            await asyncio.sleep(0.01)
        while not _pids_with(tag):  # noqa: ASYNC110 - no event for its exec
            await asyncio.sleep(0.01)
    (grandchild,) = _pids_with(tag)  # its pid in the namespace means nothing out here
    os.kill(old, signal.SIGKILL)
    code, _ = await sink.closed("long")
    assert code == -1  # its parent is gone: the status is unobservable
    for pid in (leader, grandchild):  # the whole group was killed, not only the leader
        async with asyncio.timeout(TIMEOUT):
            while _alive(pid):  # noqa: ASYNC110 - no event for a foreign process
                await asyncio.sleep(0.01)
    # the next launch runs the launcher while a new zygote starts, then the zygote again
    await manager.start("after", _wrap(landlock, str(tmp_path), ["true"]))
    assert not _via_zygote(manager, "after")
    assert (await sink.closed("after"))[0] == 0
    await _warm(landlock, manager)
    assert zygote.pid not in (None, old)
    await manager.start("again", _wrap(landlock, str(tmp_path), ["true"]))
    assert _via_zygote(manager, "again")
    assert (await sink.closed("again"))[0] == 0


def _pids_with(tag: str) -> list[int]:
    """Live processes whose command line contains ``tag``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if tag.encode() in cmdline.split(b"\0") and _alive(int(entry)):
                found.append(int(entry))
    return found


def _ppid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[1])


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def test_new_event_loop_replaces_the_zygote(no_leaks: None, landlock: Any,
                                            tmp_path: Path) -> None:
    zygote = landlock.spawn_zygote
    owner = object()
    asyncio.run(zygote.ensure_started(owner))  # deliberately not released
    first = zygote.pid
    assert first is not None

    async def second_loop() -> int | None:
        manager = ProcessManager(ServerConfig())
        sink = Sink()
        manager.set_sink(notifier(sink))
        try:
            await zygote.ensure_started(manager)
            await manager.start("t", _wrap(landlock, str(tmp_path), ["true"]))
            assert _via_zygote(manager, "t")
            assert (await sink.closed("t"))[0] == 0
            return zygote.pid
        finally:
            await manager.shutdown()

    second = asyncio.run(second_loop())
    assert second not in (None, first)
    assert not _alive(first)
    assert zygote.pid is None  # the last owner released it


async def test_server_death_kills_zygote_and_children(landlock: Any, server_factory: Any,
                                                      rpc: Any, tmp_path: Path) -> None:

    srv = server_factory("--sandbox-backend", "landlock", cwd=str(tmp_path))
    client = await rpc(srv.url)
    await client.initialize()
    root_read = {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"}
    cwd_write = {"path": {"type": "special", "value": {"kind": "current_working_directory"}},
                 "access": "write"}
    sandbox = {"sandboxPreference": "require",
               "policy": {"type": "workspace-write", "writable_roots": [],
                          "network_access": False, "exclude_tmpdir_env_var": True,
                          "exclude_slash_tmp": True},
               "fileSystemPolicy": {"kind": "restricted", "entries": [root_read, cwd_write]},
               "networkPolicy": "restricted", "sandboxPolicyCwd": str(tmp_path),
               "additionalPermissions": None, "enforceManagedNetwork": False,
               "windowsSandboxLevel": "disabled", "windowsSandboxPrivateDesktop": False,
               "useLegacyLandlock": False}
    found: tuple[int, int] | None = None
    for i in range(200):  # until a launch comes from the zygote (the first one starts it)
        pid = f"p{i}"
        tag = f"60.{os.getpid()}{i}"
        await client.call("process/start", {
            "processId": pid, "argv": ["sh", "-c", f"echo started; exec sleep {tag}"],
            "cwd": str(tmp_path), "env": dict(PATH_ENV), "tty": False, "arg0": None,
            "sandbox": sandbox})
        while True:
            msg = await client.notification("process/output")
            if msg["params"]["processId"] == pid:
                break
        # the command runs in a PID namespace: find it from out here, then walk up
        # through pid 1 and the monitor to whoever spawned the launch
        async with asyncio.timeout(TIMEOUT):
            while not _pids_with(tag):  # noqa: ASYNC110 - no event for its exec
                await asyncio.sleep(0.01)
        (child,) = _pids_with(tag)
        monitor = _ppid(_ppid(child))
        parent = _ppid(monitor)
        if parent != srv.pid:
            found = (child, parent)
            break
    assert found is not None, "launches never went through the spawn zygote"
    assert b"--zygote" in Path(f"/proc/{found[1]}/cmdline").read_bytes()  # noqa: ASYNC240
    zygote_family = _zygote_processes(srv.pid)  # the zygote and its spare child
    assert found[1] in zygote_family
    srv.proc.kill()
    srv.proc.wait()
    for pid in {*found, *zygote_family}:
        async with asyncio.timeout(TIMEOUT):
            while _alive(pid):  # noqa: ASYNC110 - no event for a foreign process
                await asyncio.sleep(0.02)


def _zygote_processes(server_pid: int) -> set[int]:
    """Processes running ``launcher.py --zygote <fd> <server_pid>`` (zygote and spare)."""
    out = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            argv = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--zygote" in argv and argv[argv.index(b"--zygote") + 2:][:1] == [
                str(server_pid).encode()]:
            out.add(int(name))
    return out


async def test_one_zygote_serves_fs_calls_and_launches(no_leaks: None, landlock: Any,
                                                       make_manager: Any,
                                                       tmp_path: Path) -> None:
    """A confined fs call and a launch are both children of the same zygote process,
    and the fs child is confined by the kernel (a write outside its plan is refused)."""
    manager, sink = make_manager()
    zygote = landlock.spawn_zygote
    await _warm(landlock, manager)
    pid = zygote.pid
    inside, outside = tmp_path / "in", tmp_path / "out"
    inside.mkdir()
    outside.mkdir()
    plan = {"full_read": True, "full_write": False, "network": False,
            "writable_roots": [str(inside)]}
    header = {"op": "fs/writeFile", "path": str(outside / "f"), "expect": str(outside),
              "plan": plan}
    reply, _ = await zygote.run(header, b"escaped", timeout=TIMEOUT, owner=manager)
    assert reply["status"] == "error" and "Permission denied" in reply["message"], reply
    assert not (outside / "f").exists()
    header = {**header, "path": str(inside / "f"), "expect": str(inside)}
    reply, _ = await zygote.run(header, b"written", timeout=TIMEOUT, owner=manager)
    assert reply["status"] == "ok", reply
    assert (inside / "f").read_bytes() == b"written"
    await manager.start("p", _wrap(landlock, str(tmp_path),
                                         ["sh", "-c", "echo up; sleep 30"]))
    assert _via_zygote(manager, "p")
    async with asyncio.timeout(TIMEOUT):
        while b"up" not in sink.output.get("p", b""):  # noqa: ASYNC110 - no event for it
            await asyncio.sleep(0.01)
    leader = manager.pid_of("p")
    assert leader is not None and _ppid(leader) == pid  # the same process all along
    assert zygote.pid == pid
    assert manager.terminate("p")
    assert (await sink.closed("p"))[0] == 128 + signal.SIGTERM
