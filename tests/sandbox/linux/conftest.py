"""Fixtures for the Linux sandbox tests: a backend per leg and a confined runner.

Every launch goes through ``backend.wrap()`` so the real argv/env/pass_fds/
cleanup path is exercised, then is spawned on pipes or a PTY (the process
layer's spawners when present, otherwise ``subprocess``).

Legs: ``bwrap``; ``landlock`` (the launcher script, ``python -I -S
launcher.py``); ``landlock-zygote`` (the same backend, launches started by
the spawn zygote: the runner checks the child really came from it).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from exec_server.process.spec import LaunchSpec
from exec_server.sandbox.linux.base import LinuxBackend
from exec_server.sandbox.plan import SandboxPlan
from exec_server.sandbox.select import SandboxUnavailableError, select_backend

BACKENDS = ("bwrap", "landlock", "landlock-zygote")
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
#: read roots a restricted-read plan needs to run system tools (platform defaults).
SYSTEM_READ_ROOTS = tuple(p for p in ("/bin", "/sbin", "/usr", "/etc", "/lib", "/lib64")
                          if os.path.exists(p))


def _backend_or_skip(name: str) -> LinuxBackend:
    try:
        backend = select_backend(name)
    except SandboxUnavailableError as exc:
        pytest.skip(f"{name} backend unusable: {exc}")
    assert backend is not None
    return backend


class ZygoteLeg(LinuxBackend):
    """The Landlock backend, with launches started through its spawn zygote."""

    name = "landlock"
    via_zygote = True

    def __init__(self, inner: Any) -> None:
        if getattr(inner, "spawn_zygote", None) is None:
            pytest.skip("the Landlock backend has no spawn zygote")
        self.inner = inner
        self.spawn_zygote = inner.spawn_zygote

    def wrap(self, spec: LaunchSpec, plan: SandboxPlan) -> LaunchSpec:
        wrapped = self.inner.wrap(spec, plan)
        assert wrapped.zygote is not None
        return wrapped


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> LinuxBackend:
    """Each test runs under every leg; skipped with the probe's reason if unusable."""
    if request.param == "landlock-zygote":
        return ZygoteLeg(_backend_or_skip("landlock"))
    b = _backend_or_skip(request.param)
    assert b.name == request.param
    return b


@dataclass
class Result:
    code: int
    output: str


def _read_all(fds: list[int], deadline: float) -> bytes:
    chunks: list[bytes] = []
    open_fds = list(fds)
    while open_fds:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("sandboxed child did not finish")
        ready, _, _ = select.select(open_fds, [], [], remaining)
        for fd in ready:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                continue
            except OSError as exc:
                if exc.errno != errno.EIO:
                    raise
                data = b""
            if data:
                chunks.append(data)
            else:
                open_fds.remove(fd)
    return b"".join(chunks)


def _spawn(spec: LaunchSpec) -> tuple[subprocess.Popen[bytes], list[int]]:
    try:
        from exec_server.process.spawn import spawn
    except ImportError:
        spawn = None
    if spawn is not None:
        child = spawn(spec)
        assert child.popen is not None
        if child.stdin_fd is not None:
            os.close(child.stdin_fd)
        return child.popen, [fd for _, fd in child.outputs]
    if spec.tty:
        master, slave = os.openpty()
        try:
            popen = subprocess.Popen(spec.argv, stdin=slave, stdout=slave, stderr=slave,
                                     cwd=spec.cwd, env=spec.env, pass_fds=spec.pass_fds,
                                     start_new_session=True)
        finally:
            os.close(slave)
        return popen, [master]
    r, w = os.pipe()
    try:
        popen = subprocess.Popen(spec.argv, stdin=subprocess.DEVNULL, stdout=w, stderr=w,
                                 cwd=spec.cwd, env=spec.env, pass_fds=spec.pass_fds,
                                 start_new_session=True)
    finally:
        os.close(w)
    return popen, [r]


async def _run_via_zygote(leg: ZygoteLeg, wrapped_specs: list[LaunchSpec],
                          timeout: float) -> list[Result]:  # noqa: ASYNC109
    """Start every launch through the spawn zygote at once; drain and await each exit."""
    from exec_server.process.spawn import SpawnedChild, spawn_via_service

    owner = object()
    zygote = leg.spawn_zygote
    children: list[SpawnedChild] = []
    try:
        await zygote.ensure_started(owner)
        zygote_pid = zygote.pid
        for wrapped in wrapped_specs:
            try:
                child = await spawn_via_service(wrapped, owner)
            finally:
                for fd in wrapped.pass_fds:
                    os.close(fd)
            assert child is not None, "not via the zygote"
            children.append(child)
            assert child.popen is None and child.exit_status is not None, "not via the zygote"
            if child.stdin_fd is not None:
                os.close(child.stdin_fd)
                child.stdin_fd = None
        deadline = time.monotonic() + timeout
        results = []
        for child in children:
            fds = [fd for _, fd in child.outputs]
            out = await asyncio.to_thread(_read_all, fds, deadline)
            for fd in fds:
                os.close(fd)
            child.outputs = []
            assert child.exit_status is not None
            async with asyncio.timeout(timeout):
                status = await child.exit_status()
            assert status != -1
            results.append(Result(os.waitstatus_to_exitcode(status),
                                  out.decode("utf-8", "replace")))
        assert zygote.pid == zygote_pid, "the zygote died during the run"
        return results
    finally:
        for child in children:
            for _, fd in child.outputs:
                with contextlib.suppress(OSError):
                    os.close(fd)
            with contextlib.suppress(OSError):
                os.killpg(child.pid, 9)
        await zygote.release(owner)
        for wrapped in wrapped_specs:
            if wrapped.cleanup is not None:
                wrapped.cleanup()


