"""The decoded ``sandbox`` member → the internal policy model (both generations), for
``process/start``, ``fs/*`` and ``exec-server run``. What the wire structs cannot refuse
raises :class:`SandboxPolicyError` naming the field (-32602)."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import msgspec

from exec_server.errno_text import os_error_text
from exec_server.protocol.types import sandbox as wire
from exec_server.sandbox.access import (
    ResolvedPolicy,
    has_full_disk_read,
    has_full_disk_write,
)
from exec_server.sandbox.errors import SandboxError, SandboxPolicyError
from exec_server.sandbox.fs_request import FsSandboxRequest, root_alias_normalize
from exec_server.sandbox.plan import SandboxPlan, SandboxType
from exec_server.sandbox.policy import (
    Access,
    FileSystemPolicy,
    FsEntry,
    FsKind,
    FsProbe,
    Generation,
    GlobTarget,
    LegacyPolicy,
    Network,
    OsProbe,
    PathTarget,
    PolicyScope,
    SpecialKind,
    SpecialTarget,
    Target,
    effective_fs_policy,
    effective_network,
    fs_policy_from_legacy,
    helper_legacy_policy,
    legacy_network,
    normalize,
)

__all__ = [
    "FsSandboxRequest", "Generation", "LaunchSandboxRequest", "Preference", "cli_launch_request",
    "fs_context", "launch_request", "root_alias_normalize",
]

Preference = Literal["auto", "require", "forbid"]


@dataclass(frozen=True, slots=True)
class LaunchSandboxRequest:
    """How one ``process/start`` asks to be confined (``generation`` None: no sandbox member;
    ``forced_type``: an older member's pre-selected type, §6.7)."""

    generation: Generation | None
    fs_policy: FileSystemPolicy
    network: Network
    cwd: str
    roots: tuple[str, ...]
    preference: Preference = "auto"
    forced_type: SandboxType | None = None
    enforce_managed_network: bool = False
    home: str | None = None
    probe: FsProbe = field(default_factory=OsProbe, compare=False, repr=False)

    @property
    def needs_platform_sandbox(self) -> bool:
        """Whether ``auto`` selects the platform sandbox (PROTOCOL.md §7.2, CLIENT_COMPAT §1.6)."""
        if self.generation is None:
            return False
        if self.enforce_managed_network:
            return True
        if self.network is Network.RESTRICTED and (
            self.generation is Generation.CURRENT or self.fs_policy.kind is not FsKind.EXTERNAL
        ):
            return True
        return self.fs_policy.kind is FsKind.RESTRICTED and not has_full_disk_write(self.fs_policy)

    @property
    def network_restricted(self) -> bool:
        return self.network is Network.RESTRICTED or self.enforce_managed_network

    def plan(self, *, tmpdir: str | None, platform_defaults: Sequence[str] = ()) -> SandboxPlan:
        """The plan mechanisms enforce; ``tmpdir`` is the child's final ``$TMPDIR``."""
        network = Network.RESTRICTED if self.network_restricted else Network.ENABLED
        scope = PolicyScope(cwd=self.cwd, roots=self.roots, tmpdir=tmpdir, home=self.home)
        resolved = ResolvedPolicy(self.fs_policy, scope, probe=self.probe)
        return resolved.plan(network, platform_defaults=platform_defaults)


def launch_request(ctx: wire.SandboxContext | None, *, command_cwd: str,
                   enforce_managed_network: bool = False, tmpdir: str | None = None,
                   probe: FsProbe | None = None) -> LaunchSandboxRequest:
    """The confinement ``process/start`` asks for; ``command_cwd``: the default policy cwd."""
    probe = probe or OsProbe()
    if ctx is None:
        no_limits = FileSystemPolicy.unrestricted()
        return LaunchSandboxRequest(None, no_limits, Network.ENABLED, command_cwd, (command_cwd,))
    if isinstance(ctx, wire.CurrentSandboxContext):
        fs, network = permissions_policy(ctx.permissions)
        cwd, roots, home = current_scope(ctx, command_cwd)
        return LaunchSandboxRequest(
            Generation.CURRENT, fs, network, cwd, roots,
            enforce_managed_network=enforce_managed_network, home=home, probe=probe,
        )
    preference: Preference = "auto"
    forced: SandboxType | None = None
    enforce = False
    if isinstance(ctx, wire.FileSystemSandboxContext):
        # A filesystem context on process/start: derive what the client would have sent.
        cwd = command_cwd
        fs = fs_policy_from_legacy(ctx.sandbox_policy, PolicyScope.legacy(cwd, tmpdir), probe)
        network = legacy_network(ctx.sandbox_policy)
    else:
        cwd = str(ctx.sandbox_policy_cwd)
        fs = legacy_fs_policy(ctx.file_system_policy, "sandbox.fileSystemPolicy")
        network = Network(ctx.network_policy)
        preference = ctx.sandbox_preference or "auto"
        if ctx.sandbox_preference is None:
            forced = SandboxType(ctx.sandbox or "none")  # values are the wire spellings
        enforce = ctx.enforce_managed_network
    extra = ctx.additional_permissions
    return LaunchSandboxRequest(
        Generation.LEGACY, effective_fs_policy(fs, extra), effective_network(network, extra),
        cwd, (cwd,), preference=preference, forced_type=forced,
        enforce_managed_network=enforce, probe=probe,
    )


def fs_context(ctx: wire.SandboxContext | None, *, server_cwd: str | None = None,
               tmpdir: str | None = None, probe: FsProbe | None = None) -> FsSandboxRequest | None:
    """The confinement an ``fs/*`` call asks for, None without one. Looks at the filesystem
    (call it in a worker); defaults: the server's canonical cwd (§10.1) and ``$TMPDIR``."""
    if ctx is None:
        return None
    try:
        cwd = server_cwd if server_cwd is not None else os.path.realpath(os.getcwd())
    except OSError as exc:
        text = os_error_text(exc.errno) if exc.errno is not None else str(exc)
        raise SandboxError(f"failed to read current dir: {text}") from exc
    tmp = tmpdir if tmpdir is not None else os.environ.get("TMPDIR")
    probe = probe or OsProbe()
    if isinstance(ctx, wire.CurrentSandboxContext):
        fs, network = permissions_policy(ctx.permissions)
        policy_cwd, roots, home = current_scope(ctx, cwd)
        direct = fs.kind is not FsKind.RESTRICTED or has_full_disk_write(fs)
        return FsSandboxRequest(Generation.CURRENT, direct, policy_cwd, roots, fs, network,
                                _with_minimal(fs), tmpdir=tmp, home=home, probe=probe)
    base = ctx.sandbox_policy if isinstance(ctx, wire.FileSystemSandboxContext) else ctx.policy
    direct = not isinstance(base, wire.ReadOnlyPolicy | wire.WorkspaceWritePolicy)
    request = _alias_policy(base)
    scope = PolicyScope.legacy(cwd, tmp)
    # Helper grants: the context's filesystem grants, network stripped (§10.4 step 1).
    extra = ctx.additional_permissions
    helper_extra = msgspec.structs.replace(extra, network=None) if extra is not None else None
    helper = fs_policy_from_legacy(_alias_policy(helper_legacy_policy(base)), scope, probe)
    return FsSandboxRequest(
        Generation.LEGACY, direct, cwd, (cwd,), fs_policy_from_legacy(request, scope, probe),
        legacy_network(request), effective_fs_policy(helper, helper_extra), tmpdir=tmp,
        probe=probe,
    )


def _aliased(paths: Sequence[str]) -> list[wire.AbsPath]:
    return [wire.AbsPath(root_alias_normalize(path)) for path in paths]


def _alias_access(access: wire.ReadOnlyAccess) -> wire.ReadOnlyAccess:
    if isinstance(access, wire.ReadOnlyAccessFull):
        return access
    return msgspec.structs.replace(access, readable_roots=_aliased(access.readable_roots))


def _alias_policy(policy: LegacyPolicy) -> LegacyPolicy:
    if isinstance(policy, wire.ReadOnlyPolicy):
        return msgspec.structs.replace(policy, access=_alias_access(policy.access))
    if isinstance(policy, wire.WorkspaceWritePolicy):
        return msgspec.structs.replace(policy, writable_roots=_aliased(policy.writable_roots),
                                       read_only_access=_alias_access(policy.read_only_access))
    return policy


def _with_minimal(policy: FileSystemPolicy) -> FileSystemPolicy:
    """Platform-default reads for the helper when reads are restricted (§10.1 step 3)."""
    if policy.kind is not FsKind.RESTRICTED or has_full_disk_read(policy):
        return policy
    minimal = FsEntry(SpecialTarget(SpecialKind.MINIMAL), Access.READ)
    if minimal in policy.entries:
        return policy
    return replace(policy, entries=(*policy.entries, minimal))


def _subpath(value: str | None, where: str) -> str | None:
    if value is None or value == "":
        return None
    if value.startswith("/") or "\x00" in value:
        raise SandboxPolicyError(f"{where}: subpath must be a relative path")
    normal = posixpath.normpath(value)
    if normal == ".." or normal.startswith("../"):
        # Meant to name something inside each root (".git", ".codex"): "../.."
        # would grant, say, write access above every workspace root.
        raise SandboxPolicyError(f"{where}: subpath must stay inside the root")
    return value


def _target(path: wire.FileSystemPath, where: str) -> Target:
    if isinstance(path, wire.FileSystemPathEntry):
        return PathTarget(str(path.path))
    if isinstance(path, wire.FileSystemGlobPath):
        if not path.pattern:
            raise SandboxPolicyError(f"{where}.pattern: glob pattern must not be empty")
        return GlobTarget(path.pattern)
    value = path.value
    if isinstance(value, wire.SpecialProjectRoots):
        return SpecialTarget(
            SpecialKind.PROJECT_ROOTS, _subpath(value.subpath, f"{where}.value.subpath")
        )
    if isinstance(value, wire.SpecialUnknown):
        return SpecialTarget(SpecialKind.UNKNOWN, value.subpath)
    return SpecialTarget(SpecialKind(value.__struct_config__.tag))


_ACCESS = {"read": Access.READ, "write": Access.WRITE, "none": Access.NONE, "deny": Access.NONE}


def convert_entries(entries: Sequence[wire.FileSystemSandboxEntry],
                    where: str) -> tuple[FsEntry, ...]:
    return tuple(FsEntry(_target(entry.path, f"{where}[{i}].path"), _ACCESS[entry.access])
                 for i, entry in enumerate(entries))


def legacy_fs_policy(policy: wire.FileSystemSandboxPolicy, where: str) -> FileSystemPolicy:
    kind = FsKind(policy.kind)  # the same spellings
    if kind is not FsKind.RESTRICTED:
        return FileSystemPolicy(kind)
    return FileSystemPolicy.restricted(convert_entries(policy.entries, f"{where}.entries"))


def permissions_policy(perms: wire.Permissions) -> tuple[FileSystemPolicy, Network]:
    """Current ``permissions`` → (filesystem policy, network) (CLIENT_COMPAT.md §1.6)."""
    if isinstance(perms, wire.PermissionsDisabled):
        return FileSystemPolicy.unrestricted(), Network.ENABLED
    if isinstance(perms, wire.PermissionsExternal):
        return FileSystemPolicy.external(), Network(perms.network)
    network = Network(perms.network)
    fs = perms.file_system
    if isinstance(fs, wire.UnrestrictedFileSystem):
        return FileSystemPolicy.unrestricted(), network
    if fs.glob_scan_max_depth is not None and fs.glob_scan_max_depth < 1:
        raise SandboxPolicyError(
            "sandbox.permissions.file_system.glob_scan_max_depth: must be a positive integer"
        )
    entries = convert_entries(fs.entries, "sandbox.permissions.file_system.entries")
    policy = FileSystemPolicy(FsKind.RESTRICTED, entries, fs.glob_scan_max_depth)
    return policy, network


def current_scope(ctx: wire.CurrentSandboxContext,
                  fallback_cwd: str) -> tuple[str, tuple[str, ...], str | None]:
    """Policy cwd, workspace roots (CLIENT_COMPAT.md §1.5) and home."""
    if ctx.policy_context is not None:
        cwd = ctx.policy_context.cwd or ctx.cwd
        roots = ctx.policy_context.workspace_roots or []
    else:
        cwd = ctx.cwd
        roots = ctx.workspace_roots
    home = None if ctx.user_home_dir is None else str(ctx.user_home_dir)
    cwd_text = str(cwd) if cwd is not None else fallback_cwd
    return cwd_text, tuple(dict.fromkeys(map(str, roots))), home


def cli_launch_request(sandbox: str, *, cwd: str, writable_roots: Sequence[str] = (),
                       network: bool = False, tmpdir: str | None = None,
                       probe: FsProbe | None = None) -> LaunchSandboxRequest:
    """Policy for ``exec-server run --sandbox MODE [--writable-root DIR]... [--network]``."""
    probe = probe or OsProbe()
    if not cwd.startswith("/"):
        raise SandboxPolicyError(f"cwd must be absolute: {cwd}")
    cwd = normalize(cwd)
    roots: list[wire.AbsPath] = []
    for root in writable_roots:
        if not root.startswith("/"):
            raise SandboxPolicyError(f"--writable-root must be an absolute path: {root}")
        roots.append(wire.AbsPath(normalize(root)))
    policies: dict[str, LegacyPolicy] = {
        "read-only": wire.ReadOnlyPolicy(network_access=network),
        "workspace-write": wire.WorkspaceWritePolicy(writable_roots=roots, network_access=network),
        "danger-full-access": wire.DangerFullAccessPolicy(),
    }
    if sandbox not in policies:
        raise SandboxPolicyError(
            f"--sandbox: unknown mode {sandbox!r} "
            "(expected read-only, workspace-write or danger-full-access)"
        )
    if roots and sandbox != "workspace-write":
        raise SandboxPolicyError("--writable-root needs --sandbox workspace-write")
    policy = policies[sandbox]
    scope = PolicyScope.legacy(cwd, tmpdir)
    return LaunchSandboxRequest(
        Generation.LEGACY, fs_policy_from_legacy(policy, scope, probe), legacy_network(policy),
        cwd, (cwd,), probe=probe,
    )
