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


class _Probes:
    """Lazily computed, cached probe results (one per process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._landlock: LinuxBackend | None = None
        self._landlock_reason: str | None = None
        self._bwrap: LinuxBackend | None = None
        self._bwrap_reason: str | None = None

    def landlock(self) -> tuple[LinuxBackend | None, str]:
        with self._lock:
            if self._landlock is None and self._landlock_reason is None:
                if not sys.platform.startswith("linux"):
                    self._landlock_reason = f"Landlock is Linux-only (platform {sys.platform})"
                else:
                    from exec_server.sandbox.linux.landlock_backend import LandlockBackend
                    from exec_server.sandbox.linux.probe import probe_landlock

                    result = probe_landlock()
                    if result.usable:
                        self._landlock = LandlockBackend(result.abi, mount_ns=result.mount_ns)
                        self._landlock_reason = ""
                    else:
                        self._landlock_reason = result.reason
            return self._landlock, self._landlock_reason or ""

    def bwrap(self) -> tuple[LinuxBackend | None, str]:
        landlock, _ = self.landlock()
        with self._lock:
            if self._bwrap is None and self._bwrap_reason is None:
                if not sys.platform.startswith("linux"):
                    self._bwrap_reason = f"bubblewrap is Linux-only (platform {sys.platform})"
                else:
                    from exec_server.sandbox.linux.bwrap import BwrapBackend
                    from exec_server.sandbox.linux.probe import probe_bwrap

                    result = probe_bwrap()
                    if result.usable and result.info is not None:
                        self._bwrap = BwrapBackend(result.info, fallback=landlock)
                        self._bwrap_reason = ""
                    else:
                        self._bwrap_reason = result.reason
            return self._bwrap, self._bwrap_reason or ""


_probes = _Probes()


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
    if backend == "bwrap":
        found, reason = _probes.bwrap()
    elif backend == "landlock":
        found, reason = _probes.landlock()
    elif backend == "auto":
        found, reason = _probes.bwrap()
        if found is None:
            landlock, ll_reason = _probes.landlock()
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
    bw, bw_reason = _probes.bwrap()
    ll, ll_reason = _probes.landlock()
    return {
        "bwrap": bw.describe() if bw is not None else {"usable": False, "reason": bw_reason},
        "landlock": ll.describe() if ll is not None else {"usable": False, "reason": ll_reason},
    }
