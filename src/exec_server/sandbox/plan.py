"""The contract between sandbox *policy* and sandbox *mechanism*.

``sandbox.policy`` (what may be accessed, both wire generations) resolves a
request's policy into a ``SandboxPlan``: absolute paths only, nothing left to
interpret. Backends (``sandbox.linux.*``, ``sandbox.macos.*``) and the
sandboxed filesystem helper only ever see a plan; they never decide what is
allowed. Pure data: no OS calls here.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["SandboxPlan", "SandboxType"]


class SandboxType(enum.Enum):
    """The sandbox actually applied to a launch (PROTOCOL.md §6.6).

    ``value`` is the legacy kebab-case wire value; ``camel`` the current client's.
    """

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
    """What one confined process may do, fully resolved.

    Attributes:
        full_read: the whole filesystem is readable (``readable_roots`` ignored).
        readable_roots: absolute roots readable (recursively) when not ``full_read``;
            already includes platform defaults when the policy asked for them.
        full_write: the whole filesystem is writable (no write confinement).
        writable_roots: absolute roots writable (recursively; implies read).
        read_only_subpaths: absolute paths inside writable roots that must stay
            read-only (protected ``.git``/``.codex``/``.agents`` and explicit
            read-only carve-outs). May not exist yet.
        denied_paths: absolute paths with access ``none`` (unreadable and
            unwritable) carved out of readable/writable roots.
        network: outbound network allowed.
        cwd: the policy cwd the plan was resolved against.
    """

    full_read: bool
    full_write: bool
    network: bool
    cwd: str
    readable_roots: tuple[str, ...] = ()
    writable_roots: tuple[str, ...] = ()
    read_only_subpaths: tuple[str, ...] = ()
    denied_paths: tuple[str, ...] = ()

    @property
    def unrestricted(self) -> bool:
        """True when nothing needs confining (full read, full write, network)."""
        return self.full_read and self.full_write and self.network and not self.denied_paths
