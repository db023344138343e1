"""Wire sandbox objects → the internal policy model (both generations).

The only module of the sandbox package that sees wire structs. It tells the
shapes apart (CLIENT_COMPAT.md §1.2 rule 3), validates them, and produces:

* :class:`LaunchSandboxRequest` for ``process/start`` (what to confine, how
  strongly the client insists, which generation asked);
* :class:`FsSandboxRequest` for ``fs/*`` (direct or helper route, the
  server-side access check of PROTOCOL.md §10.2, the helper's plan §10.1/§10.4).

Every error is an :class:`InvalidParamsError` naming the offending field.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Literal

import msgspec

from exec_server.exceptions import InternalError, InvalidParamsError, os_error_message
from exec_server.protocol import sandbox_types as wire
from exec_server.protocol.paths import parse_wire_path
from exec_server.sandbox.access import (
    ResolvedPolicy,
    has_full_disk_read,
    has_full_disk_write,
    includes_platform_defaults,
)
from exec_server.sandbox.plan import SandboxPlan, SandboxType
from exec_server.sandbox.platform import platform_default_read_roots
from exec_server.sandbox.policy import (
    Access,
    DangerFullAccess,
    ExternalSandbox,
    ExtraPermissions,
    FileSystemPolicy,
    FsEntry,
    FsKind,
    FsProbe,
    GlobTarget,
    LegacyPolicy,
    Network,
    OsProbe,
    PathTarget,
    PolicyScope,
    ReadOnly,
    ReadOnlyAccess,
    SpecialKind,
    SpecialTarget,
    Target,
    WorkspaceWrite,
    effective_fs_policy,
    effective_legacy_policy,
    effective_network,
    fs_policy_from_legacy,
    helper_legacy_policy,
    legacy_network,
    normalize,
)

__all__ = [
    "FsRouteDecision",
    "FsSandboxRequest",
    "Generation",
    "LaunchSandboxRequest",
    "Preference",
    "cli_launch_request",
    "fs_context_from_wire",
    "fs_route_from_wire",
    "launch_request_from_wire",
    "legacy_policy_from_wire",
    "root_alias_normalize",
]

Preference = Literal["auto", "require", "forbid"]

_LAUNCH_KEYS = frozenset(
    {"sandboxPreference", "policy", "fileSystemPolicy", "networkPolicy", "sandboxPolicyCwd"}
)


class Generation(enum.Enum):
    """Which client generation sent the sandbox object."""

    LEGACY = "legacy"
    CURRENT = "current"


# --- wire → domain pieces ---


def _read_access(access: wire.ReadOnlyAccess) -> ReadOnlyAccess:
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
        return ReadOnly(_read_access(policy.access), policy.network_access)
    if isinstance(policy, wire.ExternalSandboxPolicy):
        return ExternalSandbox(network_enabled=policy.network_access == "enabled")
    return WorkspaceWrite(
        writable_roots=tuple(policy.writable_roots),
        read_only_access=_read_access(policy.read_only_access),
        network_access=policy.network_access,
        exclude_tmpdir_env_var=policy.exclude_tmpdir_env_var,
        exclude_slash_tmp=policy.exclude_slash_tmp,
    )


def _subpath(value: str | None, where: str) -> str | None:
    if value is None or value == "":
        return None
    if value.startswith("/") or "\x00" in value:
        raise InvalidParamsError(f"{where}: subpath must be a relative path")
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


def _entries(entries: Sequence[wire.FileSystemSandboxEntry], where: str) -> tuple[FsEntry, ...]:
    return tuple(
        FsEntry(
            _target(entry.path, f"{where}[{i}].path"),
            _ACCESS[entry.access],
            skip_if_missing=entry.missing_path_behavior == "skip",
        )
        for i, entry in enumerate(entries)
    )


def _legacy_fs_policy(policy: wire.FileSystemSandboxPolicy, where: str) -> FileSystemPolicy:
    if policy.kind == "unrestricted":
        return FileSystemPolicy.unrestricted()
    if policy.kind == "external-sandbox":
        return FileSystemPolicy.external()
    return FileSystemPolicy.restricted(_entries(policy.entries, f"{where}.entries"))


def _extra(profile: wire.PermissionProfile | None) -> ExtraPermissions | None:
    if profile is None:
        return None
    fs = profile.file_system
    return ExtraPermissions(
        network_enabled=profile.network.enabled if profile.network is not None else None,
        network_present=profile.network is not None,
        read=tuple(fs.read) if fs is not None and fs.read is not None else None,
        write=tuple(fs.write) if fs is not None and fs.write is not None else None,
    )


def _permissions(perms: wire.Permissions) -> tuple[FileSystemPolicy, Network]:
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
    entries = _entries(fs.entries, "sandbox.permissions.file_system.entries")
    policy = FileSystemPolicy(FsKind.RESTRICTED, entries, fs.glob_scan_max_depth)
    return policy, network


def _current_scope(
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


def _object_keys(raw: msgspec.Raw, field: str) -> dict[str, msgspec.Raw] | None:
    try:
        obj = msgspec.json.decode(raw, type=dict[str, msgspec.Raw] | None)
    except msgspec.ValidationError as exc:
        raise InvalidParamsError(f"{field}: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise InvalidParamsError(f"{field}: {exc}") from exc
    return obj


def _plain_path(value: str, field: str) -> str:
    try:
        return parse_wire_path(value).path
    except InvalidParamsError as exc:
        raise InvalidParamsError(f"{field}: {exc.message}") from exc


# --- process/start ---


@dataclass(frozen=True, slots=True)
class LaunchSandboxRequest:
    """How one ``process/start`` asks to be confined, generation-independent.

    Attributes:
        generation: who asked; None when the request had no sandbox (run directly).
        preference: ``auto``/``require``/``forbid`` (§6.6); current clients mean ``auto``.
        forced_type: a pre-selected type (older ``sandbox`` member, §6.7 variant).
        fs_policy: effective filesystem policy (additional permissions merged).
        network: effective network policy.
        cwd: the policy cwd; ``roots``: workspace roots special paths expand to.
        legacy_policy: effective legacy policy (legacy generation only).
        enforce_managed_network: the client requires managed networking.
    """

    generation: Generation | None
    fs_policy: FileSystemPolicy
    network: Network
    cwd: str
    roots: tuple[str, ...]
    preference: Preference = "auto"
    forced_type: SandboxType | None = None
    legacy_policy: LegacyPolicy | None = None
    enforce_managed_network: bool = False
    home: str | None = None
    #: Protected-subpath probing and ``/tmp`` checks (tests inject fakes).
    probe: FsProbe = field(default_factory=OsProbe, compare=False, repr=False)

    @classmethod
    def unsandboxed(cls, cwd: str) -> LaunchSandboxRequest:
        """No sandbox object at all."""
        return cls(None, FileSystemPolicy.unrestricted(), Network.ENABLED, cwd, (cwd,))

    @property
    def needs_platform_sandbox(self) -> bool:
        """Whether ``auto`` selects the platform sandbox.

        Legacy: PROTOCOL.md §7.2. Current: CLIENT_COMPAT.md §1.6 (a restricted
        network needs confinement for every kind, external included).
        """
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

    def scope(self, tmpdir: str | None) -> PolicyScope:
        return PolicyScope(cwd=self.cwd, roots=self.roots, tmpdir=tmpdir, home=self.home)

    def resolved(self, tmpdir: str | None) -> ResolvedPolicy:
        return ResolvedPolicy(self.fs_policy, self.scope(tmpdir), probe=self.probe)

    def plan(
        self,
        *,
        tmpdir: str | None,
        platform_defaults: Sequence[str] | None = None,
    ) -> SandboxPlan:
        """The plan mechanisms enforce; ``tmpdir`` is the child's final ``$TMPDIR``."""
        defaults = platform_default_read_roots() if platform_defaults is None else platform_defaults
        network = Network.RESTRICTED if self.network_restricted else Network.ENABLED
        return self.resolved(tmpdir).plan(network, platform_defaults=defaults, probe=self.probe)

    @property
    def include_platform_defaults(self) -> bool:
        """The policy asks for platform-default reads (Seatbelt adds its own rules)."""
        return includes_platform_defaults(self.fs_policy)


