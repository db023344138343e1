"""What every Linux backend offers, and pieces they share (server side only)."""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import replace

from exec_server.process.spec import LaunchSpec
from exec_server.sandbox.plan import SandboxPlan, SandboxType

__all__ = [
    "WRAPPER_ENV", "LinuxBackend", "PlaceholderRegistry", "chain_cleanup", "env_entries",
    "memfd_holding",
]

#: What a wrapper (bwrap, the launcher) starts with: it runs unconfined, so no client choice
#: (``LD_PRELOAD``, ``PYTHON*``) may reach it; the command's env travels in an fd.
WRAPPER_ENV: dict[str, str] = {}


class LinuxBackend(ABC):
    """Turns a plain ``LaunchSpec`` into one that runs confined per a ``SandboxPlan``."""

    name: str

    @abstractmethod
    def wrap(self, spec: LaunchSpec, plan: SandboxPlan) -> LaunchSpec:
        """The launch to spawn instead; the spawner closes its ``pass_fds`` after the spawn
        and calls its ``cleanup`` once the child is reaped."""

    def describe(self) -> dict[str, object]:
        """What the probe found (``exec-server run --probe``)."""
        return {"name": self.name}


def env_entries(env: dict[str, str]) -> list[tuple[bytes, bytes]]:
    """``env`` as bytes; ValueError for what ``execve`` cannot carry (as ``subprocess``)."""
    entries = []
    for name, value in env.items():
        key, val = os.fsencode(name), os.fsencode(value)
        if not key or b"=" in key:
            raise ValueError(f"illegal environment variable name {name!r}")
        if b"\0" in key or b"\0" in val:
            raise ValueError(f"embedded null byte in environment variable {name!r}")
        entries.append((key, val))
    return entries


def memfd_holding(name: str, data: bytes) -> int:
    """A close-on-exec memfd holding ``data``: unlike a pipe, any size fits before a read."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def chain_cleanup(*steps: Callable[[], None] | None) -> Callable[[], None] | None:
    """One callback running every non-None step, each at most once, errors swallowed per step."""
    real = [s for s in steps if s is not None]
    if not real:
        return None

    def run() -> None:
        while real:
            step = real.pop(0)  # before running it: at most once
            with contextlib.suppress(OSError):
                step()

    return run


class PlaceholderRegistry:
    """Live launches per placeholder mountpoint (binding over a missing path creates it on the
    host, SANDBOX.md §9.4); the last one out removes it if still empty."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: Counter[str] = Counter()

    def acquire(self, paths: Iterable[str]) -> Callable[[], None] | None:
        held = tuple(dict.fromkeys(paths))
        if not held:
            return None
        with self._lock:
            self._live.update(held)

        def release() -> None:
            with self._lock:
                self._live.subtract(held)
                gone = [p for p in held if self._live[p] <= 0]
                for p in gone:
                    del self._live[p]
            for p in gone:
                _remove_if_empty(p)

        return release


def _remove_if_empty(path: str) -> None:
    with contextlib.suppress(OSError):
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode):
            os.rmdir(path)
        elif stat.S_ISREG(st.st_mode) and st.st_size == 0:
            os.unlink(path)


def finish_spec(spec: LaunchSpec, *, argv: list[str], env: dict[str, str], arg0: str | None,
                pass_fds: tuple[int, ...], cleanup: Callable[[], None] | None) -> LaunchSpec:
    return replace(spec, argv=argv, env=env, arg0=arg0,
                   pass_fds=tuple(spec.pass_fds) + pass_fds,
                   cleanup=chain_cleanup(cleanup, spec.cleanup),
                   sandbox_type=SandboxType.LINUX_SECCOMP)
