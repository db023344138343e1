"""Which devices hold a filesystem kept in memory (tmpfs, ramfs), learned per ``st_dev``.

Why: on such a filesystem a write may replace a file with a plain ``rename``
(the ``RENAME_EXCHANGE`` detour only pays on ext4, see
:mod:`exec_server.fs.exchange`).

The answer comes from ``fstatfs`` on a descriptor the caller already has
open, once per device (the writer learns it); until then a device is
unknown. Device numbers can be reused after an unmount, so the table is
emptied when it grows past :data:`_MAX_DEVICES`, and a caller acting on a
stale answer still gets a correct result, only at the other speed.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable
from typing import Final

__all__ = ["forget", "in_memory", "learn"]

_TMPFS_MAGIC: Final = 0x01021994
_RAMFS_MAGIC: Final = 0x858458F6
_IN_MEMORY: Final = frozenset({_TMPFS_MAGIC, _RAMFS_MAGIC})
_MAX_DEVICES: Final = 64


class _StatFs(ctypes.Structure):
    # ``struct statfs`` starts with ``f_type`` (a C long) on every Linux ABI;
    # the rest is room for the fields we do not read.
    _fields_ = [("f_type", ctypes.c_long), ("_rest", ctypes.c_byte * 240)]


def _load_fstatfs() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).fstatfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(_StatFs)]
    fn.restype = ctypes.c_int
    return fn


_fstatfs = _load_fstatfs()
#: ``st_dev`` -> whether that device's filesystem is kept in memory.
_devices: dict[int, bool] = {}


def in_memory(dev: int) -> bool | None:
    """Whether device ``dev`` holds a tmpfs or ramfs; None until :func:`learn` saw it."""
    return _devices.get(dev)


def learn(fd: int) -> bool:
    """Find out, and remember for its device, whether open file ``fd`` is kept in memory."""
    dev = os.fstat(fd).st_dev
    buf = _StatFs()
    answer = (
        _fstatfs is not None
        and _fstatfs(fd, ctypes.byref(buf)) == 0
        and buf.f_type in _IN_MEMORY
    )
    if len(_devices) >= _MAX_DEVICES:
        _devices.clear()
    _devices[dev] = answer
    return answer


def forget() -> None:
    """Start from an empty table (tests)."""
    _devices.clear()