_SANDBOX_TYPES = {t.value: t for t in SandboxType}


def launch_request_from_wire(
    raw: msgspec.Raw | None,
    *,
    command_cwd: str,
    enforce_managed_network: bool = False,
    tmpdir: str | None = None,
    probe: FsProbe | None = None,
) -> LaunchSandboxRequest:
    """Decode ``process/start.sandbox``.

    Args:
        raw: the raw member; None (absent) or JSON ``null`` mean no sandbox.
        command_cwd: the process cwd (default policy cwd for current contexts).
        enforce_managed_network: the current client's top-level
            ``enforceManagedNetwork`` (legacy configs carry their own).
        tmpdir: the child's ``$TMPDIR`` (for legacy ``sandboxPolicy`` objects).
        probe: filesystem probe (tests).

    Raises:
        InvalidParamsError: malformed object; the message names the field.
    """
    probe = probe or OsProbe()
    if raw is None:
        return LaunchSandboxRequest.unsandboxed(command_cwd)
    keys = _object_keys(raw, "sandbox")
    if keys is None:
        return LaunchSandboxRequest.unsandboxed(command_cwd)
    if "permissions" in keys:
        ctx = wire.decode_sandbox(raw, wire.CurrentSandboxContext)
        fs, network = _permissions(ctx.permissions)
        cwd, roots = _current_scope(ctx, command_cwd)
        return LaunchSandboxRequest(
            Generation.CURRENT,
            fs,
            network,
            cwd,
            roots,
            enforce_managed_network=enforce_managed_network,
            home=str(ctx.user_home_dir) if ctx.user_home_dir is not None else None,
            probe=probe,
        )
    if "sandboxPolicy" in keys and not (_LAUNCH_KEYS & keys.keys()):
        # A filesystem context on process/start: derive what the client would have sent.
        fctx = wire.decode_sandbox(raw, wire.FileSystemSandboxContext)
        extra = _extra(fctx.additional_permissions)
        base = legacy_policy_from_wire(fctx.sandbox_policy)
        scope = PolicyScope.legacy(command_cwd, tmpdir)
        return LaunchSandboxRequest(
            Generation.LEGACY,
            effective_fs_policy(fs_policy_from_legacy(base, scope, probe), extra),
            effective_network(legacy_network(base), extra),
            command_cwd,
            (command_cwd,),
            legacy_policy=effective_legacy_policy(base, extra),
            probe=probe,
        )
    if not (_LAUNCH_KEYS & keys.keys()):
        raise InvalidParamsError("sandbox: missing field `permissions`")
    config = wire.decode_sandbox(raw, wire.SandboxLaunchConfig)
    forced: SandboxType | None = None
    if config.sandbox_preference is None:
        if config.sandbox is None:
            raise InvalidParamsError("sandbox: missing field `sandboxPreference`")
        forced = _SANDBOX_TYPES[config.sandbox]
    cwd = _plain_path(config.sandbox_policy_cwd, "sandbox.sandboxPolicyCwd")
    extra = _extra(config.additional_permissions)
    fs = _legacy_fs_policy(config.file_system_policy, "sandbox.fileSystemPolicy")
    return LaunchSandboxRequest(
        Generation.LEGACY,
        effective_fs_policy(fs, extra),
        effective_network(Network(config.network_policy), extra),
        cwd,
        (cwd,),
        preference=config.sandbox_preference or "auto",
        forced_type=forced,
        legacy_policy=effective_legacy_policy(legacy_policy_from_wire(config.policy), extra),
        enforce_managed_network=config.enforce_managed_network,
        probe=probe,
    )


