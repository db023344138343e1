"""No child process or fd outlives a test; the server does not leak either."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

TIMEOUT = 10.0


def _start(pid: str, argv: list[str], cwd: str, tty: bool = False) -> dict[str, Any]:
    return {
        "processId": pid,
        "argv": argv,
        "cwd": cwd,
        "env": {"PATH": "/usr/bin:/bin"},
        "tty": tty,
        "sandbox": None,
    }


async def test_server_and_its_children_are_gone_after_stop(
    no_leaks: None,
    wait_until: Callable[..., Awaitable[None]],
    server_factory: Callable[..., Any],
    rpc: Callable[[str], Awaitable[Any]],
    tmp_path: Any,
) -> None:
    srv = server_factory()
    client = await rpc(srv.url)
    await client.initialize()
    for i in range(3):
        await client.call("process/start", _start(f"s{i}", ["/bin/sleep", "60"], str(tmp_path)))
    await client.call("process/start", _start("t", ["/bin/sleep", "60"], str(tmp_path), tty=True))
    await wait_until(lambda: len(srv.child_pids()) >= 4)
    await client.aclose()
    assert srv.stop() == 0  # SIGTERM: the server kills its sessions' processes and exits


def _pipes(fds: dict[int, str]) -> list[int]:
    """Pipe fds besides stdio (a start-up probe's, while it winds down)."""
    return [fd for fd, target in fds.items() if fd > 2 and target.startswith("pipe:")]


def _importing(fds: dict[int, str]) -> bool:
    """A module file open: the background warm-up is still importing (its
    ``.pyc`` was once caught in the baseline, then reported gone)."""
    return any(target.endswith((".py", ".pyc", ".so")) for target in fds.values())


async def test_server_fds_return_to_baseline(
    wait_until: Callable[..., Awaitable[None]],
    server: Any,
    rpc: Callable[[str], Awaitable[Any]],
    tmp_path: Any,
) -> None:
    client = await rpc(server.url)
    await client.initialize()
    # Start-up sandbox probes run in the background; let them finish first.
    # (their pipes may close a moment after the probe child is reaped). The
    # baseline is the fd set seen in the same check: read apart from it, it
    # once caught the pipes of a probe that started in between.
    baseline: dict[int, str] = {}

    def settled() -> bool:
        fds = server.open_fds()
        if _pipes(fds) or _importing(fds) or server.child_pids():
            return False
        baseline.update(fds)
        return True

    try:
        await wait_until(settled)
    except TimeoutError:
        raise AssertionError(
            f"start-up probes still running: children {server.child_pids()}, "
            f"fds {server.open_fds()}"
        ) from None
    for round_ in range(2):
        for i in range(10):
            pid = f"r{round_}-{i}"
            await client.call(
                "process/start",
                _start(
                    pid, ["/bin/sh", "-c", "echo out; echo err >&2"], str(tmp_path), tty=i % 2 == 0
                ),
            )
        closed: set[str] = set()
        while len(closed) < 10:
            note = await client.notification("process/closed")
            closed.add(note["params"]["processId"])
    try:
        await wait_until(lambda: server.open_fds() == baseline and not server.child_pids())
    except TimeoutError:
        now = server.open_fds()
        extra = {fd: now[fd] for fd in now.keys() - baseline.keys()}
        gone = {fd: baseline[fd] for fd in baseline.keys() - now.keys()}
        changed = {
            fd: (baseline[fd], now[fd])
            for fd in now.keys() & baseline.keys()
            if now[fd] != baseline[fd]
        }
        raise AssertionError(
            f"server fds not back to baseline: extra {extra}, gone {gone}, changed {changed}, "
            f"children {server.child_pids()}"
        ) from None
