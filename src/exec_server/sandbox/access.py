"""Access resolution (PROTOCOL.md §6.11) and policy → :class:`SandboxPlan`, both by one
rule: the most specific path wins, ties ``none`` > ``write`` > ``read``, no match ``none``."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Sequence

from exec_server.sandbox.globs import expand_glob
from exec_server.sandbox.plan import SandboxPlan
from exec_server.sandbox.policy import (
    Access,
    FileSystemPolicy,
    FsKind,
    FsProbe,
    GlobTarget,
    Network,
    OsProbe,
    PathTarget,
    PolicyScope,
    SpecialKind,
    SpecialTarget,
    Target,
    depth,
    is_within,
    join_normalized,
    protected_subpaths,
)

__all__ = [
    "LINUX_PLATFORM_DEFAULTS", "PROTECTED_NAMES_ALWAYS", "ResolvedPolicy", "has_full_disk_read",
    "has_full_disk_write", "includes_platform_defaults", "resolve_target",
]

logger = logging.getLogger("exec_server.sandbox")

#: Upstream's Linux platform-default read roots (SANDBOX.md §1.7); missing ones are dropped.
LINUX_PLATFORM_DEFAULTS = (
    "/bin", "/sbin", "/usr", "/etc", "/lib", "/lib64", "/nix/store", "/run/current-system/sw",
)

#: Kept read-only under every writable root of a current fs context even when missing
#: (CLIENT_COMPAT.md): a planted ``.git/config`` or hook runs when git next runs unsandboxed.
PROTECTED_NAMES_ALWAYS = (".git", ".codex", ".agents", ".aws")


def resolve_target(target: Target, scope: PolicyScope, probe: FsProbe) -> tuple[str, ...]:
    """Absolute paths a target names (§6.11 step 3); ``minimal``, ``unknown``, globs: none."""
    if isinstance(target, PathTarget):
        return (target.path,)
    if isinstance(target, GlobTarget):
        return ()
    kind = target.kind
    if kind is SpecialKind.ROOT:
        return ("/",)
    if kind in (SpecialKind.CURRENT_WORKING_DIRECTORY, SpecialKind.PROJECT_ROOTS):
        return tuple(dict.fromkeys(join_normalized(r, target.subpath) for r in scope.roots))
    if kind is SpecialKind.TMPDIR:
        tmpdir = scope.effective_tmpdir
        return (tmpdir,) if tmpdir is not None else ()
    if kind is SpecialKind.SLASH_TMP:
        return ("/tmp",) if probe.is_dir("/tmp") else ()
    return ()


def _merge(rules: Iterable[tuple[str, Access]]) -> dict[str, Access]:
    """One access per path: the highest precedence."""
    merged: dict[str, Access] = {}
    for path, access in rules:
        old = merged.get(path)
        if old is None or access.precedence > old.precedence:
            merged[path] = access
    return merged


class _RuleIndex:
    """Rules by path: a look-up walks the path's ancestors, not the (maybe 3,000) rules."""

    def __init__(self, rules: Iterable[tuple[str, Access]]) -> None:
        self._by_path = _merge(rules)

    def best(self, path: str, *, above: bool = False) -> Access | None:
        """Access for ``path``; ``above``: what its parents grant, ignoring its own rules."""
        if not path.startswith("/"):
            return None
        by_path = self._by_path
        current = path
        if above:
            if current == "/":
                return None
            current = current.rsplit("/", 1)[0] or "/"
        while True:
            access = by_path.get(current)
            if access is not None:
                return access
            if current == "/":
                return None
            current = current.rsplit("/", 1)[0] or "/"


def has_full_disk_read(policy: FileSystemPolicy) -> bool:
    if policy.kind is not FsKind.RESTRICTED:
        return True
    entries = policy.entries
    root_reads = any(_is_special(e.target, SpecialKind.ROOT) and e.access is not Access.NONE
                     for e in entries)
    return root_reads and not any(e.access is Access.NONE for e in entries)


