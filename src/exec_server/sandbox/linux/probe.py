"""Start-up probes (SANDBOX.md §8), each in a child: the server never unshares or filters."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from exec_server.sandbox.linux import seccomp
from exec_server.sandbox.linux.base import LinuxBackend
from exec_server.sandbox.linux.bwrap import BwrapBackend
from exec_server.sandbox.linux.knobs import read_only_knobs
from exec_server.sandbox.linux.landlock_backend import LAUNCHER_PATH, LandlockBackend

__all__ = ["probe_bwrap", "probe_landlock"]

_TIMEOUT = 10.0
_USERNS_ERRORS = ("loopback: Failed RTM_NEWADDR", "loopback: Failed RTM_NEWLINK",
                  "setting up uid map: Permission denied",
                  "No permissions to create a new namespace")


def _run(argv: list[str]) -> tuple[int, bytes, bytes]:
    """Exit status, stdout and stderr of ``argv``; -1 and the error when it did not run."""
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=_TIMEOUT, check=False,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return -1, b"", str(exc).encode()
    return proc.returncode, proc.stdout, proc.stderr


def probe_landlock() -> tuple[LinuxBackend | None, str]:
    """The Landlock backend if ``launcher.py --probe`` finds Landlock and seccomp usable."""
    if not seccomp.supported():
        return None, f"no seccomp filter for architecture {os.uname().machine}"
    rc, out, err = _run([sys.executable, "-I", "-S", LAUNCHER_PATH, "--probe"])
    if rc == -1:
        return None, f"launcher probe failed: {err.decode()}"
    try:
        raw = json.loads(out.decode("utf-8", "replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = err.decode("utf-8", "replace").strip()[-300:]
        return None, f"launcher probe exited {rc}: {tail}"
    abi = int(raw.get("landlock_abi") or 0)
    if abi <= 0 or not raw.get("landlock"):
        return None, str(raw.get("landlock_error") or "Landlock is not available in this kernel")
    if not raw.get("seccomp"):
        return None, f"seccomp unavailable: {raw.get('seccomp_error')}"
    return LandlockBackend(abi, mount_ns=bool(raw.get("mount_ns"))), ""


def _find_bwrap() -> str | None:
    """A system bwrap on PATH (canonical path), never from a relative PATH entry."""
    search = os.environ.get("PATH", os.defpath)
    trusted = os.pathsep.join(p for p in search.split(os.pathsep) if os.path.isabs(p))
    found = shutil.which("bwrap", path=trusted)
    return os.path.realpath(found) if found else None


def _run_bwrap(path: str, args: list[str]) -> tuple[int, str]:
    rc, out, err = _run([path, *args])
    return rc, (out + err).decode("utf-8", "replace")


def probe_bwrap(fallback: LinuxBackend | None) -> tuple[LinuxBackend | None, str]:
    """The bwrap backend if it can create our namespaces; ``fallback`` serves launches whose
    writable roots hold the bwrap binary."""
    bwrap = _find_bwrap()
    if bwrap is None:
        return None, "bwrap not found on PATH"
    if not os.access(bwrap, os.X_OK):
        return None, f"{bwrap} is not executable"
    true = shutil.which("true", path="/usr/bin:/bin") or "/bin/true"
    base = ["--new-session", "--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev",
            "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-net"]
    tail = ["--cap-drop", "ALL", "--", true]
    knobs = [a for k in read_only_knobs(full_write=False, writable_roots=(), fresh_proc=True)
             for a in ("--ro-bind", k, k)]
    rc, err = _run_bwrap(bwrap, [*base, "--proc", "/proc", *knobs, *tail])
    proc_ok = rc == 0
    if not proc_ok:
        if any(s in err for s in _USERNS_ERRORS):
            return None, f"user namespaces unusable for bwrap: {err.strip()}"
        rc, err = _run_bwrap(bwrap, [*base, *tail])
        if rc != 0:
            return None, f"bwrap probe failed ({rc}): {err.strip()[-300:]}"
    _, help_text = _run_bwrap(bwrap, ["--help"])
    for needed in ("--seccomp", "--args"):  # --args: how the command's env travels
        if needed not in help_text:
            return None, f"{bwrap} lacks {needed}"
    rc, out = _run_bwrap(bwrap, ["--version"])
    version = out.split()[-1] if rc == 0 and out.strip() else ""
    backend = BwrapBackend(bwrap, proc=proc_ok, argv0="--argv0" in help_text, version=version,
                           fallback=fallback)
    return backend, ""
