"""Access resolution (PROTOCOL.md §6.11) and policy → :class:`SandboxPlan`.

A :class:`FileSystemPolicy` names paths indirectly (``current_working_directory``,
``tmpdir``, …). :class:`ResolvedPolicy` pins every entry to concrete absolute
paths for one :class:`PolicyScope`, adds the protected subpaths of each
writable root (§6.10), and answers two questions:

* ``resolve_access(path)``: the server-side check for sandboxed fs calls
  (without ``protect``, exactly ``resolve_access_with_cwd`` of §6.11);
* ``plan(...)``: the fully resolved description mechanisms enforce.

Both use the same rule: the most specific matching path wins, ties broken
``none`` > ``write`` > ``read``, no match means ``none``.

Current-client fs contexts resolve a little further (docs/sandbox-policy.md,
"Pre-check for current contexts"): entry paths are canonicalised like check
paths, ``.git``/``.codex``/``.agents``/``.aws`` under every writable root are
read-only whether or not they exist, and a readable ``minimal`` entry makes
the platform-default read roots readable in ``resolve_access``.
"""

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
    "LINUX_PLATFORM_DEFAULTS",
    "PROTECTED_NAMES_ALWAYS",
    "ResolvedPolicy",
    "has_full_disk_read",
    "has_full_disk_write",
    "includes_platform_defaults",
    "resolve_target",
]

logger = logging.getLogger("exec_server.sandbox")

#: Upstream's Linux platform-default read roots (SANDBOX.md §1.7); missing ones are dropped.
LINUX_PLATFORM_DEFAULTS = (
    "/bin",
    "/sbin",
    "/usr",
    "/etc",
    "/lib",
    "/lib64",
    "/nix/store",
    "/run/current-system/sw",
)

#: Names kept read-only directly under every writable root of a current-client
#: fs context even when missing (CLIENT_COMPAT.md "Protected subpaths"): a
#: planted ``.git/config`` or hook runs the next time git runs unsandboxed.
PROTECTED_NAMES_ALWAYS = (".git", ".codex", ".agents", ".aws")


def resolve_target(target: Target, scope: PolicyScope, probe: FsProbe) -> tuple[str, ...]:
    """Concrete absolute paths an entry target names (§6.11 step 3, CLIENT_COMPAT §1.6).

    ``minimal``, ``unknown`` and globs name no concrete path.
    """
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


class _RuleIndex:
    """Rules by path, for look-ups that cost the depth of the path, not the rule count.

    The rule that decides a path is the deepest rule path containing it
    (component-wise), the highest precedence among rules at that same path:
    only one ancestor of a path exists at each depth, so walking the
    ancestors upwards and stopping at the first one with a rule finds it. (A
    scan of every rule per path made a plan of 3,000 entries cost 2 s.)
    """

    def __init__(self, rules: Iterable[tuple[str, Access]]) -> None:
        by_path: dict[str, Access] = {}
        for path, access in rules:
            old = by_path.get(path)
            if old is None or access.precedence > old.precedence:
                by_path[path] = access
        self._by_path = by_path

    def best(self, path: str, *, above: bool = False) -> Access | None:
        """The access the rules give ``path`` (absolute, normalised); with
        ``above``, ignoring rules at ``path`` itself (what its parents grant)."""
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


# --- predicates (§6.11 "Other predicates") ---


def has_full_disk_read(policy: FileSystemPolicy) -> bool:
    if policy.kind is not FsKind.RESTRICTED:
        return True
    root_reads = any(
        _is_special(e.target, SpecialKind.ROOT) and e.access is not Access.NONE
        for e in policy.entries
    )
    return root_reads and not any(e.access is Access.NONE for e in policy.entries)


def has_full_disk_write(policy: FileSystemPolicy) -> bool:
    if policy.kind is not FsKind.RESTRICTED:
        return True
    entries = policy.entries
    if not any(
        _is_special(e.target, SpecialKind.ROOT) and e.access is Access.WRITE for e in entries
    ):
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
    return (
        policy.kind is FsKind.RESTRICTED
        and not has_full_disk_read(policy)
        and any(
            _is_special(e.target, SpecialKind.MINIMAL) and e.access is not Access.NONE
            for e in policy.entries
        )
    )


def _is_special(target: Target, kind: SpecialKind) -> bool:
    return isinstance(target, SpecialTarget) and target.kind is kind


# --- resolved view ---


