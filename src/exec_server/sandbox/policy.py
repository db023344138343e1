"""One sandbox policy model for both wire generations (pure data): legacy ``SandboxPolicy``
(PROTOCOL.md §6.1) and current permission entries (CLIENT_COMPAT.md §1.4) both become a
:class:`FileSystemPolicy` and a :class:`Network`; only an :class:`FsProbe` looks at disk."""

from __future__ import annotations

import enum
import os
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Protocol

import msgspec

from exec_server.protocol.paths import normalize_lexical
from exec_server.protocol.types import sandbox as wire

__all__ = [
    "Access", "FileSystemPolicy", "FsEntry", "FsKind", "FsProbe", "Generation", "GlobTarget",
    "LegacyPolicy", "Network", "OsProbe", "PathTarget", "PolicyScope", "SpecialKind",
    "SpecialTarget", "Target", "WritableRoot", "base_fs_policy_from_legacy", "effective_fs_policy",
    "effective_network", "fs_policy_from_legacy", "helper_legacy_policy", "is_within",
    "join_normalized", "legacy_network", "legacy_writable_roots", "protected_subpaths",
]


class Generation(enum.Enum):
    """Which client generation sent the sandbox object."""

    LEGACY = "legacy"
    CURRENT = "current"


class Access(enum.Enum):
    """What an entry grants. ``write`` implies read; ``none`` denies both."""

    NONE = "none"
    READ = "read"
    WRITE = "write"

    @property
    def precedence(self) -> int:
        """Tie-break between equally specific entries: none > write > read (§6.2)."""
        return _PRECEDENCE[self]


_PRECEDENCE = {Access.READ: 0, Access.WRITE: 1, Access.NONE: 2}


class FsKind(enum.Enum):
    """Filesystem policy kind; only ``restricted`` looks at entries."""

    RESTRICTED = "restricted"
    UNRESTRICTED = "unrestricted"
    EXTERNAL = "external-sandbox"


class Network(enum.Enum):
    RESTRICTED = "restricted"
    ENABLED = "enabled"


class SpecialKind(enum.Enum):
    """Special paths (PROTOCOL.md §6.2); values are the wire spellings."""

    ROOT = "root"
    MINIMAL = "minimal"
    CURRENT_WORKING_DIRECTORY = "current_working_directory"
    PROJECT_ROOTS = "project_roots"
    TMPDIR = "tmpdir"
    SLASH_TMP = "slash_tmp"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class PathTarget:
    path: str


@dataclass(frozen=True, slots=True)
class SpecialTarget:
    kind: SpecialKind
    subpath: str | None = None


@dataclass(frozen=True, slots=True)
class GlobTarget:
    pattern: str


Target = PathTarget | SpecialTarget | GlobTarget


@dataclass(frozen=True, slots=True)
class FsEntry:
    target: Target
    access: Access


@dataclass(frozen=True, slots=True)
class FileSystemPolicy:
    """``FileSystemSandboxPolicy`` (PROTOCOL.md §6.2)."""

    kind: FsKind
    entries: tuple[FsEntry, ...] = ()
    glob_scan_max_depth: int | None = None

    @classmethod
    def unrestricted(cls) -> FileSystemPolicy:
        return cls(FsKind.UNRESTRICTED)

    @classmethod
    def external(cls) -> FileSystemPolicy:
        return cls(FsKind.EXTERNAL)

    @classmethod
    def restricted(cls, entries: Iterable[FsEntry]) -> FileSystemPolicy:
        return cls(FsKind.RESTRICTED, tuple(entries))


@dataclass(frozen=True, slots=True)
class PolicyScope:
    """What special paths resolve against: ``roots`` are what ``current_working_directory``
    and ``project_roots`` expand to (CLIENT_COMPAT §1.5), ``home`` is ``~`` in globs."""

    cwd: str
    roots: tuple[str, ...]
    tmpdir: str | None = None
    home: str | None = None

    @classmethod
    def legacy(cls, cwd: str, tmpdir: str | None) -> PolicyScope:
        return cls(cwd=cwd, roots=(cwd,), tmpdir=tmpdir)

    @property
    def effective_tmpdir(self) -> str | None:
        """``$TMPDIR`` if set, non-empty and absolute (PROTOCOL.md §6.2), normalised."""
        if self.tmpdir and self.tmpdir.startswith("/"):
            return normalize(self.tmpdir)
        return None


