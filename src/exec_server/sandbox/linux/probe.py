"""Start-up probes: what this machine lets a sandbox do (SANDBOX.md §8 "Probes").

Every probe runs in a child process: the server itself never unshares,
restricts or filters anything.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

from exec_server.sandbox.linux import seccomp
from exec_server.sandbox.linux.bwrap import BwrapInfo
from exec_server.sandbox.linux.knobs import read_only_knobs
from exec_server.sandbox.linux.landlock_backend import LAUNCHER_PATH

__all__ = ["BwrapProbe", "LandlockProbe", "find_bwrap", "probe_bwrap", "probe_landlock"]

_TIMEOUT = 10.0
_USERNS_ERRORS = ("loopback: Failed RTM_NEWADDR", "loopback: Failed RTM_NEWLINK",
                  "setting up uid map: Permission denied",
                  "No permissions to create a new namespace")


@dataclass(frozen=True, slots=True)
class LandlockProbe:
    """Result of running the launcher's ``--probe`` mode."""

    usable: bool
    reason: str = ""
    abi: int = 0
    mount_ns: bool = False
    seccomp: bool = False
    raw: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BwrapProbe:
    """Result of probing a bubblewrap binary."""

    usable: bool
    reason: str = ""
    info: BwrapInfo | None = None


def probe_landlock(python: str | None = None) -> LandlockProbe:
    """Run ``launcher.py --probe`` in a child and interpret it."""
    if not seccomp.supported():
        return LandlockProbe(False, f"no seccomp filter for architecture {os.uname().machine}")
    try:
        proc = subprocess.run([python or sys.executable, "-I", "-S", LAUNCHER_PATH, "--probe"],
                              capture_output=True, timeout=_TIMEOUT, check=False,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return LandlockProbe(False, f"launcher probe failed: {exc}")
    try:
        raw = json.loads(proc.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = proc.stderr.decode("utf-8", "replace").strip()[-300:]
        return LandlockProbe(False, f"launcher probe exited {proc.returncode}: {tail}")
    abi = int(raw.get("landlock_abi") or 0)
    mount_ns = bool(raw.get("mount_ns"))
    sec = bool(raw.get("seccomp"))
    if abi <= 0 or not raw.get("landlock"):
        reason = str(raw.get("landlock_error") or "Landlock is not available in this kernel")
        return LandlockProbe(False, reason, abi, mount_ns, sec, raw)
    if not sec:
        return LandlockProbe(False, f"seccomp unavailable: {raw.get('seccomp_error')}", abi,
                             mount_ns, sec, raw)
    return LandlockProbe(True, "", abi, mount_ns, sec, raw)


def find_bwrap(path_env: str | None = None) -> str | None:
    """Locate a system bwrap on PATH (canonical path), never a relative PATH entry."""
    search = path_env if path_env is not None else os.environ.get("PATH", os.defpath)
    trusted = os.pathsep.join(p for p in search.split(os.pathsep) if os.path.isabs(p))
    found = shutil.which("bwrap", path=trusted)
    return os.path.realpath(found) if found else None


def _run_bwrap(path: str, args: list[str]) -> tuple[int, str]:
    """Exit status and output (stdout + stderr) of ``bwrap ARGS``; -1 when it did not run."""
    try:
        proc = subprocess.run([path, *args], capture_output=True, timeout=_TIMEOUT, check=False,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return -1, str(exc)
    return proc.returncode, (proc.stdout + proc.stderr).decode("utf-8", "replace")


def probe_bwrap(path: str | None = None) -> BwrapProbe:
    """Check that ``bwrap`` can create the namespaces we use (with and without /proc)."""
    bwrap = path or find_bwrap()
    if bwrap is None:
        return BwrapProbe(False, "bwrap not found on PATH")
    if not os.access(bwrap, os.X_OK):
        return BwrapProbe(False, f"{bwrap} is not executable")
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
            return BwrapProbe(False, f"user namespaces unusable for bwrap: {err.strip()}")
        rc, err = _run_bwrap(bwrap, [*base, *tail])
        if rc != 0:
            return BwrapProbe(False, f"bwrap probe failed ({rc}): {err.strip()[-300:]}")
    _, help_text = _run_bwrap(bwrap, ["--help"])
    for needed in ("--seccomp", "--args"):  # --args: how the command's env travels
        if needed not in help_text:
            return BwrapProbe(False, f"{bwrap} lacks {needed}")
    rc, out = _run_bwrap(bwrap, ["--version"])
    version = out.split()[-1] if rc == 0 and out.strip() else ""
    info = BwrapInfo(path=bwrap, proc=proc_ok, argv0="--argv0" in help_text, version=version)
    return BwrapProbe(True, "", info)
