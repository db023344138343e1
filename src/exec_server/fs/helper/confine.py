"""Landlock for one sandboxed filesystem child, per request.

Runs in a freshly forked single-threaded zygote child (Landlock and seccomp are
per-thread, SANDBOX.md §9.1) before it touches any path; stdlib only. Its own small
ruleset, not ``sandbox.linux.landlock.restrict_self``'s: the helper needs none of a
command's device nodes, and each rule costs every child a syscall. Read-only holes
Landlock cannot express (SANDBOX.md §1.7) are ``fs.helper.ops``'s.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Iterator, Mapping, Sequence

from exec_server.sandbox.linux import landlock
from exec_server.sandbox.linux.landlock import (
    READ_FILE,
    READ_RIGHTS,
    TRUNCATE,
    WRITE_FILE,
    add_rule_fd,
    create_ruleset,
    fs_mask,
)
from exec_server.sandbox.linux.seccomp import set_no_new_privs

__all__ = ["ConfineError", "confine", "landlock_abi", "warm_up"]

#: What ``/dev/null`` gets when writes are confined.
_DEV_NULL_RIGHTS = READ_FILE | WRITE_FILE | TRUNCATE


class ConfineError(OSError):
    """Confinement could not be applied; the child must not run the operation."""


@contextlib.contextmanager
def _step(what: str) -> Iterator[None]:
    try:
        yield
    except ConfineError:
        raise
    except OSError as exc:
        err = exc.errno or errno.EPERM
        raise ConfineError(err, f"{what}: {os.strerror(err)}") from exc


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when Landlock is unavailable."""
    return landlock.abi_version() if sys.platform.startswith("linux") else 0


def _add_rule(ruleset: int, path: str, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return  # missing roots grant nothing (upstream skips them too)
    try:
        with _step(f"landlock_add_rule({path})"):
            add_rule_fd(ruleset, fd, access)
    finally:
        os.close(fd)


def _landlock(plan: Mapping[str, object], abi: int) -> None:
    mask = fs_mask(abi)
    net = 0 if abi < 4 or plan.get("network") else landlock.NET_BIND_TCP | landlock.NET_CONNECT_TCP
    scoped = landlock.SCOPE_ABSTRACT_UNIX_SOCKET | landlock.SCOPE_SIGNAL if abi >= 6 else 0
    with _step("landlock_create_ruleset"):
        ruleset = create_ruleset(mask, net, scoped)
    try:
        if plan.get("full_write"):
            _add_rule(ruleset, "/", mask)
        else:
            if plan.get("full_read"):
                _add_rule(ruleset, "/", READ_RIGHTS)
            else:
                for root in _paths(plan.get("readable_roots")):
                    _add_rule(ruleset, root, READ_RIGHTS)
            for root in _paths(plan.get("writable_roots")):
                _add_rule(ruleset, root, mask)
            _add_rule(ruleset, "/dev/null", _DEV_NULL_RIGHTS)
        with _step("prctl(PR_SET_NO_NEW_PRIVS)"):
            set_no_new_privs()
        with _step("landlock_restrict_self"):
            landlock.restrict(ruleset)
    finally:
        os.close(ruleset)


def _paths(value: object) -> Sequence[str]:
    if not isinstance(value, (list, tuple)):
        return ()
    return [p for p in value if isinstance(p, str) and p.startswith("/")]


def warm_up(abi: int) -> None:
    """Build and drop a ruleset in the zygote, so forked children pay no first-call costs."""
    if abi <= 0:
        return
    try:
        ruleset = create_ruleset(fs_mask(abi))
    except OSError:
        return
    try:
        _add_rule(ruleset, "/", READ_RIGHTS)
        _add_rule(ruleset, "/dev/null", READ_FILE)
    finally:
        os.close(ruleset)


def confine(plan: Mapping[str, object], *, abi: int) -> None:
    """Confine this single-threaded process to ``plan`` (``SandboxPlan`` fields); ``abi`` 0
    refuses (fail closed). ``ConfineError``: the caller must not touch the filesystem."""
    if plan.get("full_read") and plan.get("full_write"):
        with _step("prctl(PR_SET_NO_NEW_PRIVS)"):
            set_no_new_privs()
        return
    if abi <= 0:
        raise ConfineError(errno.ENOSYS, "Landlock is not available in this kernel")
    _landlock(plan, abi)
