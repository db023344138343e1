"""What the process layer is asked to run (pure data): a launch the server's handler
built and the sandbox manager may have rewritten, and the launch-service interface."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from exec_server.sandbox.plan import SandboxType

__all__ = [
    "ExitStatus",
    "LaunchService",
    "LaunchServiceUnavailable",
    "LaunchSpec",
    "ServicedChild",
    "ZygoteLaunch",
]


class LaunchServiceUnavailable(Exception):
    """The launch service cannot take this launch now: spawn ``argv`` the plain way."""


@dataclass(frozen=True, slots=True)
class ServicedChild:
    """A child a :class:`LaunchService` started: ``pid`` leads its own group (or session)
    once ``spawn`` returns; ``wait`` resolves to its raw wait status (-1: unobservable)."""

    pid: int
    wait: Callable[[], Awaitable[int]]


class LaunchService(Protocol):
    """Starts prepared launches without forking the server (the helper zygote)."""

    async def spawn(
        self, request: object, stdio: tuple[int | None, int, int], *, tty: bool, owner: object
    ) -> ServicedChild:
        """Start ``request`` with ``stdio`` (stdin None = ``/dev/null``; the caller keeps its
        fds); ``owner`` must later ``release`` the service. LaunchServiceUnavailable: nothing
        was started, use the fallback; OSError: the launch failed (e.g. its cwd is missing)."""

    async def release(self, owner: object) -> None:
        """``owner`` (e.g. a process manager shutting down) no longer needs the service."""


@dataclass(frozen=True, slots=True)
class ZygoteLaunch:
    """Marks a launch that a :class:`LaunchService` can start (``request`` is its own data)."""

    service: LaunchService
    request: object


@dataclass(slots=True)
class LaunchSpec:
    """One process launch: ``argv[0]`` is executed, ``arg0`` what the child sees if
    different; ``cwd`` absolute, ``env`` complete; ``pass_fds`` (e.g. bwrap's seccomp
    program) close in the parent after the spawn, ``cleanup`` runs once the child is
    reaped; ``zygote``: a launch service can start it too (``argv`` stays the fallback)."""

    argv: list[str]
    cwd: str
    env: dict[str, str]
    tty: bool = False
    arg0: str | None = None
    pipe_stdin: bool = False
    pass_fds: tuple[int, ...] = ()
    cleanup: Callable[[], None] | None = None
    sandbox_type: SandboxType = SandboxType.NONE
    zygote: ZygoteLaunch | None = None


@dataclass(frozen=True, slots=True)
class ExitStatus:
    """How a child ended: ``code`` 0-255, ``128+signal`` for a signal death, -1 if unobservable."""

    code: int
    signal: int | None = None
