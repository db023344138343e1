"""Landlock rulesets from a ``SandboxPlan`` (SANDBOX.md §1), stdlib only, best effort per ABI.
Per thread (§9.1): restrict only a fresh single-threaded child. It cannot subtract (§1.7):
carve-outs inside granted roots need the mount namespace on top."""


import os
import stat

from exec_server._os.linux import (
    Structure,
    byref,
    c_int,
    c_int32,
    c_size_t,
    c_uint32,
    c_uint64,
    call_syscall,
    sizeof,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from exec_server.sandbox.plan import SandboxPlan

__all__ = [
    "FILE_RIGHTS", "READ_RIGHTS", "LandlockError", "LandlockStatus", "abi_version", "add_rule_fd",
    "create_ruleset", "fs_mask", "prefault", "restrict", "restrict_self",
]

_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1

EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
# bits 4-12: remove and make rights; 13: REFER (only ever granted through fs_mask)
TRUNCATE = 1 << 14
IOCTL_DEV = 1 << 15

NET_BIND_TCP = 1 << 0
NET_CONNECT_TCP = 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1

#: rights allowed on a non-directory rule (measured: others give EINVAL).
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
#: read (and execute) access to a tree.
READ_RIGHTS = EXECUTE | READ_FILE | READ_DIR
_KNOWN_ABI = 7


#: every filesystem right each ABI knows: REFER came in 2, TRUNCATE in 3, IOCTL_DEV in 5.
_FS_MASKS = {1: 0x1FFF, 2: 0x3FFF, 3: 0x7FFF, 4: 0x7FFF}


def fs_mask(abi: int) -> int:
    return 0 if abi <= 0 else _FS_MASKS.get(abi, 0xFFFF)


#: device nodes everyday tools need (SANDBOX.md §1.9; a launch's are its private ``/dev``).
_DEVICE_RULES: tuple[tuple[str, int], ...] = (
    ("/dev/null", READ_FILE | WRITE_FILE | TRUNCATE | IOCTL_DEV),
    ("/dev/zero", READ_FILE | WRITE_FILE | TRUNCATE),
    ("/dev/full", READ_FILE | WRITE_FILE | TRUNCATE),
    ("/dev/random", READ_FILE),
    ("/dev/urandom", READ_FILE),
    ("/dev/tty", READ_FILE | WRITE_FILE | TRUNCATE | IOCTL_DEV),
    ("/dev/ptmx", READ_FILE | WRITE_FILE | IOCTL_DEV),
    ("/dev/pts", READ_FILE | WRITE_FILE | READ_DIR | IOCTL_DEV),
    ("/dev/shm", 0xFFFF),
)


class LandlockError(OSError):
    """Landlock was required but could not be applied."""


class LandlockStatus:
    """What ``restrict_self`` enforced (``abi`` 0: unavailable; ``skipped``: missing paths)."""

    def __init__(self, abi: int, fs: bool = False, net: bool = False, scopes: int = 0,
                 skipped: tuple[str, ...] = ()) -> None:
        self.abi = abi
        self.fs = fs
        self.net = net
        self.scopes = scopes
        self.skipped = skipped

    @property
    def enforced(self) -> bool:
        return self.fs or self.net or bool(self.scopes)

    def as_dict(self) -> dict[str, object]:
        return {"abi": self.abi, "fs": self.fs, "net": self.net, "scopes": self.scopes,
                "skipped": list(self.skipped)}


def abi_version() -> int:
    """The kernel's Landlock ABI; 0 when not compiled in or disabled at boot."""
    try:
        return call_syscall("landlock_create_ruleset", None, c_size_t(0),
                            c_uint32(_CREATE_RULESET_VERSION))
    except OSError:
        return 0


class _RulesetAttr(Structure):
    _fields_ = [("handled_access_fs", c_uint64),
                ("handled_access_net", c_uint64),
                ("scoped", c_uint64)]


class _PathBeneathAttr(Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", c_uint64), ("parent_fd", c_int32)]


def create_ruleset(handled_fs: int, handled_net: int = 0, scoped: int = 0) -> int:
    """A ruleset fd to close; old kernels accept the full attr if unknown fields are zero."""
    attr = _RulesetAttr(handled_fs, handled_net, scoped)
    return call_syscall("landlock_create_ruleset", byref(attr), c_size_t(sizeof(attr)),
                        c_uint32(0))


def add_rule_fd(ruleset_fd: int, fd: int, rights: int) -> bool:
    """Allow ``rights`` beneath ``O_PATH`` ``fd``; False when none applies to a non-directory."""
    if not stat.S_ISDIR(os.fstat(fd).st_mode):
        rights &= FILE_RIGHTS
    if not rights:
        return False
    attr = _PathBeneathAttr(rights, fd)
    call_syscall("landlock_add_rule", c_int(ruleset_fd), c_int(_RULE_PATH_BENEATH),
                 byref(attr), c_uint32(0))
    return True


def restrict(ruleset_fd: int) -> None:
    """Enforce ``ruleset_fd`` on the calling thread (``PR_SET_NO_NEW_PRIVS`` set before)."""
    call_syscall("landlock_restrict_self", c_int(ruleset_fd), c_uint32(0))


def prefault() -> None:
    """Build the structures a ruleset needs, so a zygote's children start warm."""
    _RulesetAttr(0, 0, 0)
    _PathBeneathAttr(0, -1)
    fs_mask(_KNOWN_ABI)


def _add_path_rule(ruleset_fd: int, path: str, rights: int, handled: int) -> bool:
    """Add one path rule; False when the path does not exist (skipped)."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        add_rule_fd(ruleset_fd, fd, rights & handled)
        return True
    finally:
        os.close(fd)


def _rules_for(plan: "SandboxPlan") -> list[tuple[str, int]]:
    reads = ["/"] if plan.full_read else plan.readable_roots
    return [*((root, READ_RIGHTS) for root in reads),
            *((root, 0xFFFF) for root in plan.writable_roots), *_DEVICE_RULES]


def restrict_self(plan: "SandboxPlan", *, required: bool = True,
                  abi: int | None = None) -> LandlockStatus:
    """Confine this single-threaded process per ``plan``; network off: TCP (ABI >= 4) and
    abstract unix sockets (ABI >= 6) denied. ``required``: LandlockError, not a no-op."""
    if abi is None:
        abi = abi_version()
    abi = min(abi, _KNOWN_ABI)
    if abi <= 0:
        if required:
            raise LandlockError(38, "Landlock is not available in this kernel")
        return LandlockStatus(0)
    confine_fs = not (plan.full_read and plan.full_write)
    handled_fs = fs_mask(abi) if confine_fs else 0
    handled_net = NET_BIND_TCP | NET_CONNECT_TCP if (abi >= 4 and not plan.network) else 0
    scoped = 0
    if abi >= 6:
        scoped = SCOPE_SIGNAL | (0 if plan.network else SCOPE_ABSTRACT_UNIX_SOCKET)
    if not (handled_fs or handled_net or scoped):
        if required:
            raise LandlockError(95, f"Landlock ABI {abi} cannot express this plan")
        return LandlockStatus(abi)
    skipped: list[str] = []
    try:
        ruleset_fd = create_ruleset(handled_fs, handled_net, scoped)
        try:
            if handled_fs:
                for path, rights in _rules_for(plan):
                    if not _add_path_rule(ruleset_fd, path, rights, handled_fs):
                        skipped.append(path)
            from exec_server.sandbox.linux.seccomp import set_no_new_privs

            set_no_new_privs()
            restrict(ruleset_fd)
        finally:
            os.close(ruleset_fd)
    except OSError as exc:
        if required:
            raise LandlockError(exc.errno or 1, f"applying Landlock: {exc.strerror}") from exc
        return LandlockStatus(abi)
    return LandlockStatus(abi, fs=bool(handled_fs), net=bool(handled_net), scopes=scoped,
                          skipped=tuple(skipped))
