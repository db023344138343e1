"""An unsandboxed launch's process tree, which ``setsid`` takes out of its group: found
through parent links in ``/proc`` while the launched process lives (a PTY launch is a
subreaper, so double forks stay in it). A sandboxed one's PID namespace ends with it."""

from __future__ import annotations

import contextlib
import os
import signal

__all__ = ["descendants", "kill_tree", "open_pidfds", "signal_pidfds"]

#: walks of ``kill_tree`` before it gives up on a tree that keeps forking.
_KILL_PASSES = 20


def _stat(pid: str) -> tuple[int, int, bool] | None:
    """``(ppid, pgid, alive)`` of ``pid`` from ``/proc``, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2:].split()
    return int(fields[1]), int(fields[2]), fields[0] not in (b"Z", b"X")


def descendants(root: int) -> list[int]:
    """Live (non-zombie) descendants of ``root``, parents before children, leaving out
    (but descending through) members of ``root``'s group: a ``killpg`` reaches them."""
    children: dict[int, list[tuple[int, int, bool]]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:  # no procfs (not Linux): only the group is reachable
        return []
    for name in names:
        info = _stat(name) if name.isdigit() else None
        if info is not None:
            ppid, pgid, alive = info
            children.setdefault(ppid, []).append((int(name), pgid, alive))
    found: list[int] = []
    queue = [root]
    while queue:
        parent = queue.pop(0)
        for pid, pgid, alive in children.get(parent, ()):
            queue.append(pid)
            if alive and pgid != root:
                found.append(pid)
    return found


def open_pidfds(pids: list[int]) -> list[int]:
    """pidfds for ``pids`` (those already gone are skipped): signals then reach exactly
    these processes even after they were re-parented or their pid was reused."""
    fds = []
    for pid in pids:
        with contextlib.suppress(OSError, AttributeError):
            fds.append(os.pidfd_open(pid))
    return fds


def signal_pidfds(fds: list[int], sig: int) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(fd, sig)


def kill_tree(root: int) -> None:
    """SIGKILL every live descendant of ``root``, walking again until none is found: a killed
    middle process's children move to the subreaper ``root``; a process may fork meanwhile."""
    for _ in range(_KILL_PASSES):
        found = descendants(root)
        if not found:
            return
        fds = open_pidfds(found)
        try:
            signal_pidfds(fds, signal.SIGKILL)
        finally:
            for fd in fds:
                os.close(fd)
