"""Wire structs of sandbox policies, both generations (PROTOCOL.md §6, CLIENT_COMPAT.md §1.4).

Casing differs per struct (PROTOCOL.md §6 table): legacy policies snake_case with kebab
tags, contexts camelCase, ``permissions`` snake_case. Paths are checked :class:`AbsPath`."""

from __future__ import annotations

import functools
from typing import Annotated, Any, Final, Literal

import msgspec

from exec_server.exceptions import InvalidParamsError, params_error_text
from exec_server.protocol.paths import PathForm, parse_wire_path, render_path

#: Most paths one list of a sandbox object may hold (-32602 past it): a plan costs
#: ~20 µs per entry; Codex sends under 20.
MAX_SANDBOX_ENTRIES: Final = 4096


__all__ = [
    "MAX_SANDBOX_ENTRIES",
    "AbsPath",
    "CurrentSandboxContext",
    "DangerFullAccessPolicy",
    "ExternalSandboxPolicy",
    "FileSystemAccess",
    "FileSystemGlobPath",
    "FileSystemPath",
    "FileSystemPathEntry",
    "FileSystemPermissions",
    "FileSystemSandboxContext",
    "FileSystemSandboxEntry",
    "FileSystemSandboxPolicy",
    "FileSystemSpecialPath",
    "FileSystemSpecialPathEntry",
    "ManagedFileSystem",
    "ManagedPermissions",
    "NetworkAccess",
    "NetworkPermissions",
    "PermissionProfile",
    "Permissions",
    "PermissionsDisabled",
    "PermissionsExternal",
    "PolicyContext",
    "ReadOnlyAccess",
    "ReadOnlyAccessFull",
    "ReadOnlyAccessRestricted",
    "ReadOnlyPolicy",
    "RestrictedFileSystem",
    "SandboxContext",
    "SandboxField",
    "SandboxLaunchConfig",
    "SandboxPolicy",
    "SandboxTypeName",
    "SandboxablePreference",
    "SpecialCurrentWorkingDirectory",
    "SpecialMinimal",
    "SpecialProjectRoots",
    "SpecialRoot",
    "SpecialSlashTmp",
    "SpecialTmpdir",
    "SpecialUnknown",
    "UnrestrictedFileSystem",
    "WindowsSandboxLevel",
    "WorkspaceWritePolicy",
    "decode_fs_sandbox",
    "decode_launch_sandbox",
    "decode_sandbox",
    "encode_client_context",
    "sandbox_raw",
]


class AbsPath(str):
    """An absolute, lexically normalised path decoded from a plain path or a ``file://`` URI."""

    __slots__ = ()


NetworkAccess = Literal["restricted", "enabled"]
WindowsSandboxLevel = Literal["disabled", "restricted-token", "elevated", "mxc"]
SandboxablePreference = Literal["auto", "require", "forbid"]
SandboxTypeName = Literal["none", "macos-seatbelt", "linux-seccomp", "windows-restricted-token"]
#: ``deny`` is the current client's canonical spelling of ``none``.
FileSystemAccess = Literal["read", "write", "none", "deny"]

_LEGACY = {"tag_field": "type", "frozen": True, "kw_only": True, "omit_defaults": True}


# --- legacy SandboxPolicy (PROTOCOL.md §6.1): tag "type", kebab tags, snake_case ---


class ReadOnlyAccessFull(msgspec.Struct, tag="full-access", **_LEGACY):
    """Everything readable (the default ``ReadOnlyAccess``)."""


class ReadOnlyAccessRestricted(msgspec.Struct, tag="restricted", **_LEGACY):
    """Reads limited to roots (+ platform defaults, which default to on: PROTOCOL §17 trap)."""

    include_platform_defaults: bool = True
    readable_roots: _Paths = msgspec.field(default_factory=list)


ReadOnlyAccess = ReadOnlyAccessFull | ReadOnlyAccessRestricted
_FULL_ACCESS = ReadOnlyAccessFull()


class DangerFullAccessPolicy(msgspec.Struct, tag="danger-full-access", **_LEGACY):
    """No restrictions."""


class ReadOnlyPolicy(msgspec.Struct, tag="read-only", **_LEGACY):
    access: ReadOnlyAccess = _FULL_ACCESS
    network_access: bool = False


