"""A decoded ``fs/*`` sandbox context: route, server-side check, helper plan.

Built from the wire by :func:`exec_server.sandbox.convert.fs_context`.

PROTOCOL.md §9.1 (routing), §10.1 (policies and cwd), §10.2-§10.3 (the
pre-check's access rule), §10.4 (the helper's confinement); CLIENT_COMPAT.md
§1.4-§1.6 and §6.5 for the current client's contexts.
"""

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
    """"Resolve existing prefix" (PROTOCOL.md §10.3), memoised component by component.

    The rule check paths are computed with: the deepest existing ancestor is
    canonicalised (every symlink followed), missing components are re-appended
    lexically (a dangling symlink counts as missing). One instance serves one
    request, so a policy's entries, its protected subpaths and the candidate's
    directory share their prefixes: one ``lstat`` per new component, a full
    ``realpath`` only for components that are symlinks.
    """

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
    """A decoded ``fs/*`` sandbox context.

    Attributes:
        generation: who asked.
        direct: run the operation in the server (full access, external,
            disabled); otherwise it needs the confined helper.
        cwd: policy cwd (legacy: the server's canonical cwd, §10.1).
        roots: workspace roots.
        policy: request filesystem policy: the server-side pre-check (§10.2).
        network: the request's network policy (informational: the helper never
            gets network).
        helper_policy: filesystem policy of the helper (platform-default reads
            on, additional filesystem grants merged; network grants stripped).
        tmpdir: ``$TMPDIR`` used for ``tmpdir`` entries (the server's).
    """

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

    @property
    def scope(self) -> PolicyScope:
        return PolicyScope(cwd=self.cwd, roots=self.roots, tmpdir=self.tmpdir, home=self.home)

    @cached_property
    def resolved(self) -> ResolvedPolicy:
        """Request policy pinned to paths, protected subpaths included.

        Current-client contexts resolve further than §6.11 (docs/sandbox-policy.md,
        "Pre-check for current contexts"); legacy ones keep PROTOCOL.md §10.
        """
        return self._resolve(self.policy, default_read_roots=platform_default_read_roots())

    def _resolve(
        self, policy: FileSystemPolicy, *, default_read_roots: Sequence[str] = ()
    ) -> ResolvedPolicy:
        if self.generation is Generation.CURRENT:
            return ResolvedPolicy(
                policy,
                self.scope,
                probe=self.probe,
                canonicalize=self._canonical,
                protect_names=PROTECTED_NAMES_ALWAYS,
                default_read_roots=default_read_roots,
            )
        return ResolvedPolicy(policy, self.scope, probe=self.probe)

    @cached_property
    def _canonical(self) -> Callable[[str], str]:
        """Canonicaliser shared by this request's pre-check and helper plan."""
        return _Canonical()

    def resolve_access(self, path: str) -> Access:
        """§6.11 for ``path`` (relative joins ``cwd``) with protected subpaths read-only."""
        return self.resolved.resolve_access(path)

    def can_write(self, path: str) -> bool:
        return self.resolve_access(path) is Access.WRITE

    def copy_conflict(self, source: str, destination: str) -> str | None:
        """The first path a recursive ``fs/copy`` would write that the pre-check refuses.

        ``fs/copy`` of a directory merges its entries into ``destination``: it
        writes ``destination/<rel>`` for every ``<rel>`` in the source tree. Only
        rules strictly below ``destination`` (read-only holes such as a missing
        ``.git`` of a writable root, ``none`` entries) can be hit, so each is
        looked up in the source (``lstat``-cheap, no walk). Both arguments are
        check paths (PROTOCOL.md §10.3). Returns None when nothing conflicts;
        the caller refuses the copy with ``NOT_PERMITTED`` for the returned path
        before anything is written.
        """
        for hole, rel in self.resolved.holes_below(destination):
            if os.path.lexists(os.path.join(source, rel)):
                return hole
        return None

    def helper_plan(
        self,
        *,
        runtime_read_roots: Sequence[str] = (),
        platform_defaults: Sequence[str] | None = None,
    ) -> SandboxPlan:
        """The helper's :class:`SandboxPlan` (§10.4): network always off.

        Args:
            runtime_read_roots: what the helper's interpreter must read when
                reads are restricted (``sys.prefix``, the package directory…).
            platform_defaults: override the platform's default read roots.
        """
        defaults = platform_default_read_roots() if platform_defaults is None else platform_defaults
        # Same resolution as the pre-check: for a current context the confined child's
        # guard then also refuses creating a missing `.git` & co. under a writable root.
        return self._resolve(self.helper_policy).plan(
            Network.RESTRICTED,
            platform_defaults=defaults,
            extra_read_roots=runtime_read_roots,
        )
