"""The contract between policy and mechanism: backends and the fs helper only see a resolved
``SandboxPlan`` (absolute paths); they never decide what is allowed."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["SandboxPlan", "SandboxType"]


class SandboxType(enum.Enum):
    """Sandbox applied to a launch (PROTOCOL.md §6.6): ``value`` legacy wire, ``camel`` current."""

    NONE = "none"
    LINUX_SECCOMP = "linux-seccomp"
    MACOS_SEATBELT = "macos-seatbelt"
    WINDOWS_RESTRICTED_TOKEN = "windows-restricted-token"

    @property
    def camel(self) -> str:
        head, *rest = self.value.split("-")
        return head + "".join(part.capitalize() for part in rest)


@dataclass(frozen=True, slots=True)
class SandboxPlan:
    """What one confined process may do. Roots are recursive; ``read_only_subpaths`` (may
    not exist yet) and ``denied_paths`` are carved out of them."""

    full_read: bool
    full_write: bool
    network: bool
    cwd: str
    readable_roots: tuple[str, ...] = ()
    writable_roots: tuple[str, ...] = ()
    read_only_subpaths: tuple[str, ...] = ()
    denied_paths: tuple[str, ...] = ()
