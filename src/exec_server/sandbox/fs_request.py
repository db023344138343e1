"""A decoded ``fs/*`` sandbox context (``convert.fs_context``): route (PROTOCOL.md §9.1),
server-side pre-check (§10.2-§10.3) and the helper's plan (§10.4)."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from exec_server.sandbox.access import PROTECTED_NAMES_ALWAYS, ResolvedPolicy
from exec_server.sandbox.plan import SandboxPlan
from exec_server.sandbox.platform import platform_default_read_roots
from exec_server.sandbox.policy import (
    Access,
    FileSystemPolicy,
    FsProbe,
    Generation,
    Network,
    OsProbe,
    PolicyScope,
    normalize,
)

__all__ = ["FsSandboxRequest", "root_alias_normalize"]


def _symlink_preserving_canonical(path: str) -> str:
    parts = [p for p in path.split("/") if p]
    for i in range(2, len(parts) + 1):
        if os.path.islink("/" + "/".join(parts[:i])):
            return path
    return os.path.realpath(path)


class _Canonical:
    """"Resolve existing prefix" (PROTOCOL.md §10.3), memoised per component: one ``lstat``
    each, ``realpath`` only for symlinks (dangling: missing, re-appended lexically)."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: dict[str, str] = {"/": "/"}

    def __call__(self, path: str) -> str:
        seen = self._seen
        found = seen.get(path)
        if found is not None:
            return found
        if not path.startswith("/"):
            return path
        names: list[str] = []
        lexical = path
        base = None
        while base is None:
            lexical, name = os.path.split(lexical)
            names.append(name)
            base = seen.get(lexical)
        missing = False
        for name in reversed(names):
            lexical = os.path.join(lexical, name)
            child = os.path.join(base, name)
            if not missing:
                try:
                    st = os.lstat(child)
                except OSError:
                    missing = True
                else:
                    if stat.S_ISLNK(st.st_mode):
                        if os.path.exists(child):
                            child = os.path.realpath(child)
                        else:
                            missing = True
            seen[lexical] = base = child
        return base


def root_alias_normalize(path: str) -> str:
    """Resolve top-level system aliases (``/var`` → ``/private/var``) only (PROTOCOL.md §10.1)."""
    current = path
    while True:
        if os.path.lexists(current):
            canonical = _symlink_preserving_canonical(current)
            if canonical != current:
                rest = path[len(current) :] if current != "/" else path[1:]
                return normalize(canonical + "/" + rest.lstrip("/"))
        if current == "/":
            return path
        current = os.path.dirname(current)


@dataclass(frozen=True)
class FsSandboxRequest:
    """A decoded ``fs/*`` sandbox context. ``direct``: run in the server, else in the confined
    helper. ``policy`` drives the pre-check, ``helper_policy`` confines the helper (default
    reads on, extra grants merged); the helper never gets network."""

    generation: Generation
    direct: bool
    cwd: str
    roots: tuple[str, ...]
    policy: FileSystemPolicy
    network: Network
    helper_policy: FileSystemPolicy
    tmpdir: str | None = None
    home: str | None = None
    probe: FsProbe = field(default_factory=OsProbe, compare=False, repr=False)
    #: one canonicaliser for the pre-check and the helper plan (shared memo).
    _canonical: Callable[[str], str] = field(default_factory=_Canonical, init=False,
                                             compare=False, repr=False)

    @property
    def scope(self) -> PolicyScope:
        return PolicyScope(cwd=self.cwd, roots=self.roots, tmpdir=self.tmpdir, home=self.home)

    @cached_property
    def resolved(self) -> ResolvedPolicy:
        """Request policy pinned to paths (current contexts: docs/sandbox-policy.md)."""
        return self._resolve(self.policy, default_read_roots=platform_default_read_roots())

    def _resolve(self, policy: FileSystemPolicy, *,
                 default_read_roots: Sequence[str] = ()) -> ResolvedPolicy:
        if self.generation is not Generation.CURRENT:
            return ResolvedPolicy(policy, self.scope, probe=self.probe)
        return ResolvedPolicy(policy, self.scope, probe=self.probe, canonicalize=self._canonical,
                              protect_names=PROTECTED_NAMES_ALWAYS,
                              default_read_roots=default_read_roots)

    def resolve_access(self, path: str) -> Access:
        return self.resolved.resolve_access(path)

    def can_write(self, path: str) -> bool:
        return self.resolve_access(path) is Access.WRITE

    def copy_conflict(self, source: str, destination: str) -> str | None:
        """The first path a recursive ``fs/copy`` would write that the pre-check refuses: each
        non-writable rule below ``destination`` looked up in ``source`` (no walk)."""
        for hole, rel in self.resolved.holes_below(destination):
            if os.path.lexists(os.path.join(source, rel)):
                return hole
        return None

    def helper_plan(self, *, runtime_read_roots: Sequence[str] = (),
                    platform_defaults: Sequence[str] | None = None) -> SandboxPlan:
        """The helper's plan (§10.4), network off; ``runtime_read_roots``: its interpreter's."""
        defaults = platform_default_read_roots() if platform_defaults is None else platform_defaults
        # as the pre-check: the child too refuses creating a missing `.git` & co.
        return self._resolve(self.helper_policy).plan(
            Network.RESTRICTED, platform_defaults=defaults, extra_read_roots=runtime_read_roots)