#: The legacy ``SandboxPolicy`` (PROTOCOL.md §6.1), as decoded.
LegacyPolicy = wire.SandboxPolicy


class FsProbe(Protocol):
    def is_dir(self, path: str) -> bool: ...

    def is_file(self, path: str) -> bool: ...

    def read_text(self, path: str) -> str | None: ...


class OsProbe:
    def is_dir(self, path: str) -> bool:
        return os.path.isdir(path)

    def is_file(self, path: str) -> bool:
        return os.path.isfile(path)

    def read_text(self, path: str) -> str | None:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                return fh.read(4096)
        except OSError:
            return None


#: Lexically normalise an absolute path (``..`` pops, PROTOCOL.md §5.2).
normalize = normalize_lexical


def join_normalized(base: str, rel: str | None) -> str:
    if not rel:
        return normalize(base)
    if rel.startswith("/"):
        return normalize(rel)
    return normalize(base + "/" + rel)


def is_within(path: str, root: str) -> bool:
    """Component-wise prefix: ``/a/b`` contains ``/a/b`` and ``/a/b/c``, not ``/a/bc``."""
    if root == "/":
        return path.startswith("/")
    return path == root or path.startswith(root + "/")


def depth(path: str) -> int:
    return 0 if path == "/" else path.count("/")


