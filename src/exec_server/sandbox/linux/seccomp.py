"""Hand-built seccomp BPF network filter (SANDBOX.md §2.3), stdlib only: the launcher installs
it before ``execve``, bwrap gets the bytes via ``--seccomp FD``; never in the server."""

import sys

from exec_server._os.linux import (
    Structure,
    addressof,
    byref,
    c_char,
    c_ushort,
    c_void_p,
    call_prctl,
    machine,
)

__all__ = [
    "MODE_RESTRICTED", "MODE_VSOCK", "SeccompError", "build_filter", "install_network_filter",
    "set_no_new_privs", "supported",
]

#: network restricted: everything but AF_UNIX sockets blocked (upstream "Restricted").
MODE_RESTRICTED = "restricted"
#: network allowed, filesystem confined: only AF_VSOCK blocked (upstream "VmSocketRestricted").
MODE_VSOCK = "vsock"

_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2

_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_KILL_PROCESS = 0x80000000
_EPERM = 1
_RET_EPERM = 0x00050000 | _EPERM
_AF_UNIX = 1
_AF_VSOCK = 40
_X32_BIT = 0x40000000
#: terminal input injection: TIOCSTI pushes bytes into a tty's input queue (the
#: classic escape into the caller's shell), TIOCLINUX can do the same on VTs.
_TIOCSTI = 0x5412
_TIOCLINUX = 0x541C

_SYSCALLS = ("socket", "socketpair", "connect", "accept", "accept4", "bind", "listen",
             "getsockname", "getpeername", "shutdown", "sendto", "sendmmsg", "recvmmsg",
             "setsockopt", "getsockopt", "ptrace", "process_vm_readv", "process_vm_writev",
             "io_uring_setup", "io_uring_enter", "io_uring_register", "ioctl")
#: audit arch and the numbers of ``_SYSCALLS``, in order.
_ARCH = {
    "x86_64": (0xC000003E, dict(zip(_SYSCALLS, (
        41, 53, 42, 43, 288, 49, 50, 51, 52, 48, 44, 307, 299, 54, 55, 101, 310, 311,
        425, 426, 427, 16), strict=True))),
    "aarch64": (0xC00000B7, dict(zip(_SYSCALLS, (
        198, 199, 203, 202, 242, 200, 201, 204, 205, 210, 206, 269, 243, 208, 209, 117, 270,
        271, 425, 426, 427, 29), strict=True))),
}

#: denied outright when restricted: all but socket/socketpair (by domain) and ioctl (by command).
_DENY_RESTRICTED = _SYSCALLS[2:-1]
#: io_uring can create sockets without socket(): deny it in every mode.
_DENY_VSOCK = ("io_uring_setup", "io_uring_enter", "io_uring_register")

_cache: dict[tuple[str, str], bytes] = {}


class SeccompError(OSError):
    """The filter could not be built or installed (unsupported arch, kernel refusal)."""


def supported(arch: str | None = None) -> bool:
    return (arch or machine) in _ARCH


def _ins(code: int, jt: int, jf: int, k: int) -> bytes:
    """One ``struct sock_filter`` (u16 code, u8 jt, u8 jf, u32 k), native byte order."""
    order = sys.byteorder
    return code.to_bytes(2, order) + bytes((jt, jf)) + k.to_bytes(4, order)


def build_filter(mode: str = MODE_RESTRICTED, arch: str | None = None) -> bytes:
    """The BPF program for ``mode``; SeccompError for an unknown arch or mode."""
    arch = arch or machine
    key = (mode, arch)
    cached = _cache.get(key)
    if cached is not None:
        return cached
    if arch not in _ARCH:
        raise SeccompError(38, f"seccomp filter: unsupported architecture {arch}")
    audit_arch, nrs = _ARCH[arch]
    # socket()/socketpair() domain check: restricted allows only AF_UNIX (jump over the
    # EPERM when equal), vsock refuses only AF_VSOCK (fall into the EPERM when equal)
    deny: tuple[str, ...]
    if mode == MODE_RESTRICTED:
        deny, family, if_equal, if_other = _DENY_RESTRICTED, _AF_UNIX, 1, 0
    elif mode == MODE_VSOCK:
        deny, family, if_equal, if_other = _DENY_VSOCK, _AF_VSOCK, 0, 1
    else:
        raise SeccompError(22, f"seccomp filter: unknown mode {mode!r}")
    prog = [
        _ins(_LD_W_ABS, 0, 0, 4),
        _ins(_JEQ_K, 1, 0, audit_arch),
        _ins(_RET_K, 0, 0, _RET_KILL_PROCESS),
        _ins(_LD_W_ABS, 0, 0, 0),
    ]
    if arch == "x86_64":
        prog += [_ins(_JGE_K, 0, 1, _X32_BIT), _ins(_RET_K, 0, 0, _RET_EPERM)]
    for name in deny:
        prog += [_ins(_JEQ_K, 0, 1, nrs[name]), _ins(_RET_K, 0, 0, _RET_EPERM)]
    # ioctl(fd, TIOCSTI | TIOCLINUX) -> EPERM; the kernel truncates cmd to 32 bits
    prog += [
        _ins(_JEQ_K, 0, 5, nrs["ioctl"]),
        _ins(_LD_W_ABS, 0, 0, 24),
        _ins(_JEQ_K, 2, 0, _TIOCSTI),
        _ins(_JEQ_K, 1, 0, _TIOCLINUX),
        _ins(_RET_K, 0, 0, _RET_ALLOW),
        _ins(_RET_K, 0, 0, _RET_EPERM),
    ]
    for name in ("socket", "socketpair"):
        prog += [
            _ins(_JEQ_K, 0, 4, nrs[name]),
            _ins(_LD_W_ABS, 0, 0, 16),
            _ins(_JEQ_K, if_equal, if_other, family),
            _ins(_RET_K, 0, 0, _RET_EPERM),
            _ins(_RET_K, 0, 0, _RET_ALLOW),
        ]
    prog.append(_ins(_RET_K, 0, 0, _RET_ALLOW))
    data = b"".join(prog)
    _cache[key] = data
    return data


def set_no_new_privs() -> None:
    """Required before an unprivileged filter or Landlock ruleset; irreversible."""
    call_prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


class _SockFprog(Structure):
    _fields_ = [("len", c_ushort), ("filter", c_void_p)]


def install_network_filter(mode: str = MODE_RESTRICTED) -> None:
    """Install ``build_filter(mode)`` on this single-threaded process and its descendants
    (restricted: EPERM for io_uring and every socket but AF_UNIX); SeccompError if refused."""
    program = build_filter(mode)
    buf = (c_char * len(program)).from_buffer_copy(program)
    fprog = _SockFprog(len(program) // 8, addressof(buf))
    try:
        set_no_new_privs()
        call_prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, byref(fprog), 0, 0)
    except OSError as exc:
        raise SeccompError(exc.errno or 1, f"installing seccomp filter: {exc.strerror}") from exc

