"""Pick the Linux sandbox backend, probed once per process (SANDBOX.md §0, §8): ``auto``
prefers a usable system ``bwrap``, else Landlock, else refuses unless unsandboxed is allowed."""

from __future__ import annotations

import sys
import threading

from exec_server.sandbox.errors import SandboxUnavailableError
from exec_server.sandbox.linux.base import LinuxBackend

__all__ = ["LinuxBackend", "SandboxUnavailableError", "probe_report", "select_backend"]

#: Probe outcomes by backend name: the backend, or None and why not.
_found: dict[str, tuple[LinuxBackend | None, str]] = {}
#: Reentrant: the bwrap probe asks for the Landlock backend (its fallback).
_lock = threading.RLock()


def _probed(name: str) -> tuple[LinuxBackend | None, str]:
    """Backend ``name`` (``bwrap`` or ``landlock``), probed on first use, cached per process."""
    with _lock:
        if name not in _found:
            if not sys.platform.startswith("linux"):
                _found[name] = None, f"{name} is Linux-only (platform {sys.platform})"
            elif name == "bwrap":
                from exec_server.sandbox.linux.probe import probe_bwrap

                _found[name] = probe_bwrap(fallback=_probed("landlock")[0])
            else:
                from exec_server.sandbox.linux.probe import probe_landlock

                _found[name] = probe_landlock()
        return _found[name]


def select_backend(backend: str = "auto", *,
                   allow_unsandboxed: bool = False) -> LinuxBackend | None:
    """The backend to confine launches with; ``allow_unsandboxed``: with ``auto``, None
    instead of SandboxUnavailableError when nothing is usable."""
    if backend in ("bwrap", "landlock"):
        found, reason = _probed(backend)
    elif backend == "auto":
        found, reason = _probed("bwrap")
        if found is None:
            found, ll_reason = _probed("landlock")
            reason = f"bwrap: {reason}; landlock: {ll_reason}"
        if found is None and allow_unsandboxed:
            return None
    else:
        raise ValueError(f"unknown sandbox backend {backend!r} (expected one of auto, bwrap, "
                         "landlock)")
    if found is None:
        raise SandboxUnavailableError(f"no usable Linux sandbox ({backend}): {reason}")
    return found


def probe_report() -> dict[str, object]:
    """Every backend's probe outcome, for diagnostics (``exec-server run --probe``)."""
    report: dict[str, object] = {}
    for name in ("bwrap", "landlock"):
        found, reason = _probed(name)
        report[name] = found.describe() if found else {"usable": False, "reason": reason}
    return report
