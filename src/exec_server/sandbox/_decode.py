"""Wire sandbox structs → pieces of the internal policy model (shared by convert modules).

Private to the sandbox package: :mod:`exec_server.sandbox.convert` and
:mod:`exec_server.sandbox.fs_request` are the public entry points.
"""

from __future__ import annotations

import enum
import posixpath
from collections.abc import Sequence

import msgspec

from exec_server.exceptions import InvalidParamsError, params_error_text
from exec_server.protocol import sandbox_types as wire
from exec_server.protocol.paths import parse_wire_path
from exec_server.sandbox.policy import (
    Access,
    DangerFullAccess,
    ExternalSandbox,
    ExtraPermissions,
    FileSystemPolicy,
    FsEntry,
    FsKind,
    GlobTarget,
    LegacyPolicy,
    Network,
    PathTarget,
    ReadOnly,
    ReadOnlyAccess,
    SpecialKind,
    SpecialTarget,
    Target,
    WorkspaceWrite,
)

__all__ = [
    "LAUNCH_KEYS",
    "Generation",
    "convert_entries",
    "current_scope",
    "extra_permissions",
    "legacy_fs_policy",
    "legacy_policy_from_wire",
    "object_keys",
    "permissions_policy",
    "plain_path",
    "read_access",
]

LAUNCH_KEYS = frozenset(
    {"sandboxPreference", "policy", "fileSystemPolicy", "networkPolicy", "sandboxPolicyCwd"}
)


class Generation(enum.Enum):
    """Which client generation sent the sandbox object."""

    LEGACY = "legacy"
    CURRENT = "current"


# --- wire → domain pieces ---


def read_access(access: wire.ReadOnlyAccess) -> ReadOnlyAccess:
    if isinstance(access, wire.ReadOnlyAccessFull):
        return ReadOnlyAccess()
    return ReadOnlyAccess.restricted(
        access.readable_roots, include_platform_defaults=access.include_platform_defaults
    )


def legacy_policy_from_wire(policy: wire.SandboxPolicy) -> LegacyPolicy:
    """Legacy ``SandboxPolicy`` wire struct → :data:`LegacyPolicy`."""
    if isinstance(policy, wire.DangerFullAccessPolicy):
        return DangerFullAccess()
    if isinstance(policy, wire.ReadOnlyPolicy):
        return ReadOnly(read_access(policy.access), policy.network_access)
    if isinstance(policy, wire.ExternalSandboxPolicy):
        return ExternalSandbox(network_enabled=policy.network_access == "enabled")
    return WorkspaceWrite(
        writable_roots=tuple(policy.writable_roots),
        read_only_access=read_access(policy.read_only_access),
        network_access=policy.network_access,
        exclude_tmpdir_env_var=policy.exclude_tmpdir_env_var,
        exclude_slash_tmp=policy.exclude_slash_tmp,
    )


def _subpath(value: str | None, where: str) -> str | None:
    if value is None or value == "":
        return None
    if value.startswith("/") or "\x00" in value:
        raise InvalidParamsError(f"{where}: subpath must be a relative path")
    normal = posixpath.normpath(value)
    if normal == ".." or normal.startswith("../"):
        # Meant to name something inside each root (".git", ".codex"): "../.."
        # would grant, say, write access above every workspace root.
        raise InvalidParamsError(f"{where}: subpath must stay inside the root")
    return value


def _target(path: wire.FileSystemPath, where: str) -> Target:
    if isinstance(path, wire.FileSystemPathEntry):
        return PathTarget(str(path.path))
    if isinstance(path, wire.FileSystemGlobPath):
        if not path.pattern:
            raise InvalidParamsError(f"{where}.pattern: glob pattern must not be empty")
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


def convert_entries(
    entries: Sequence[wire.FileSystemSandboxEntry], where: str
) -> tuple[FsEntry, ...]:
    return tuple(
        FsEntry(
            _target(entry.path, f"{where}[{i}].path"),
            _ACCESS[entry.access],
            skip_if_missing=entry.missing_path_behavior == "skip",
        )
        for i, entry in enumerate(entries)
    )


def legacy_fs_policy(policy: wire.FileSystemSandboxPolicy, where: str) -> FileSystemPolicy:
    if policy.kind == "unrestricted":
        return FileSystemPolicy.unrestricted()
    if policy.kind == "external-sandbox":
        return FileSystemPolicy.external()
    return FileSystemPolicy.restricted(convert_entries(policy.entries, f"{where}.entries"))


def extra_permissions(profile: wire.PermissionProfile | None) -> ExtraPermissions | None:
    if profile is None:
        return None
    fs = profile.file_system
    return ExtraPermissions(
        network_enabled=profile.network.enabled if profile.network is not None else None,
        network_present=profile.network is not None,
        read=tuple(fs.read) if fs is not None and fs.read is not None else None,
        write=tuple(fs.write) if fs is not None and fs.write is not None else None,
    )


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
        raise InvalidParamsError(
            "sandbox.permissions.file_system.glob_scan_max_depth: must be a positive integer"
        )
    entries = convert_entries(fs.entries, "sandbox.permissions.file_system.entries")
    policy = FileSystemPolicy(FsKind.RESTRICTED, entries, fs.glob_scan_max_depth)
    return policy, network


def current_scope(
    ctx: wire.CurrentSandboxContext, fallback_cwd: str
) -> tuple[str, tuple[str, ...]]:
    """Policy cwd and workspace roots (CLIENT_COMPAT.md §1.5)."""
    if ctx.policy_context is not None:
        cwd = ctx.policy_context.cwd or ctx.cwd
        roots = ctx.policy_context.workspace_roots or []
    else:
        cwd = ctx.cwd
        roots = ctx.workspace_roots
    return str(cwd) if cwd is not None else fallback_cwd, tuple(dict.fromkeys(map(str, roots)))


def object_keys(raw: msgspec.Raw, field: str) -> dict[str, msgspec.Raw] | None:
    try:
        obj = msgspec.json.decode(raw, type=dict[str, msgspec.Raw] | None)
    except msgspec.ValidationError as exc:
        raise InvalidParamsError(f"{field}: {params_error_text(str(exc))}") from exc
    except msgspec.DecodeError as exc:
        raise InvalidParamsError(f"{field}: {exc}") from exc
    return obj


def plain_path(value: str, field: str) -> str:
    try:
        return parse_wire_path(value).path
    except InvalidParamsError as exc:
        raise InvalidParamsError(f"{field}: {exc.message}") from exc