# --- fs/* ---


def _symlink_preserving_canonical(path: str) -> str:
    parts = [p for p in path.split("/") if p]
    for i in range(2, len(parts) + 1):
        if os.path.islink("/" + "/".join(parts[:i])):
            return path
    return os.path.realpath(path)


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


def _alias_access(access: ReadOnlyAccess) -> ReadOnlyAccess:
    if access.full:
        return access
    return replace(access, readable_roots=tuple(map(root_alias_normalize, access.readable_roots)))


def _alias_policy(policy: LegacyPolicy) -> LegacyPolicy:
    if isinstance(policy, ReadOnly):
        return replace(policy, access=_alias_access(policy.access))
    if isinstance(policy, WorkspaceWrite):
        return replace(
            policy,
            writable_roots=tuple(map(root_alias_normalize, policy.writable_roots)),
            read_only_access=_alias_access(policy.read_only_access),
        )
    return policy


def _with_minimal(policy: FileSystemPolicy) -> FileSystemPolicy:
    """Platform-default reads for the helper when reads are restricted (§10.1 step 3)."""
    if policy.kind is not FsKind.RESTRICTED or has_full_disk_read(policy):
        return policy
    minimal = FsEntry(SpecialTarget(SpecialKind.MINIMAL), Access.READ)
    if minimal in policy.entries:
        return policy
    return replace(policy, entries=(*policy.entries, minimal))


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
    legacy_policy: LegacyPolicy | None = None
    helper_legacy_policy: LegacyPolicy | None = None
    probe: FsProbe = field(default_factory=OsProbe, compare=False, repr=False)

    @property
    def scope(self) -> PolicyScope:
        return PolicyScope(cwd=self.cwd, roots=self.roots, tmpdir=self.tmpdir, home=self.home)

    @cached_property
    def resolved(self) -> ResolvedPolicy:
        """Request policy pinned to paths, protected subpaths included."""
        return ResolvedPolicy(self.policy, self.scope, probe=self.probe)

    def resolve_access(self, path: str) -> Access:
        """§6.11 for ``path`` (relative joins ``cwd``) with protected subpaths read-only."""
        return self.resolved.resolve_access(path)

    def can_read(self, path: str) -> bool:
        return self.resolve_access(path) is not Access.NONE

    def can_write(self, path: str) -> bool:
        return self.resolve_access(path) is Access.WRITE

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
        resolved = ResolvedPolicy(self.helper_policy, self.scope, probe=self.probe)
        return resolved.plan(
            Network.RESTRICTED,
            platform_defaults=defaults,
            extra_read_roots=runtime_read_roots,
            probe=self.probe,
        )


