"""Landlock for one sandboxed filesystem child, per request.

Runs inside a freshly forked, single-threaded zygote child (never in the
multi-threaded server: Landlock and seccomp are per-thread, SANDBOX.md §9.1),
*before* the child touches any path. Stdlib only (``ctypes``), because the
zygote runs as ``python -I -S`` without site-packages.

The plan arrives as a plain dict with the fields of ``sandbox.plan.SandboxPlan``
(``full_read``, ``readable_roots``, ``full_write``, ``writable_roots``,
``network``). Read-only holes inside writable roots cannot be expressed in
Landlock (SANDBOX.md §1.7); ``zygote_ops`` enforces those on the resolved
object instead.

Why not ``sandbox.linux.landlock.restrict_self``: that ruleset is made for
arbitrary commands (tty, ptmx, shm and other device nodes); the fs helper
needs none of them, and each rule costs an open + syscall in every child
(~0.15 ms per request measured). The seccomp network filter *is* the
mechanism module's (``sandbox.linux.seccomp``), installed once in the zygote.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import sys
from collections.abc import Mapping, Sequence

__all__ = ["ConfineError", "confine", "landlock_abi", "prefault", "warm_up"]

_NR_CREATE_RULESET = 444
_NR_ADD_RULE = 445
_NR_RESTRICT_SELF = 446
_PR_SET_NO_NEW_PRIVS = 38
_RULE_PATH_BENEATH = 1

_EXECUTE = 1 << 0
_WRITE_FILE = 1 << 1
_READ_FILE = 1 << 2
_READ_DIR = 1 << 3
_TRUNCATE = 1 << 14
_IOCTL_DEV = 1 << 15
_FILE_RIGHTS = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE | _IOCTL_DEV
_READ_RIGHTS = _EXECUTE | _READ_FILE | _READ_DIR
_NET_BIND_TCP = 1 << 0
_NET_CONNECT_TCP = 1 << 1
_SCOPE_ABSTRACT_UNIX = 1 << 0
_SCOPE_SIGNAL = 1 << 1

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.prctl.restype = ctypes.c_int
_libc.prctl.argtypes = [
    ctypes.c_int,
    ctypes.c_ulong,
    ctypes.c_ulong,
    ctypes.c_ulong,
    ctypes.c_ulong,
]


class ConfineError(OSError):
    """Confinement could not be applied; the child must not run the operation."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [
        ("allowed_access", ctypes.c_uint64),
        ("parent_fd", ctypes.c_int32),
    ]


def _fail(what: str) -> ConfineError:
    err = ctypes.get_errno()
    return ConfineError(err, f"{what}: {os.strerror(err)}")


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when Landlock is unavailable."""
    if not sys.platform.startswith("linux"):
        return 0  # syscall numbers are Linux's
    res = _libc.syscall(
        ctypes.c_long(_NR_CREATE_RULESET), None, ctypes.c_size_t(0), ctypes.c_uint32(1)
    )
    return int(res) if res > 0 else 0


def _fs_mask(abi: int) -> int:
    if abi >= 5:
        return 0xFFFF
    if abi >= 3:
        return 0x7FFF
    if abi == 2:
        return 0x3FFF
    return 0x1FFF


def _add_rule(ruleset: int, path: str, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return  # missing roots grant nothing (upstream skips them too)
    except NotADirectoryError:
        return
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            access &= _FILE_RIGHTS
        attr = _PathBeneathAttr(allowed_access=access, parent_fd=fd)
        res = _libc.syscall(
            ctypes.c_long(_NR_ADD_RULE),
            ctypes.c_int(ruleset),
            ctypes.c_int(_RULE_PATH_BENEATH),
            ctypes.byref(attr),
            ctypes.c_uint32(0),
        )
        if res != 0:
            raise _fail(f"landlock_add_rule({path})")
    finally:
        os.close(fd)


def _landlock(plan: Mapping[str, object], abi: int) -> None:
    mask = _fs_mask(abi)
    attr = _RulesetAttr(
        handled_access_fs=mask,
        handled_access_net=(_NET_BIND_TCP | _NET_CONNECT_TCP)
        if abi >= 4 and not plan.get("network")
        else 0,
        scoped=(_SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL) if abi >= 6 else 0,
    )
    size = 24 if abi >= 6 else (16 if abi >= 4 else 8)
    ruleset = int(
        _libc.syscall(
            ctypes.c_long(_NR_CREATE_RULESET),
            ctypes.byref(attr),
            ctypes.c_size_t(size),
            ctypes.c_uint32(0),
        )
    )
    if ruleset < 0:
        raise _fail("landlock_create_ruleset")
    try:
        if plan.get("full_write"):
            _add_rule(ruleset, "/", mask)
        else:
            if plan.get("full_read"):
                _add_rule(ruleset, "/", _READ_RIGHTS)
            else:
                for root in _paths(plan.get("readable_roots")):
                    _add_rule(ruleset, root, _READ_RIGHTS)
            for root in _paths(plan.get("writable_roots")):
                _add_rule(ruleset, root, mask)
            _add_rule(ruleset, "/dev/null", _READ_FILE | _WRITE_FILE | _TRUNCATE)
        if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise _fail("prctl(PR_SET_NO_NEW_PRIVS)")
        if (
            _libc.syscall(
                ctypes.c_long(_NR_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0)
            )
            != 0
        ):
            raise _fail("landlock_restrict_self")
    finally:
        os.close(ruleset)


def _paths(value: object) -> Sequence[str]:
    if not isinstance(value, (list, tuple)):
        return ()
    return [p for p in value if isinstance(p, str) and p.startswith("/")]


def warm_up(abi: int) -> None:
    """Exercise the ctypes paths once (ruleset built and discarded, nothing enforced).

    Done in the zygote so forked children do not pay first-call costs.
    """
    if abi <= 0:
        return
    attr = _RulesetAttr(handled_access_fs=_fs_mask(abi))
    ruleset = int(
        _libc.syscall(
            ctypes.c_long(_NR_CREATE_RULESET),
            ctypes.byref(attr),
            ctypes.c_size_t(8),
            ctypes.c_uint32(0),
        )
    )
    if ruleset >= 0:
        try:
            _add_rule(ruleset, "/", _READ_RIGHTS)
            _add_rule(ruleset, "/dev/null", _READ_FILE)
        finally:
            os.close(ruleset)


def prefault() -> None:
    """Build (and drop) the ctypes structures a ruleset needs; no syscalls, no paths."""
    _RulesetAttr(handled_access_fs=0)
    _PathBeneathAttr(allowed_access=0, parent_fd=-1)
    _fs_mask(7)


def confine(plan: Mapping[str, object], *, abi: int) -> None:
    """Confine the calling (single-threaded) process's filesystem access to ``plan``.

    Args:
        plan: SandboxPlan fields as a dict.
        abi: the Landlock ABI probed once by the zygote; 0 refuses (fail closed).

    Raises:
        ConfineError: any step failed; the caller must not touch the filesystem.
    """
    if plan.get("full_read") and plan.get("full_write"):
        if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise _fail("prctl(PR_SET_NO_NEW_PRIVS)")
        return
    if abi <= 0:
        raise ConfineError(errno.ENOSYS, "Landlock is not available in this kernel")
    _landlock(plan, abi)
