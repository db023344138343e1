"""The one place that asks which OS we run on (STYLE.md §2.5).

Everything else in the sandbox package takes the answer as a value, so tests
can pretend to be macOS on Linux and vice versa.
"""

from __future__ import annotations

import sys
from typing import Final

from exec_server.sandbox.access import LINUX_PLATFORM_DEFAULTS
from exec_server.sandbox.plan import SandboxType

__all__ = ["PLATFORM_SANDBOX", "platform_default_read_roots", "platform_sandbox_type"]


def platform_sandbox_type(platform: str = sys.platform) -> SandboxType:
    """The platform sandbox (PROTOCOL.md §7.1).

    Windows gets ``none``: this server does not apply restricted tokens, and
    upstream spawns the command unchanged there anyway (§7.4).
    """
    if platform == "darwin":
        return SandboxType.MACOS_SEATBELT
    if platform.startswith("linux"):
        return SandboxType.LINUX_SECCOMP
    return SandboxType.NONE


#: Chosen once at import.
PLATFORM_SANDBOX: Final = platform_sandbox_type()


def platform_default_read_roots(sandbox: SandboxType = PLATFORM_SANDBOX) -> tuple[str, ...]:
    """Concrete default read roots for ``minimal`` entries.

    Only Linux needs paths: Seatbelt carries its own platform-default rules
    in the profile text (SANDBOX.md §4).
    """
    if sandbox is SandboxType.LINUX_SECCOMP:
        return LINUX_PLATFORM_DEFAULTS
    return ()
