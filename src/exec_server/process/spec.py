"""What the process layer is asked to run: a fully prepared launch.

The server's handler builds a ``LaunchSpec`` from a ``process/start`` request
(env policy applied, paths decoded) and hands it to the sandbox manager, which
may rewrite ``argv``/``env``/``arg0`` and add ``pass_fds``/``cleanup`` before
the process layer spawns it. Pure data: no asyncio, no wire types.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from exec_server.sandbox.plan import SandboxType

__all__ = [
    "PTY_COLUMNS",
    "PTY_ROWS",
    "ExitStatus",
    "LaunchService",
    "LaunchServiceUnavailable",
    "LaunchSpec",
    "ServicedChild",
    "ZygoteLaunch",
]

PTY_ROWS = 24
PTY_COLUMNS = 80


class LaunchServiceUnavailable(Exception):
    """The launch service cannot take this launch now: spawn ``argv`` the plain way."""


@dataclass(frozen=True, slots=True)
class ServicedChild:
    """A child started by a :class:`LaunchService` (not a child of this process).

    Attributes:
        pid: the child; it leads its own process group (or session for a PTY)
            by the time ``spawn`` returns, so ``killpg(pid)`` reaches it.
        wait: resolves to the raw ``waitpid`` status once the service reaped
            the child (-1 when it could not be observed).
    """

    pid: int
    wait: Callable[[], Awaitable[int]]


class LaunchService(Protocol):
    """Starts prepared launches without forking the server (the helper zygote)."""

    async def spawn(
        self,
        request: object,
        stdio: tuple[int | None, int, int],
        *,
        tty: bool,
        owner: object,
    ) -> ServicedChild:
        """Start ``request`` with ``stdio`` (stdin None = ``/dev/null``).

        ``owner`` must later ``release`` the service. The caller keeps (and
        closes) its fds once this returns.

        Raises:
            LaunchServiceUnavailable: nothing was started; use the fallback.
            OSError: the launch itself failed (e.g. its cwd is missing).
        """
        ...

    async def release(self, owner: object) -> None:
        """``owner`` (e.g. a process manager shutting down) no longer needs the service."""
        ...


@dataclass(frozen=True, slots=True)
class ZygoteLaunch:
    """Marks a launch that a :class:`LaunchService` can start (``request`` is its own data)."""

    service: LaunchService
    request: object


@dataclass(slots=True)
class LaunchSpec:
    """One process launch.

    Attributes:
        argv: program and arguments (non-empty); ``argv[0]`` is what gets executed.
        cwd: absolute working directory.
        env: the child's complete environment.
        tty: run on a PTY (stream ``pty``) instead of pipes.
        arg0: the child's visible ``argv[0]`` if different from ``argv[0]``.
        pipe_stdin: keep a writable stdin pipe in non-tty mode (current client).
        pass_fds: parent fds the child must inherit (e.g. a seccomp program for
            bwrap); the spawner closes them in the parent after the spawn.
        cleanup: called once after the child has been reaped (e.g. remove
            placeholder files bwrap created for missing protected paths).
        sandbox_type: the sandbox that was applied, for the response.
        rows / columns: PTY window size.
        zygote: set by a sandbox backend whose launch can also be started by a
            launch service; ``argv``/``pass_fds`` stay the equivalent fallback.
    """

    argv: list[str]
    cwd: str
    env: dict[str, str]
    tty: bool = False
    arg0: str | None = None
    pipe_stdin: bool = False
    pass_fds: tuple[int, ...] = ()
    cleanup: Callable[[], None] | None = None
    sandbox_type: SandboxType = SandboxType.NONE
    rows: int = PTY_ROWS
    columns: int = PTY_COLUMNS
    extra: dict[str, str] = field(default_factory=dict)
    zygote: ZygoteLaunch | None = None


@dataclass(frozen=True, slots=True)
class ExitStatus:
    """How a child ended: ``code`` 0-255, ``128+signal`` for a signal death, -1 if unobservable."""

    code: int
    signal: int | None = None