def run_many(backend: LinuxBackend, plan: SandboxPlan, argv: list[str], n: int, *, cwd: str,
             env: dict[str, str] | None = None, timeout: float = 30.0) -> list[Result]:
    """``n`` concurrent confined launches of ``argv`` (pipes, stdout+stderr merged per run)."""
    specs = [backend.wrap(LaunchSpec(argv=argv, cwd=cwd, env=env or {"PATH": SYSTEM_PATH}),
                          plan) for _ in range(n)]
    if getattr(backend, "via_zygote", False):
        assert isinstance(backend, ZygoteLeg)
        return asyncio.run(_run_via_zygote(backend, specs, timeout))
    launches = []
    try:
        for wrapped in specs:
            try:
                proc = subprocess.Popen(wrapped.argv, cwd=wrapped.cwd, env=wrapped.env,
                                        pass_fds=wrapped.pass_fds, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            finally:
                for fd in wrapped.pass_fds:
                    os.close(fd)
            launches.append(proc)
        outputs = [p.communicate(timeout=timeout)[0].decode() for p in launches]
        return [Result(p.returncode, out) for p, out in zip(launches, outputs, strict=True)]
    finally:
        for proc in launches:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for wrapped in specs:
            if wrapped.cleanup is not None:
                wrapped.cleanup()


def run_confined(backend: LinuxBackend, plan: SandboxPlan, argv: list[str], *, cwd: str,
                 env: dict[str, str] | None = None, tty: bool = False,
                 timeout: float = 30.0) -> Result:
    """Wrap, spawn, drain and reap one confined command; runs the wrap's cleanup."""
    spec = LaunchSpec(argv=argv, cwd=cwd, env=env if env is not None else {"PATH": SYSTEM_PATH},
                      tty=tty)
    wrapped = backend.wrap(spec, plan)
    if getattr(backend, "via_zygote", False):
        assert isinstance(backend, ZygoteLeg)
        return asyncio.run(_run_via_zygote(backend, [wrapped], timeout))[0]
    try:
        popen, fds = _spawn(wrapped)
    finally:
        for fd in wrapped.pass_fds:
            os.close(fd)
    try:
        out = _read_all(fds, time.monotonic() + timeout)
        code = popen.wait(timeout=timeout)
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        if popen.poll() is None:
            popen.kill()
            popen.wait()
        if wrapped.cleanup is not None:
            wrapped.cleanup()
    return Result(code, out.decode("utf-8", "replace"))


@dataclass
class Workspace:
    root: str
    outside: str


@pytest.fixture
def ws(tmp_path: os.PathLike[str]) -> Iterator[Workspace]:
    root = os.path.join(str(tmp_path), "work")
    outside = os.path.join(str(tmp_path), "outside")
    os.mkdir(root)
    os.mkdir(outside)
    yield Workspace(root, outside)


def workspace_plan(ws: Workspace, *, network: bool = False, full_read: bool = True,
                   extra_write: tuple[str, ...] = (),
                   readable: tuple[str, ...] = ()) -> SandboxPlan:
    """A workspace-write plan with the protected names under the workspace root."""
    protected = tuple(os.path.join(ws.root, n) for n in (".git", ".codex", ".agents"))
    return SandboxPlan(full_read=full_read, full_write=False, network=network, cwd=ws.root,
                       readable_roots=readable, writable_roots=(ws.root, *extra_write),
                       read_only_subpaths=protected)


@pytest.fixture
def run() -> object:
    """The confined runner: ``run(backend, plan, argv, cwd=..., env=..., tty=...)``."""
    return run_confined


@pytest.fixture
def run_n() -> object:
    """Concurrent runner: ``run_n(backend, plan, argv, n, cwd=...) -> list[Result]``."""
    return run_many


@pytest.fixture
def plan_for() -> object:
    """``plan_for(ws, network=..., full_read=..., extra_write=..., readable=...)``."""
    return workspace_plan


@pytest.fixture
def py() -> str:
    """An interpreter usable inside full-read sandboxes."""
    return sys.executable