class ExternalSandboxPolicy(msgspec.Struct, tag="external-sandbox", **_LEGACY):
    """Already confined by the caller; full disk, network per ``network_access``."""

    network_access: NetworkAccess = "restricted"


class WorkspaceWritePolicy(msgspec.Struct, tag="workspace-write", **_LEGACY):
    """Writes to cwd, writable roots, /tmp and $TMPDIR (unless excluded)."""

    writable_roots: _Paths = msgspec.field(default_factory=list)
    read_only_access: ReadOnlyAccess = _FULL_ACCESS
    network_access: bool = False
    exclude_tmpdir_env_var: bool = False
    exclude_slash_tmp: bool = False


SandboxPolicy = (
    DangerFullAccessPolicy | ReadOnlyPolicy | ExternalSandboxPolicy | WorkspaceWritePolicy
)


# --- FileSystemSandboxPolicy entries (PROTOCOL.md §6.2, CLIENT_COMPAT.md §1.4) ---

_SPECIAL = {"tag_field": "kind", "frozen": True, "kw_only": True, "omit_defaults": True}


class SpecialRoot(msgspec.Struct, tag="root", **_SPECIAL):
    """The filesystem root (``/``)."""


class SpecialMinimal(msgspec.Struct, tag="minimal", **_SPECIAL):
    """Platform default readable locations; never matches a path check."""


class SpecialCurrentWorkingDirectory(msgspec.Struct, tag="current_working_directory", **_SPECIAL):
    """The policy cwd (current client: every workspace root)."""


class SpecialProjectRoots(msgspec.Struct, tag="project_roots", **_SPECIAL):
    """Every workspace root, optionally joined with a relative ``subpath``."""

    subpath: str | None = None


class SpecialTmpdir(msgspec.Struct, tag="tmpdir", **_SPECIAL):
    """``$TMPDIR`` when set, non-empty and absolute."""


class SpecialSlashTmp(msgspec.Struct, tag="slash_tmp", **_SPECIAL):
    """``/tmp`` when it is a directory."""


class SpecialUnknown(msgspec.Struct, tag="unknown", **_SPECIAL):
    """Forward-compatibility placeholder for config tokens; resolves to nothing."""

    path: str = ""
    subpath: str | None = None


FileSystemSpecialPath = (
    SpecialRoot
    | SpecialMinimal
    | SpecialCurrentWorkingDirectory
    | SpecialProjectRoots
    | SpecialTmpdir
    | SpecialSlashTmp
    | SpecialUnknown
)


class FileSystemPathEntry(msgspec.Struct, tag="path", **_LEGACY):
    path: AbsPath


class FileSystemGlobPath(msgspec.Struct, tag="glob_pattern", **_LEGACY):
    """Current client only, e.g. ``**/*.env``."""

    pattern: str


class FileSystemSpecialPathEntry(msgspec.Struct, tag="special", **_LEGACY):
    value: FileSystemSpecialPath


FileSystemPath = FileSystemPathEntry | FileSystemGlobPath | FileSystemSpecialPathEntry