class ResolvedPolicy:
    """A filesystem policy pinned to concrete paths for one scope.

    Args:
        policy: the effective filesystem policy.
        scope: cwd, workspace roots, ``$TMPDIR``.
        probe: filesystem probe (protected subpaths and ``/tmp`` existence).
        protect: add the §6.10 protected subpaths of every writable root as
            read-only rules.
        canonicalize: resolve every entry path with this (the check-path rule,
            "resolve existing prefix", PROTOCOL.md §10.3) and, in
            :meth:`resolve_access`, the directory holding the candidate: a root
            or entry given through a symlink then grants what it names. ``write``
            rules keep only the canonical form (the link itself lives elsewhere);
            ``read`` and ``none`` rules keep the lexical form too (fail closed).
            None: paths are taken lexically, as §6.11 says.
        protect_names: names kept read-only directly under every writable root
            whether or not they exist (with ``protect``).
        default_read_roots: the platform's default read roots; readable in
            :meth:`resolve_access` (never writable, never in :meth:`plan`, which
            takes them separately) when the policy has a readable ``minimal``
            entry and reads are restricted. Missing ones are dropped.
    """

    __slots__ = (
        "_canonicalize",
        "_combined",
        "_defaults",
        "_index",
        "_index_with_defaults",
        "full_read",
        "full_write",
        "platform_defaults",
        "policy",
        "protected",
        "rules",
        "scope",
    )

    def __init__(
        self,
        policy: FileSystemPolicy,
        scope: PolicyScope,
        *,
        probe: FsProbe | None = None,
        protect: bool = True,
        canonicalize: Callable[[str], str] | None = None,
        protect_names: Sequence[str] = (),
        default_read_roots: Sequence[str] = (),
    ) -> None:
        probe = probe or OsProbe()
        self.policy = policy
        self.scope = scope
        self._canonicalize = canonicalize
        merged: dict[str, Access] = {}
        if policy.kind is FsKind.RESTRICTED:
            for entry in policy.entries:
                if isinstance(entry.target, GlobTarget):
                    paths: Sequence[str] = _glob(entry.target, entry.access, policy, scope)
                else:
                    paths = resolve_target(entry.target, scope, probe)
                for path in paths:
                    for form in _forms(path, entry.access, canonicalize):
                        old = merged.get(form)
                        if old is None or entry.access.precedence > old.precedence:
                            merged[form] = entry.access
        self.rules: tuple[tuple[str, Access], ...] = tuple(merged.items())
        self.full_read = has_full_disk_read(policy)
        self.full_write = has_full_disk_write(policy)
        self.platform_defaults = includes_platform_defaults(policy)
        protected: list[str] = []
        if protect and not self.full_write:
            for path, access in self.rules:
                if access is Access.WRITE:
                    base = path.rstrip("/")  # normalised: a plain join stays normalised
                    subs = [
                        *protected_subpaths(path, probe),
                        *(f"{base}/{name}" for name in protect_names),
                    ]
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
        """Access for ``path`` (relative paths join the policy cwd), §6.11 + protected subpaths.

        With ``canonicalize``, the directory holding ``path`` is canonicalised
        first (its final component is kept: a preserved symlink is judged where
        it really lives). Platform-default read roots (see the class) can turn
        ``none`` into ``read``, never ``write`` into ``read``; a deeper or
        equally deep ``none`` rule still wins over them.
        """
        if self.policy.kind is not FsKind.RESTRICTED:
            return Access.WRITE
        candidate = self._candidate(join_normalized(self.scope.cwd, path))
        access = self._index.best(candidate)
        if self._defaults and access is not Access.WRITE:
            access = self._index_with_defaults.best(candidate)
        return access or Access.NONE

    def holes_below(self, path: str) -> tuple[tuple[str, str], ...]:
        """Rule paths strictly inside ``path`` that are not writable, shallow first.

        Read-only holes (protected subpaths, ``read`` carve-outs) and ``none``
        entries: what writing a whole tree at ``path`` could run into. Each as
        ``(absolute path, path relative to path)``.
        """
        if self.policy.kind is not FsKind.RESTRICTED:
            return ()
        base = self._candidate(join_normalized(self.scope.cwd, path))
        skip = 1 if base == "/" else len(base) + 1
        holes = sorted(
            (p for p, access in self._combined if access is not Access.WRITE),
            key=lambda p: (depth(p), p),
        )
        return tuple((p, p[skip:]) for p in holes if p != base and is_within(p, base))

    def _candidate(self, path: str) -> str:
        if self._canonicalize is None or path == "/":
            return path
        parent, name = os.path.split(path)
        return join_normalized(self._canonicalize(parent), name)

    def can_read(self, path: str) -> bool:
        return self.resolve_access(path) is not Access.NONE

    def can_write(self, path: str) -> bool:
        return self.resolve_access(path) is Access.WRITE

    def _context_access(self, path: str) -> Access:
        """Access ``path`` would have without its own rules (what its parents grant)."""
        return self._index.best(path, above=True) or Access.NONE

    def plan(
        self,
        network: Network,
        *,
        platform_defaults: Sequence[str] = (),
        extra_read_roots: Sequence[str] = (),
        probe: FsProbe | None = None,
    ) -> SandboxPlan:
        """The :class:`SandboxPlan` mechanisms enforce.

        Args:
            network: effective network policy.
            platform_defaults: the platform's default read roots, added when the
                policy has a readable ``minimal`` entry and reads are restricted.
            extra_read_roots: additional read roots (e.g. the fs helper's runtime).
            probe: used to drop platform defaults that do not exist.
        """
        net = network is Network.ENABLED
        cwd = self.scope.cwd
        if self.policy.kind is not FsKind.RESTRICTED:
            return SandboxPlan(full_read=True, full_write=True, network=net, cwd=cwd)
        probe = probe or OsProbe()
        writable: list[str] = []
        read_only: list[str] = []
        readable: list[str] = []
        denied: list[str] = []
        for path, access in sorted(self._combined, key=lambda r: (depth(r[0]), r[0])):
            context = self._context_access(path)
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
                readable.extend(p for p in platform_defaults if probe.is_dir(p))
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
    """The rule paths one resolved entry path contributes (see ``ResolvedPolicy``)."""
    if canonicalize is None:
        return (path,)
    canonical = canonicalize(path)
    if canonical == path or access is Access.WRITE:
        return (canonical,)
    return (path, canonical)


def _glob(
    target: GlobTarget, access: Access, policy: FileSystemPolicy, scope: PolicyScope
) -> Sequence[str]:
    """Deny globs become the paths they match now; read/write globs grant nothing."""
    if access is not Access.NONE:
        logger.debug("glob grant %r ignored (grants nothing)", target.pattern)
        return ()
    return expand_glob(target.pattern, scope, max_depth=policy.glob_scan_max_depth)
