"""Every libc or raw syscall binding of the package, on ``_ctypes`` directly: stdlib-only
for the ``python -I -S`` helpers, where the ``ctypes`` package costs ~2 ms (SANDBOX.md
§3.6). A function this libc lacks fails with ``ENOSYS`` when called."""

import _ctypes
import errno
import os
import types

__all__ = [
    "Structure",
    "addressof",
    "byref",
    "c_char",
    "c_int",
    "c_int32",
    "c_long",
    "c_size_t",
    "c_uint32",
    "c_uint64",
    "c_ulong",
    "c_ushort",
    "c_void_p",
    "call_prctl",
    "call_syscall",
    "machine",
    "mount_setattr",
    "move_mount",
    "open_tree",
    "rename_exchange",
    "set_child_subreaper",
    "set_parent_death_signal",
    "sizeof",
]

TYPE_CHECKING = False
if TYPE_CHECKING:
    _Int = _ctypes._SimpleCData[int]
    _Bytes = _ctypes._SimpleCData[bytes]
else:  # not subscriptable at run time
    _Int = _Bytes = _ctypes._SimpleCData

Structure = _ctypes.Structure
addressof = _ctypes.addressof
byref = _ctypes.byref
sizeof = _ctypes.sizeof


# C scalar types, named as in ctypes.
class c_int(_Int):
    _type_ = "i"


class c_uint32(_Int):
    _type_ = "I"


class c_long(_Int):
    _type_ = "l"


class c_ulong(_Int):
    _type_ = "L"


class c_uint64(_Int):
    _type_ = "Q"


class c_ushort(_Int):
    _type_ = "H"


class c_void_p(_Int):
    _type_ = "P"


class c_char(_Bytes):
    _type_ = "c"


c_int32 = c_int
c_size_t = c_ulong


class _Function(_ctypes.CFuncPtr):
    """A libc function returning ``long``, saving ``errno`` like ``use_errno=True``."""

    _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
    _restype_ = c_long


class _IntFunction(_ctypes.CFuncPtr):
    """A libc function returning ``int`` (read as ``long``, -1 would be 4294967295)."""

    _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
    _restype_ = c_int


#: What ``CFuncPtr((name, lib))`` needs from a library: its ``_handle``.
_libc = types.SimpleNamespace(
    _handle=_ctypes.dlopen(None, _ctypes.RTLD_LOCAL)  # type: ignore[arg-type]
)


def _load(kind: type[_ctypes.CFuncPtr], name: str) -> _ctypes.CFuncPtr | None:
    """libc's ``name``, or None where this libc has no such function."""
    try:
        return kind((name, _libc))  # type: ignore[arg-type]
    except AttributeError:
        return None


_syscall = _load(_Function, "syscall")
_prctl = _load(_IntFunction, "prctl")
_renameat2 = _load(_IntFunction, "renameat2")

machine = os.uname().machine

#: Syscall numbers we call directly (SANDBOX.md §2.2): x86_64, aarch64.
_NR_TABLE = {
    "unshare": (272, 97),
    "capset": (126, 91),
    "capget": (125, 90),
    "mount": (165, 40),
    "umount2": (166, 39),
    "landlock_create_ruleset": (444, 444),
    "landlock_add_rule": (445, 445),
    "landlock_restrict_self": (446, 446),
    "seccomp": (317, 277),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "mount_setattr": (442, 442),
}
_COLUMN = {"x86_64": 0, "aarch64": 1}.get(machine)
_NR: dict[str, int] = {} if _COLUMN is None else {k: v[_COLUMN] for k, v in _NR_TABLE.items()}


def call_syscall(name: str, *args: object) -> int:
    """A raw syscall, OSError on failure. Pass every argument as a C type (``c_int(..)``,
    ``byref(..)``, ``bytes``/``None`` for pointers): bare ints are truncated to ``int``."""
    nr = _NR.get(name)
    if nr is None or _syscall is None:
        raise OSError(errno.ENOSYS, f"{name}: unsupported architecture {machine}")
    _ctypes.set_errno(0)
    return _checked(int(_syscall(c_long(nr), *args)), name)


def call_prctl(option: int, arg2: int = 0, arg3: object = 0, arg4: int = 0, arg5: int = 0) -> int:
    if _prctl is None:
        raise OSError(errno.ENOSYS, f"prctl({option}): not available here")
    a3 = c_ulong(arg3) if isinstance(arg3, int) else arg3
    ret = int(_prctl(c_int(option), c_ulong(arg2), a3, c_ulong(arg4), c_ulong(arg5)))
    return _checked(ret, f"prctl({option})")


PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
RENAME_EXCHANGE = 2


def set_parent_death_signal(signal: int) -> None:
    """The caller gets ``signal`` when the thread that created it exits; safe in a
    forked child before exec (one call, no locks)."""
    call_prctl(PR_SET_PDEATHSIG, signal)


def set_child_subreaper() -> None:
    """Orphaned descendants are re-parented to this process, not init (kept across exec)."""
    call_prctl(PR_SET_CHILD_SUBREAPER, 1)


def rename_exchange(dir_fd: int, old: bytes, new: bytes) -> None:
    """Swap the entries ``old`` and ``new`` of ``dir_fd`` atomically
    (``renameat2(RENAME_EXCHANGE)``); ``ENOSYS`` where libc has none."""
    if _renameat2 is None:
        raise OSError(errno.ENOSYS, "renameat2: not available here")
    _checked(_renameat2(dir_fd, old, dir_fd, new, RENAME_EXCHANGE), "renameat2")


#: ``open_tree`` flags: a detached copy of the mount tree at the path (with its submounts).
OPEN_TREE_CLONE = 1
AT_RECURSIVE = 0x8000
#: ``move_mount``: the source is the fd itself.
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_RDONLY = 0x1


class _MountAttr(Structure):
    _fields_ = [("attr_set", c_uint64), ("attr_clr", c_uint64),
                ("propagation", c_uint64), ("userns_fd", c_uint64)]


def open_tree(path: str) -> int:
    """A close-on-exec fd holding a detached recursive copy of the mounts at ``path``,
    with their flags as now: attached again after the original was made read-only."""
    flags = OPEN_TREE_CLONE | AT_RECURSIVE | os.O_CLOEXEC
    return call_syscall("open_tree", c_int(-100), os.fsencode(path), c_uint32(flags))


def move_mount(fd: int, target: str) -> None:
    """Attach the detached tree ``fd`` (from ``open_tree``) at ``target``."""
    call_syscall("move_mount", c_int(fd), b"", c_int(-100), os.fsencode(target),
                 c_uint32(MOVE_MOUNT_F_EMPTY_PATH))


def mount_setattr(path: str, *, read_only: bool) -> None:
    """Set (or clear) ``MOUNT_ATTR_RDONLY`` on the mount at ``path`` and every mount
    below it, in one call (Linux >= 5.12)."""
    attr = _MountAttr(MOUNT_ATTR_RDONLY if read_only else 0,
                      0 if read_only else MOUNT_ATTR_RDONLY, 0, 0)
    call_syscall("mount_setattr", c_int(-100), os.fsencode(path),
                 c_uint32(AT_RECURSIVE), byref(attr),
                 c_size_t(sizeof(attr)))


def _checked(ret: int, what: str) -> int:
    if ret < 0:
        err = _ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret
