"""Landlock backend: wrap a launch in the stdlib-only launcher (SANDBOX.md §8)."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable

from exec_server.fs.helper.client import SpawnRequest, Zygote, shared_zygote
from exec_server.process.spec import LaunchSpec, ZygoteLaunch
from exec_server.sandbox.linux.base import (
    WRAPPER_ENV,
    LinuxBackend,
    PlaceholderRegistry,
    chain_cleanup,
    env_entries,
    finish_spec,
    memfd_holding,
)
from exec_server.sandbox.linux.knobs import placeholder_for
from exec_server.sandbox.linux.spawn_zygote_main import STATUS_FD
from exec_server.sandbox.plan import SandboxPlan

__all__ = ["LAUNCHER_PATH", "LandlockBackend", "launcher_flags"]

logger = logging.getLogger("exec_server.sandbox")

#: absolute path of the launcher script, run as ``python -I -S``.
LAUNCHER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launcher.py")


def launcher_flags(plan: SandboxPlan, command: list[str], *, cwd: str | None,
                   arg0: str | None = None, status_fd: int | None = None,
                   env_fd: int | None = None) -> list[str]:
    """``_launch.main``'s arguments: the launcher script's and a helper zygote launch's."""
    argv: list[str] = []
    for flag, value in (("--env-fd", env_fd), ("--status-fd", status_fd),
                        ("--command-cwd", cwd or None), ("--arg0", arg0)):
        if value is not None:
            argv += [flag, str(value)]
    reads = () if plan.full_read else plan.readable_roots
    writes = () if plan.full_write else plan.writable_roots
    carved = () if plan.full_write else plan.read_only_subpaths
    denied = () if plan.full_write else plan.denied_paths
    for flag, paths in (("--read", reads), ("--write", writes), ("--ro", carved),
                        ("--deny", denied)):
        for p in paths:
            argv += [flag, p]
    for flag, on in (("--full-read", plan.full_read), ("--full-write", plan.full_write),
                     ("--network", plan.network)):
        if on:
            argv.append(flag)
    return [*argv, "--", *command]


def _status_reader(fd: int) -> Callable[[], None]:
    """Cleanup step: log what the launcher reported on its status pipe, then close it."""

    def read() -> None:
        with open(fd, "rb") as pipe:
            os.set_blocking(fd, False)
            data = pipe.read() or b""  # None: nothing written
        for line in data.decode("utf-8", "replace").splitlines():
            try:
                report = json.loads(line)
            except ValueError:
                continue
            for kind, what in (("error", "launcher failed"), ("warning", "degraded")):
                if kind in report:
                    logger.warning("sandbox %s at %s: %s", what, report.get("stage"), report[kind])
                    break

    return read


class LandlockBackend(LinuxBackend):
    """Landlock + mount namespace + capability drop + seccomp, in a launcher; launches also
    carry a ``ZygoteLaunch`` (same confinement without an interpreter start-up)."""

    name = "landlock"

    def __init__(self, abi: int, *, mount_ns: bool = True) -> None:
        self.abi = abi
        self.mount_ns = mount_ns
        self.python = sys.executable
        self._placeholders = PlaceholderRegistry()
        self.spawn_zygote: Zygote = shared_zygote()

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "abi": self.abi, "mount_ns": self.mount_ns, "zygote": True}

    def wrap(self, spec: LaunchSpec, plan: SandboxPlan) -> LaunchSpec:
        arg0 = spec.arg0 if spec.arg0 is not None and spec.arg0 != spec.argv[0] else None
        env = dict(spec.env)  # the policy layer already added what it adds (§7.5)
        env_fd = memfd_holding("exec-server-env", b"".join(
            name + b"=" + value + b"\0" for name, value in env_entries(env)))
        r, w = os.pipe()
        argv = [self.python, "-I", "-S", LAUNCHER_PATH,
                *launcher_flags(plan, list(spec.argv), cwd=spec.cwd, arg0=arg0, status_fd=w,
                                env_fd=env_fd)]
        carved = plan.read_only_subpaths if self.mount_ns and not plan.full_write else ()
        placeholders = (placeholder_for(p, plan.writable_roots) for p in carved)
        release = self._placeholders.acquire(p for p in placeholders if p is not None)
        # the write end is closed by the spawner after the spawn (pass_fds contract)
        wrapped = finish_spec(spec, argv=argv, env=dict(WRAPPER_ENV), arg0=None,
                              pass_fds=(w, env_fd),
                              cleanup=chain_cleanup(_status_reader(r), release))
        flags = launcher_flags(plan, list(spec.argv), cwd=spec.cwd, arg0=arg0, status_fd=STATUS_FD)
        request = SpawnRequest(args=tuple(flags), env=env, cwd=spec.cwd, status_fd=w)
        wrapped.zygote = ZygoteLaunch(self.spawn_zygote, request)
        return wrapped