def _server_cwd() -> str:
    """The server's canonical cwd (PROTOCOL.md §10.1 step 1)."""
    try:
        return os.path.realpath(os.getcwd())
    except OSError as exc:
        raise InternalError(f"failed to read current dir: {os_error_message(exc)}") from exc


def fs_context_from_wire(
    raw: msgspec.Raw | None,
    *,
    server_cwd: str | None = None,
    tmpdir: str | None = None,
    probe: FsProbe | None = None,
) -> FsSandboxRequest | None:
    """Decode ``fs/*.sandbox``; None when absent or ``null`` (direct route).

    Args:
        raw: the raw member.
        server_cwd: the server's canonical cwd (default: ``realpath(getcwd())``).
        tmpdir: ``$TMPDIR`` that ``tmpdir`` entries mean (default: the server's).
        probe: filesystem probe (tests).

    Raises:
        InvalidParamsError: malformed object; the message names the field.
    """
    if raw is None:
        return None
    keys = _object_keys(raw, "sandbox")
    if keys is None:
        return None
    probe = probe or OsProbe()
    cwd = server_cwd if server_cwd is not None else _server_cwd()
    tmp = tmpdir if tmpdir is not None else os.environ.get("TMPDIR")
    if "permissions" in keys:
        return _current_fs_request(
            wire.decode_sandbox(raw, wire.CurrentSandboxContext), cwd, tmp, probe
        )
    if "sandboxPolicy" in keys:
        ctx = wire.decode_sandbox(raw, wire.FileSystemSandboxContext)
        policy, extra = ctx.sandbox_policy, _extra(ctx.additional_permissions)
    elif _LAUNCH_KEYS & keys.keys():
        launch = wire.decode_sandbox(raw, wire.SandboxLaunchConfig)
        policy, extra = launch.policy, _extra(launch.additional_permissions)
    else:
        raise InvalidParamsError("sandbox: missing field `permissions`")
    return _legacy_fs_request(legacy_policy_from_wire(policy), extra, cwd, tmp, probe)


@dataclass(frozen=True, slots=True)
class FsRouteDecision:
    """Where one ``fs/*`` call runs (duck-compatible with ``fs.service.FsRoute``).

    Attributes:
        confined: the call needs the sandboxed helper.
        context: the decoded :class:`FsSandboxRequest` (None when absent).
    """

    confined: bool
    context: FsSandboxRequest | None = None


def fs_route_from_wire(raw: bytes | msgspec.Raw | None) -> FsRouteDecision:
    """Route of an ``fs/*`` call from its raw ``sandbox`` member (PROTOCOL.md §9.1).

    Direct for absent/``null``, full access, external and disabled contexts;
    confined otherwise, carrying the decoded request.

    Raises:
        InvalidParamsError: malformed context; the message names the field.
    """
    request = fs_context_from_wire(None if raw is None else msgspec.Raw(raw))
    if request is None:
        return FsRouteDecision(confined=False)
    return FsRouteDecision(confined=not request.direct, context=request)