def _dedup(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def legacy_network(policy: LegacyPolicy) -> Network:
    """``enabled`` iff the legacy policy has full network access (PROTOCOL.md §6.3)."""
    if isinstance(policy, wire.DangerFullAccessPolicy):
        return Network.ENABLED
    if isinstance(policy, wire.ExternalSandboxPolicy):
        return Network(policy.network_access)
    return Network.ENABLED if policy.network_access else Network.RESTRICTED


def _special(kind: SpecialKind, access: Access) -> FsEntry:
    return FsEntry(SpecialTarget(kind), access)


def _read_entries(access: wire.ReadOnlyAccess, *, with_cwd: bool) -> list[FsEntry]:
    if isinstance(access, wire.ReadOnlyAccessFull):
        return [_special(SpecialKind.ROOT, Access.READ)]
    entries: list[FsEntry] = []
    if with_cwd:
        entries.append(_special(SpecialKind.CURRENT_WORKING_DIRECTORY, Access.READ))
    if access.include_platform_defaults:
        entries.append(_special(SpecialKind.MINIMAL, Access.READ))
    entries.extend(FsEntry(PathTarget(root), Access.READ) for root in access.readable_roots)
    return entries


def base_fs_policy_from_legacy(policy: LegacyPolicy) -> FileSystemPolicy:
    """The cwd-independent conversion of PROTOCOL.md §6.9."""
    if isinstance(policy, wire.DangerFullAccessPolicy):
        return FileSystemPolicy.unrestricted()
    if isinstance(policy, wire.ExternalSandboxPolicy):
        return FileSystemPolicy.external()
    if isinstance(policy, wire.ReadOnlyPolicy):
        return FileSystemPolicy.restricted(_read_entries(policy.access, with_cwd=True))
    entries = _read_entries(policy.read_only_access, with_cwd=False)
    entries.append(_special(SpecialKind.CURRENT_WORKING_DIRECTORY, Access.WRITE))
    if not policy.exclude_slash_tmp:
        entries.append(_special(SpecialKind.SLASH_TMP, Access.WRITE))
    if not policy.exclude_tmpdir_env_var:
        entries.append(_special(SpecialKind.TMPDIR, Access.WRITE))
    entries.extend(FsEntry(PathTarget(root), Access.WRITE) for root in policy.writable_roots)
    return FileSystemPolicy.restricted(entries)


def fs_policy_from_legacy(policy: LegacyPolicy, scope: PolicyScope,
                          probe: FsProbe) -> FileSystemPolicy:
    """``from_legacy_sandbox_policy`` (PROTOCOL.md §6.9): for workspace-write, readable
    roots already writable under a legacy writable root are dropped."""
    base = base_fs_policy_from_legacy(policy)
    if not isinstance(policy, wire.WorkspaceWritePolicy):
        return base
    roots = legacy_writable_roots(policy, scope, probe)

    def redundant(entry: FsEntry) -> bool:
        target = entry.target
        return (isinstance(target, PathTarget) and entry.access is Access.READ
                and any(root.allows_write(target.path) for root in roots))

    return replace(base, entries=tuple(e for e in base.entries if not redundant(e)))


@dataclass(frozen=True, slots=True)
class WritableRoot:
    """A writable root and the subpaths inside it that stay read-only."""

    root: str
    read_only_subpaths: tuple[str, ...] = ()

    def allows_write(self, path: str) -> bool:
        protected = any(is_within(path, sub) for sub in self.read_only_subpaths)
        return is_within(path, self.root) and not protected


#: Metadata directories kept read-only inside writable roots (PROTOCOL.md §6.10).
PROTECTED_NAMES = (".git", ".agents", ".codex")


def protected_subpaths(root: str, probe: FsProbe) -> tuple[str, ...]:
    """Read-only subpaths of one writable root (PROTOCOL.md §6.10): ``.git`` (and the target
    of a ``gitdir:`` pointer file) when it exists, ``.agents`` and ``.codex`` directories."""
    out: list[str] = []
    git = join_normalized(root, ".git")
    if probe.is_dir(git):
        out.append(git)
    elif probe.is_file(git):
        out.append(git)
        first = ((probe.read_text(git) or "").strip().splitlines() or [""])[0]
        target = first[len("gitdir:") :].strip() if first.startswith("gitdir:") else ""
        gitdir = join_normalized(root, target)
        if target and (probe.is_dir(gitdir) or probe.is_file(gitdir)):
            out.append(gitdir)
    for name in PROTECTED_NAMES[1:]:
        path = join_normalized(root, name)
        if probe.is_dir(path):
            out.append(path)
    return tuple(out)


def legacy_writable_roots(policy: LegacyPolicy, scope: PolicyScope,
                          probe: FsProbe) -> list[WritableRoot]:
    """Writable roots of a workspace-write policy, in §6.10 order, with protections."""
    if not isinstance(policy, wire.WorkspaceWritePolicy):
        return []
    paths: list[str] = list(policy.writable_roots)
    paths.append(normalize(scope.cwd))
    if not policy.exclude_slash_tmp and probe.is_dir("/tmp"):
        paths.append("/tmp")
    tmpdir = scope.effective_tmpdir
    if not policy.exclude_tmpdir_env_var and tmpdir is not None:
        paths.append(tmpdir)
    return [WritableRoot(root, protected_subpaths(root, probe)) for root in _dedup(paths)]


def effective_fs_policy(policy: FileSystemPolicy,
                        extra: wire.PermissionProfile | None) -> FileSystemPolicy:
    """Append extra read/write grants to a restricted policy, skipping exact duplicates."""
    if extra is None or extra.file_system is None or policy.kind is not FsKind.RESTRICTED:
        return policy
    reads, writes = _dedup(extra.file_system.read or ()), _dedup(extra.file_system.write or ())
    if not reads and not writes:
        return policy
    entries = list(policy.entries)
    for access, paths in ((Access.READ, reads), (Access.WRITE, writes)):
        for path in paths:
            entry = FsEntry(PathTarget(path), access)
            if entry not in entries:
                entries.append(entry)
    return replace(policy, entries=tuple(entries))


def effective_network(network: Network, extra: wire.PermissionProfile | None) -> Network:
    """Network after additional permissions (PROTOCOL.md §6.12)."""
    granted = extra is not None and extra.network is not None and extra.network.enabled
    return Network.ENABLED if network is Network.ENABLED or granted else Network.RESTRICTED


def helper_legacy_policy(policy: LegacyPolicy) -> LegacyPolicy:
    """Force platform-default reads on for the fs helper (PROTOCOL.md §10.1 step 3)."""
    set_defaults = msgspec.structs.replace
    restricted = wire.ReadOnlyAccessRestricted
    if isinstance(policy, wire.ReadOnlyPolicy) and isinstance(policy.access, restricted):
        access = set_defaults(policy.access, include_platform_defaults=True)
        return set_defaults(policy, access=access)
    if isinstance(policy, wire.WorkspaceWritePolicy) and isinstance(policy.read_only_access,
                                                                    restricted):
        access = set_defaults(policy.read_only_access, include_platform_defaults=True)
        return set_defaults(policy, read_only_access=access)
    return policy
