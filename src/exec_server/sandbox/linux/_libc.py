"""Thin ctypes access to the few Linux syscalls the sandbox needs.

Stdlib-only on purpose: the landlock launcher imports this under
``python -I -S`` (SANDBOX.md §3.6 — ``ctypes`` is the one heavy import we
accept). Nothing here is called inside the server process except the
read-only Landlock ABI query.
"""


import ctypes
import os

__all__ = [
    "NR",
    "call_prctl",
    "call_syscall",
    "libc",
    "machine",
]

libc = ctypes.CDLL(None, use_errno=True)
_syscall = libc.syscall
_syscall.restype = ctypes.c_long
_prctl = libc.prctl
_prctl.restype = ctypes.c_int

machine = os.uname().machine

#: Syscall numbers we call directly (SANDBOX.md §2.2); ``None`` when unknown.
_NR_TABLE = {
    "x86_64": {"unshare": 272, "capset": 126, "capget": 125, "mount": 165, "umount2": 166,
               "landlock_create_ruleset": 444, "landlock_add_rule": 445,
               "landlock_restrict_self": 446, "seccomp": 317},
    "aarch64": {"unshare": 97, "capset": 91, "capget": 90, "mount": 40, "umount2": 39,
                "landlock_create_ruleset": 444, "landlock_add_rule": 445,
                "landlock_restrict_self": 446, "seccomp": 277},
}
NR: dict[str, int] = _NR_TABLE.get(machine, {})


def call_syscall(name: str, *args: object) -> int:
    """Call a raw syscall; raise ``OSError`` with the kernel's errno on failure."""
    nr = NR.get(name)
    if nr is None:
        raise OSError(38, f"{name}: unsupported architecture {machine}")
    ctypes.set_errno(0)
    ret = int(_syscall(ctypes.c_long(nr), *args))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")
    return ret


def call_prctl(option: int, arg2: int = 0, arg3: int | object = 0, arg4: int = 0,
               arg5: int = 0) -> int:
    """``prctl(2)``; raise ``OSError`` on failure."""
    a3 = ctypes.c_ulong(arg3) if isinstance(arg3, int) else arg3
    ret = int(_prctl(ctypes.c_int(option), ctypes.c_ulong(arg2), a3,
                     ctypes.c_ulong(arg4), ctypes.c_ulong(arg5)))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}): {os.strerror(err)}")
    return ret