def _legacy_fs_request(
    base: LegacyPolicy,
    extra: ExtraPermissions | None,
    cwd: str,
    tmpdir: str | None,
    probe: FsProbe,
) -> FsSandboxRequest:
    """PROTOCOL.md §10.1 for a legacy ``sandboxPolicy``."""
    direct = not isinstance(base, ReadOnly | WorkspaceWrite)
    request = _alias_policy(base)
    helper = _alias_policy(helper_legacy_policy(base))
    scope = PolicyScope.legacy(cwd, tmpdir)
    request_fs = fs_policy_from_legacy(request, scope, probe)
    # Helper grants: the context's filesystem grants, network stripped (§10.4 step 1).
    helper_extra = (
        ExtraPermissions(read=extra.read, write=extra.write) if extra is not None else None
    )
    helper_fs = effective_fs_policy(fs_policy_from_legacy(helper, scope, probe), helper_extra)
    return FsSandboxRequest(
        Generation.LEGACY,
        direct,
        cwd,
        (cwd,),
        request_fs,
        legacy_network(request),
        helper_fs,
        tmpdir=tmpdir,
        legacy_policy=request,
        helper_legacy_policy=effective_legacy_policy(helper, helper_extra),
        probe=probe,
    )


def _current_fs_request(
    ctx: wire.CurrentSandboxContext, server_cwd: str, tmpdir: str | None, probe: FsProbe
) -> FsSandboxRequest:
    fs, network = _permissions(ctx.permissions)
    cwd, roots = _current_scope(ctx, server_cwd)
    direct = fs.kind is not FsKind.RESTRICTED or has_full_disk_write(fs)
    return FsSandboxRequest(
        Generation.CURRENT,
        direct,
        cwd,
        roots,
        fs,
        network,
        _with_minimal(fs),
        tmpdir=tmpdir,
        home=str(ctx.user_home_dir) if ctx.user_home_dir is not None else None,
        probe=probe,
    )


# --- CLI ---

CliSandbox = Literal["read-only", "workspace-write", "danger-full-access"]


def cli_launch_request(
    sandbox: str,
    *,
    cwd: str,
    writable_roots: Sequence[str] = (),
    network: bool = False,
    tmpdir: str | None = None,
    probe: FsProbe | None = None,
) -> LaunchSandboxRequest:
    """Policy for ``exec-server run --sandbox MODE [--writable-root DIR]... [--network]``.

    Preference is ``auto``: ``danger-full-access`` runs directly, the others
    need the platform sandbox.

    Raises:
        InvalidParamsError: unknown mode, relative ``cwd`` or writable root, or
            ``--writable-root`` with a mode that cannot write.
    """
    probe = probe or OsProbe()
    if not cwd.startswith("/"):
        raise InvalidParamsError(f"cwd must be absolute: {cwd}")
    cwd = normalize(cwd)
    roots: list[str] = []
    for root in writable_roots:
        if not root.startswith("/"):
            raise InvalidParamsError(f"--writable-root must be an absolute path: {root}")
        roots.append(normalize(root))
    policy: LegacyPolicy
    if sandbox == "danger-full-access":
        if roots:
            raise InvalidParamsError("--writable-root needs --sandbox workspace-write")
        policy = DangerFullAccess()
    elif sandbox == "read-only":
        if roots:
            raise InvalidParamsError("--writable-root needs --sandbox workspace-write")
        policy = ReadOnly(network_access=network)
    elif sandbox == "workspace-write":
        policy = WorkspaceWrite(writable_roots=tuple(roots), network_access=network)
    else:
        raise InvalidParamsError(
            f"--sandbox: unknown mode {sandbox!r} "
            "(expected read-only, workspace-write or danger-full-access)"
        )
    scope = PolicyScope.legacy(cwd, tmpdir)
    return LaunchSandboxRequest(
        Generation.LEGACY,
        fs_policy_from_legacy(policy, scope, probe),
        legacy_network(policy),
        cwd,
        (cwd,),
        legacy_policy=policy,
        probe=probe,
    )
