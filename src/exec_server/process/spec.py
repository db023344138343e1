"""What the process layer is asked to run: a fully prepared launch.

The server's handler builds a ``LaunchSpec`` from a ``process/start`` request
(env policy applied, paths decoded) and hands it to the sandbox manager, which
may rewrite ``argv``/``env``/``arg0`` and add ``pass_fds``/``cleanup`` before
the process layer spawns it. Pure data: no asyncio, no wire types.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from exec_server.sandbox.plan import SandboxType

__all__ = ["PTY_COLUMNS", "PTY_ROWS", "ExitStatus", "LaunchSpec"]

PTY_ROWS = 24
PTY_COLUMNS = 80


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


@dataclass(frozen=True, slots=True)
class ExitStatus:
    """How a child ended: ``code`` 0-255, ``128+signal`` for a signal death, -1 if unobservable."""

    code: int
    signal: int | None = None