class FileSystemSandboxEntry(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    path: FileSystemPath
    access: FileSystemAccess
    missing_path_behavior: Literal["skip"] | None = None


_Entries = Annotated[list[FileSystemSandboxEntry], msgspec.Meta(max_length=MAX_SANDBOX_ENTRIES)]
_Paths = Annotated[list[AbsPath], msgspec.Meta(max_length=MAX_SANDBOX_ENTRIES)]


class FileSystemSandboxPolicy(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Legacy derived filesystem policy (PROTOCOL.md §6.2)."""

    kind: Literal["restricted", "unrestricted", "external-sandbox"] = "restricted"
    entries: _Entries = msgspec.field(default_factory=list)


# --- PermissionProfile ("additional permissions", PROTOCOL.md §6.4), snake_case ---


class NetworkPermissions(msgspec.Struct, frozen=True, kw_only=True):
    enabled: bool | None = None


class FileSystemPermissions(msgspec.Struct, frozen=True, kw_only=True):
    read: _Paths | None = None
    write: _Paths | None = None


class PermissionProfile(msgspec.Struct, frozen=True, kw_only=True):
    network: NetworkPermissions | None = None
    file_system: FileSystemPermissions | None = None


# --- legacy contexts (camelCase) ---


class SandboxLaunchConfig(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """``process/start.sandbox`` of a legacy client (PROTOCOL.md §6.7); needs
    ``sandbox_preference`` or the older ``sandbox`` (:func:`decode_launch_sandbox`)."""

    policy: SandboxPolicy
    file_system_policy: FileSystemSandboxPolicy
    network_policy: NetworkAccess
    sandbox_policy_cwd: AbsPath
    enforce_managed_network: bool
    windows_sandbox_level: WindowsSandboxLevel
    windows_sandbox_private_desktop: bool
    use_legacy_landlock: bool
    sandbox_preference: SandboxablePreference | None = None
    sandbox: SandboxTypeName | None = None
    additional_permissions: PermissionProfile | None = None


class FileSystemSandboxContext(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """``fs/*.sandbox`` of a legacy client (PROTOCOL.md §6.8)."""

    sandbox_policy: SandboxPolicy
    windows_sandbox_level: WindowsSandboxLevel
    windows_sandbox_private_desktop: bool = False
    use_legacy_landlock: bool = False
    additional_permissions: PermissionProfile | None = None


# --- current client's permission context (CLIENT_COMPAT.md §1.4) ---

_PERM = {"tag_field": "type", "frozen": True, "kw_only": True}


class UnrestrictedFileSystem(msgspec.Struct, tag="unrestricted", **_PERM):
    """No filesystem confinement."""


class RestrictedFileSystem(msgspec.Struct, tag="restricted", **_PERM):
    entries: _Entries
    glob_scan_max_depth: int | None = None


ManagedFileSystem = UnrestrictedFileSystem | RestrictedFileSystem


class PermissionsDisabled(msgspec.Struct, tag="disabled", **_PERM):
    """No restrictions (like legacy ``danger-full-access``)."""


class PermissionsExternal(msgspec.Struct, tag="external", **_PERM):
    """Already sandboxed externally: full disk, network per ``network``."""

    network: NetworkAccess


class ManagedPermissions(msgspec.Struct, tag="managed", **_PERM):
    file_system: ManagedFileSystem
    network: NetworkAccess


Permissions = PermissionsDisabled | PermissionsExternal | ManagedPermissions


class PolicyContext(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Overrides the context's ``cwd``/``workspaceRoots`` when present (CLIENT_COMPAT §1.5)."""

    cwd: AbsPath | None = None
    workspace_roots: _Paths | None = None


class CurrentSandboxContext(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """``sandbox`` of the current client, on ``process/start`` and ``fs/*``."""

    permissions: Permissions
    windows_sandbox_level: WindowsSandboxLevel
    cwd: AbsPath | None = None
    workspace_roots: _Paths = msgspec.field(default_factory=list)
    policy_context: PolicyContext | None = None
    user_home_dir: AbsPath | None = None
    temporary_directories: _Paths | None = None
    windows_sandbox_private_desktop: bool = False
    windows_sandbox_proxy_settings_mode: Literal["reconcile", "preserve"] | None = None
    use_legacy_landlock: bool = False
    # Informational record of the client's decision; never widens permissions.
    sandbox_override: str | dict[str, Any] | None = None


#: A decoded ``sandbox`` member, any generation.
SandboxContext = CurrentSandboxContext | FileSystemSandboxContext | SandboxLaunchConfig

_LAUNCH_KEYS = frozenset(
    {"sandboxPreference", "policy", "fileSystemPolicy", "networkPolicy", "sandboxPolicyCwd"}
)

#: The ``sandbox`` member of a params struct, kept raw (``Raw | None`` would make
#: msgspec accept only ``null``).
SandboxField = msgspec.Raw | msgspec.UnsetType


def sandbox_raw(raw: SandboxField) -> msgspec.Raw | None:
    """The ``sandbox`` JSON of a params struct, or ``None`` when absent or ``null``."""
    if raw is msgspec.UNSET or bytes(raw).strip() == b"null":
        return None
    return raw


def _dec_hook(tp: type, obj: Any) -> Any:
    if tp is AbsPath:
        if not isinstance(obj, str):
            raise TypeError(f"Expected `str`, got `{type(obj).__name__}`")
        try:
            return AbsPath(parse_wire_path(obj).path)
        except InvalidParamsError as exc:
            # ValueError lets msgspec attach the field location to the message.
            raise ValueError(exc.message) from exc
    raise NotImplementedError(f"unsupported type {tp!r}")


@functools.cache
def _decoder(tp: Any) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(tp, dec_hook=_dec_hook)


def decode_sandbox(data: bytes | str | msgspec.Raw, tp: Any) -> Any:
    """Decode one sandbox struct (or union) ``tp``; InvalidParamsError names the member
    (``sandbox.policy.x[0]: ..``), InvalidRequestError a URI naming another host."""
    try:
        return _decoder(tp).decode(data)
    except msgspec.ValidationError as exc:
        raise InvalidParamsError(_locate(params_error_text(str(exc)))) from exc
    except msgspec.DecodeError as exc:
        raise InvalidParamsError(f"sandbox: {exc}") from exc


def encode_client_context(ctx: msgspec.Struct) -> bytes:
    """A context as a client sends it: members at their default left out (upstream
    refuses ``null`` for several), paths as ``file://`` URIs in the current shape
    (upstream 0.163 refuses plain ones there), plain in the legacy one."""
    as_uri = isinstance(ctx, CurrentSandboxContext)

    def plain(value: object) -> object:
        if isinstance(value, AbsPath):
            return str(render_path(value, PathForm.URI if as_uri else PathForm.PLAIN))
        if isinstance(value, msgspec.Struct):
            config = value.__struct_config__
            out: dict[str, object] = {}
            if config.tag_field is not None:
                out[config.tag_field] = config.tag
            for field in msgspec.structs.fields(value):
                member = getattr(value, field.name)
                factory = field.default_factory
                default = field.default if factory is msgspec.NODEFAULT else factory()
                if member != default:
                    out[field.encode_name] = plain(member)
            return out
        if isinstance(value, list | tuple):
            return [plain(item) for item in value]
        if isinstance(value, dict):
            return {key: plain(item) for key, item in value.items()}
        return value

    return msgspec.json.encode(plain(ctx))


def _locate(message: str) -> str:
    """Turn msgspec's ``<text> - at `$.a.b``` into ``sandbox.a.b: <text>``."""
    text, sep, where = message.rpartition(" - at `$")
    if not sep:
        return f"sandbox: {message}"
    return f"sandbox{where.rstrip('`')}: {text}"


def decode_launch_sandbox(raw: bytes | msgspec.Raw | None) -> SandboxContext | None:
    """Decode ``process/start.sandbox`` (None when absent or ``null``), told apart by keys
    (CLIENT_COMPAT.md §1.2 rule 3; :func:`_decode_member`)."""
    return None if raw is None else _decode_member(bytes(raw), launch=True)


def decode_fs_sandbox(raw: bytes | msgspec.Raw | None) -> SandboxContext | None:
    """Decode ``fs/*.sandbox`` as :func:`decode_launch_sandbox` does, but ``sandboxPolicy``
    always makes a filesystem context; None when absent or ``null``."""
    return None if raw is None else _decode_member(bytes(raw), launch=False)


@functools.lru_cache(maxsize=64)
def _decode_member(raw: bytes, *, launch: bool) -> SandboxContext | None:
    """``permissions``: the current context; ``sandboxPolicy`` without launch members: a
    filesystem one; else legacy launch. Memoised: Codex sends the same bytes every call."""
    # Anything but an object (or null) is -32602.
    keys: dict[str, msgspec.Raw] | None = decode_sandbox(raw, dict[str, msgspec.Raw] | None)
    if keys is None:
        return None
    has_launch_keys = not _LAUNCH_KEYS.isdisjoint(keys)
    context: SandboxContext
    if "permissions" in keys:
        context = decode_sandbox(raw, CurrentSandboxContext)
    elif "sandboxPolicy" in keys and not (launch and has_launch_keys):
        context = decode_sandbox(raw, FileSystemSandboxContext)
    elif not has_launch_keys:
        raise InvalidParamsError("sandbox: missing field `permissions`")
    else:
        config: SandboxLaunchConfig = decode_sandbox(raw, SandboxLaunchConfig)
        if launch and config.sandbox_preference is None and config.sandbox is None:
            raise InvalidParamsError("sandbox: missing field `sandboxPreference`")
        context = config
    return context
