"""The one place that asks which OS we run on (STYLE.md §2.5); the rest takes the answer
as a value, so tests can pretend to be another OS."""

from __future__ import annotations

import sys
from typing import Final

from exec_server.sandbox.access import LINUX_PLATFORM_DEFAULTS
from exec_server.sandbox.plan import SandboxType

__all__ = ["PLATFORM_SANDBOX", "platform_default_read_roots"]

#: PROTOCOL.md §7.1. Windows gets ``none``: no restricted tokens here, and upstream spawns
#: the command unchanged there anyway (§7.4).
PLATFORM_SANDBOX: Final = {"darwin": SandboxType.MACOS_SEATBELT,
                           "linux": SandboxType.LINUX_SECCOMP}.get(sys.platform, SandboxType.NONE)


def platform_default_read_roots(sandbox: SandboxType = PLATFORM_SANDBOX) -> tuple[str, ...]:
    """Default read roots for ``minimal`` entries (Seatbelt has its own rules, SANDBOX.md §4)."""
    return LINUX_PLATFORM_DEFAULTS if sandbox is SandboxType.LINUX_SECCOMP else ()