def has_full_disk_write(policy: FileSystemPolicy) -> bool:
    if policy.kind is not FsKind.RESTRICTED:
        return True
    entries = policy.entries
    if not any(_is_special(e.target, SpecialKind.ROOT) and e.access is Access.WRITE
               for e in entries):
        return False
    writes = {e.target for e in entries if e.access is Access.WRITE}
    for entry in entries:
        if entry.access is Access.WRITE or _is_special(entry.target, SpecialKind.MINIMAL):
            continue
        if _is_special(entry.target, SpecialKind.ROOT):
            if entry.access is Access.NONE:
                return False
            continue
        # A `none` entry always narrows: it beats `write` on equally specific ties (§6.2),
        # so "overridden by a write entry for the same target" only applies to reads.
        if entry.access is Access.NONE or entry.target not in writes:
            return False
    return True


def includes_platform_defaults(policy: FileSystemPolicy) -> bool:
    asks = any(_is_special(e.target, SpecialKind.MINIMAL) and e.access is not Access.NONE
               for e in policy.entries)
    return asks and policy.kind is FsKind.RESTRICTED and not has_full_disk_read(policy)


def _is_special(target: Target, kind: SpecialKind) -> bool:
    return isinstance(target, SpecialTarget) and target.kind is kind


class ResolvedPolicy:
    """A policy pinned to paths for one scope. ``protect``: writable roots' §6.10 subpaths
    read-only. ``canonicalize`` (current fs contexts): paths resolve like check paths (§10.3);
    ``write`` rules keep only the canonical form, ``read``/``none`` the lexical one too (fail
    closed). ``protect_names``: read-only even if missing. ``default_read_roots``: per ``minimal``.
    """

    __slots__ = (
        "_canonicalize", "_combined", "_defaults", "_index", "_index_with_defaults", "_probe",
        "full_read", "full_write", "platform_defaults", "policy", "protected", "rules", "scope",
    )

    def __init__(self, policy: FileSystemPolicy, scope: PolicyScope, *,
                 probe: FsProbe | None = None, protect: bool = True,
                 canonicalize: Callable[[str], str] | None = None,
                 protect_names: Sequence[str] = (), default_read_roots: Sequence[str] = ()) -> None:
        self._probe = probe = probe or OsProbe()
        self.policy = policy
        self.scope = scope
        self._canonicalize = canonicalize
        entries = policy.entries if policy.kind is FsKind.RESTRICTED else ()
        merged = _merge(
            (form, entry.access)
            for entry in entries
            for path in (_glob(entry.target, entry.access, policy, scope)
                         if isinstance(entry.target, GlobTarget)
                         else resolve_target(entry.target, scope, probe))
            for form in _forms(path, entry.access, canonicalize)
        )
        self.rules: tuple[tuple[str, Access], ...] = tuple(merged.items())
        self.full_read = has_full_disk_read(policy)
        self.full_write = has_full_disk_write(policy)
        self.platform_defaults = includes_platform_defaults(policy)
        protected: list[str] = []
        writable = [path for path, access in self.rules if access is Access.WRITE]
        for path in writable if protect and not self.full_write else ():
            base = path.rstrip("/")  # normalised: a plain join stays normalised
            subs = [*protected_subpaths(path, probe), *(f"{base}/{n}" for n in protect_names)]
            for sub in subs:
                protected.extend(_forms(sub, Access.READ, canonicalize))
        self.protected: tuple[str, ...] = tuple(dict.fromkeys(protected))
        # Protected subpaths rank as read entries at their path: an explicit
        # `write` or `none` at the same path still wins (none > write > read).
        combined = dict(merged)
        for path in self.protected:
            combined.setdefault(path, Access.READ)
        self._combined: tuple[tuple[str, Access], ...] = tuple(combined.items())
        defaults: dict[str, None] = {}
        if self.platform_defaults:
            for root in default_read_roots:
                if probe.is_dir(root):
                    defaults.update(dict.fromkeys(_forms(root, Access.READ, canonicalize)))
        self._defaults: tuple[tuple[str, Access], ...] = tuple((p, Access.READ) for p in defaults)
        self._index = _RuleIndex(self._combined)
        self._index_with_defaults = (
            _RuleIndex((*self._combined, *self._defaults)) if self._defaults else self._index
        )

    def resolve_access(self, path: str) -> Access:
        """Access for ``path`` (relative: joins the policy cwd); default read roots turn
        ``none`` into ``read``, never ``write`` into ``read``, and lose to an as-deep ``none``."""
        if self.policy.kind is not FsKind.RESTRICTED:
            return Access.WRITE
        candidate = self._candidate(join_normalized(self.scope.cwd, path))
        access = self._index.best(candidate)
        if self._defaults and access is not Access.WRITE:
            access = self._index_with_defaults.best(candidate)
        return access or Access.NONE

    def holes_below(self, path: str) -> tuple[tuple[str, str], ...]:
        """Non-writable rule paths strictly inside ``path``, shallow first: (absolute, relative)."""
        if self.policy.kind is not FsKind.RESTRICTED:
            return ()
        base = self._candidate(join_normalized(self.scope.cwd, path))
        skip = 1 if base == "/" else len(base) + 1
        holes = sorted((p for p, access in self._combined if access is not Access.WRITE),
                       key=lambda p: (depth(p), p))
        return tuple((p, p[skip:]) for p in holes if p != base and is_within(p, base))

    def _candidate(self, path: str) -> str:
        if self._canonicalize is None or path == "/":
            return path
        parent, name = os.path.split(path)
        return join_normalized(self._canonicalize(parent), name)

    def plan(self, network: Network, *, platform_defaults: Sequence[str] = (),
             extra_read_roots: Sequence[str] = ()) -> SandboxPlan:
        """What mechanisms enforce; existing ``platform_defaults`` join if ``minimal`` asks."""
        net = network is Network.ENABLED
        cwd = self.scope.cwd
        if self.policy.kind is not FsKind.RESTRICTED:
            return SandboxPlan(full_read=True, full_write=True, network=net, cwd=cwd)
        writable: list[str] = []
        read_only: list[str] = []
        readable: list[str] = []
        denied: list[str] = []
        for path, access in sorted(self._combined, key=lambda r: (depth(r[0]), r[0])):
            context = self._index.best(path, above=True) or Access.NONE
            if access is Access.WRITE:
                if context is not Access.WRITE:
                    writable.append(path)
            elif access is Access.READ:
                if context is Access.WRITE:
                    read_only.append(path)
                elif context is Access.NONE and not self.full_read:
                    readable.append(path)
            elif context is not Access.NONE:
                denied.append(path)
        if self.full_write:
            writable = []
        if not self.full_read:
            if self.platform_defaults:
                readable.extend(p for p in platform_defaults if self._probe.is_dir(p))
            readable.extend(extra_read_roots)
        return SandboxPlan(
            full_read=self.full_read,
            full_write=self.full_write,
            network=net,
            cwd=cwd,
            readable_roots=tuple(dict.fromkeys(readable)),
            writable_roots=tuple(writable),
            read_only_subpaths=tuple(sorted(dict.fromkeys(read_only), key=depth)),
            denied_paths=tuple(denied),
        )


def _forms(path: str, access: Access, canonicalize: Callable[[str], str] | None) -> tuple[str, ...]:
    if canonicalize is None:
        return (path,)
    canonical = canonicalize(path)
    if canonical == path or access is Access.WRITE:
        return (canonical,)
    return (path, canonical)


def _glob(target: GlobTarget, access: Access, policy: FileSystemPolicy,
          scope: PolicyScope) -> Sequence[str]:
    """Deny globs become the paths they match now; read/write globs grant nothing."""
    if access is not Access.NONE:
        logger.debug("glob grant %r ignored (grants nothing)", target.pattern)
        return ()
    return expand_glob(target.pattern, scope, max_depth=policy.glob_scan_max_depth)
