"""Pick the Linux sandbox backend once per process (SANDBOX.md §0, §8).

``select_backend("auto")`` prefers bubblewrap when a usable system ``bwrap``
exists, else the Landlock launcher; when neither works it refuses (raises)
unless the operator explicitly allows unsandboxed execution. Probes run in
child processes and their results are cached for the life of the process.
"""

from __future__ import annotations

import sys
import threading

from exec_server.sandbox.errors import SandboxUnavailableError
from exec_server.sandbox.linux.base import LinuxBackend

__all__ = [
    "BACKEND_NAMES",
    "LinuxBackend",
    "SandboxUnavailableError",
    "probe_report",
    "select_backend",
]

BACKEND_NAMES = ("auto", "bwrap", "landlock")


#: Probe outcomes by backend name: the backend, or None and why not.
_found: dict[str, tuple[LinuxBackend | None, str]] = {}
#: Reentrant: the bwrap probe asks for the Landlock backend (its fallback).
_lock = threading.RLock()


def _probe_landlock() -> tuple[LinuxBackend | None, str]:
    from exec_server.sandbox.linux.landlock_backend import LandlockBackend
    from exec_server.sandbox.linux.probe import probe_landlock

    result = probe_landlock()
    if not result.usable:
        return None, result.reason
    return LandlockBackend(result.abi, mount_ns=result.mount_ns), ""


def _probe_bwrap() -> tuple[LinuxBackend | None, str]:
    from exec_server.sandbox.linux.bwrap import BwrapBackend
    from exec_server.sandbox.linux.probe import probe_bwrap

    landlock, _ = _probed("landlock")
    result = probe_bwrap()
    if not result.usable or result.info is None:
        return None, result.reason
    return BwrapBackend(result.info, fallback=landlock), ""


def _probed(name: str) -> tuple[LinuxBackend | None, str]:
    """Backend ``name`` (``bwrap`` or ``landlock``), probed on first use, cached per process."""
    with _lock:
        if name not in _found:
            if not sys.platform.startswith("linux"):
                _found[name] = None, f"{name} is Linux-only (platform {sys.platform})"
            else:
                _found[name] = _probe_bwrap() if name == "bwrap" else _probe_landlock()
        return _found[name]


def select_backend(backend: str = "auto", *,
                   allow_unsandboxed: bool = False) -> LinuxBackend | None:
    """Return the Linux backend to confine launches with.

    Args:
        backend: ``"auto"`` (bwrap if usable, else landlock), ``"bwrap"`` or ``"landlock"``.
        allow_unsandboxed: with ``"auto"``, return None instead of raising when
            nothing is usable (the caller then runs commands unconfined).

    Raises:
        SandboxUnavailableError: the requested backend (or, for ``auto``, every
            backend) is unusable; the message carries the probe's reason.
        ValueError: unknown backend name.
    """
    if backend in ("bwrap", "landlock"):
        found, reason = _probed(backend)
    elif backend == "auto":
        found, reason = _probed("bwrap")
        if found is None:
            landlock, ll_reason = _probed("landlock")
            found = landlock
            reason = f"bwrap: {reason}; landlock: {ll_reason}"
        if found is None and allow_unsandboxed:
            return None
    else:
        raise ValueError(f"unknown sandbox backend {backend!r} (expected one of "
                         f"{', '.join(BACKEND_NAMES)})")
    if found is None:
        raise SandboxUnavailableError(f"no usable Linux sandbox ({backend}): {reason}")
    return found


def probe_report() -> dict[str, object]:
    """Every backend's probe outcome, for diagnostics (``exec-server run --probe``)."""
    bw, bw_reason = _probed("bwrap")
    ll, ll_reason = _probed("landlock")
    return {
        "bwrap": bw.describe() if bw is not None else {"usable": False, "reason": bw_reason},
        "landlock": ll.describe() if ll is not None else {"usable": False, "reason": ll_reason},
    }
