"""Wire sandbox objects → the internal policy model (both generations).

The entry point for ``process/start``: tells the shapes apart
(CLIENT_COMPAT.md §1.2 rule 3), validates them and produces a
:class:`LaunchSandboxRequest` (what to confine, how strongly the client
insists, which generation asked). Also builds the ``exec-server run`` policy.
Filesystem contexts live in :mod:`exec_server.sandbox.fs_request` and are
re-exported here.

Every error is an :class:`InvalidParamsError` naming the offending field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from exec_server.exceptions import InvalidParamsError
from exec_server.protocol import sandbox_types as wire
from exec_server.sandbox._decode import (
    LAUNCH_KEYS,
    Generation,
    current_scope,
    extra_permissions,
    legacy_fs_policy,
    legacy_policy_from_wire,
    object_keys,
    permissions_policy,
    plain_path,
)
from exec_server.sandbox.access import (
    ResolvedPolicy,
    has_full_disk_write,
    includes_platform_defaults,
)
from exec_server.sandbox.fs_request import (
    FsRouteDecision,
    FsSandboxRequest,
    cached_fs_route,
    fs_context_from_wire,
    fs_route_from_wire,
    root_alias_normalize,
)
from exec_server.sandbox.plan import SandboxPlan, SandboxType
from exec_server.sandbox.platform import platform_default_read_roots
from exec_server.sandbox.policy import (
    DangerFullAccess,
    FileSystemPolicy,
    FsKind,
    FsProbe,
    LegacyPolicy,
    Network,
    OsProbe,
    PolicyScope,
    ReadOnly,
    WorkspaceWrite,
    effective_fs_policy,
    effective_legacy_policy,
    effective_network,
    fs_policy_from_legacy,
    legacy_network,
    normalize,
)

__all__ = [
    "FsRouteDecision",
    "FsSandboxRequest",
    "Generation",
    "LaunchSandboxRequest",
    "Preference",
    "cached_fs_route",
    "cli_launch_request",
    "fs_context_from_wire",
    "fs_route_from_wire",
    "launch_request_from_wire",
    "legacy_policy_from_wire",
    "root_alias_normalize",
]

Preference = Literal["auto", "require", "forbid"]

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
    keys = object_keys(raw, "sandbox")
    if keys is None:
        return LaunchSandboxRequest.unsandboxed(command_cwd)
    if "permissions" in keys:
        ctx = wire.decode_sandbox(raw, wire.CurrentSandboxContext)
        fs, network = permissions_policy(ctx.permissions)
        cwd, roots = current_scope(ctx, command_cwd)
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
    if "sandboxPolicy" in keys and not (LAUNCH_KEYS & keys.keys()):
        # A filesystem context on process/start: derive what the client would have sent.
        fctx = wire.decode_sandbox(raw, wire.FileSystemSandboxContext)
        extra = extra_permissions(fctx.additional_permissions)
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
    if not (LAUNCH_KEYS & keys.keys()):
        raise InvalidParamsError("sandbox: missing field `permissions`")
    config = wire.decode_sandbox(raw, wire.SandboxLaunchConfig)
    forced: SandboxType | None = None
    if config.sandbox_preference is None:
        if config.sandbox is None:
            raise InvalidParamsError("sandbox: missing field `sandboxPreference`")
        forced = _SANDBOX_TYPES[config.sandbox]
    cwd = plain_path(config.sandbox_policy_cwd, "sandbox.sandboxPolicyCwd")
    extra = extra_permissions(config.additional_permissions)
    fs = legacy_fs_policy(config.file_system_policy, "sandbox.fileSystemPolicy")
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
