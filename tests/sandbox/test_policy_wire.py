"""Wire decoding of sandbox objects, both generations (PROTOCOL.md §6, CLIENT_COMPAT.md §1.4)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from exec_server.exceptions import ErrorCode, InvalidParamsError, InvalidRequestError, wire_error
from exec_server.protocol.types import sandbox as wire
from exec_server.protocol.types.sandbox import decode_fs_sandbox, decode_launch_sandbox
from exec_server.sandbox.convert import (
    Generation,
    fs_context,
    launch_request,
)
from exec_server.sandbox.errors import SandboxPolicyError
from exec_server.sandbox.policy import (
    Access,
    FsEntry,
    FsKind,
    GlobTarget,
    Network,
    PathTarget,
    SpecialKind,
    SpecialTarget,
)

RECORDINGS = Path("/work/shared/spec/codex-0.163-recordings")


def restricted(roots: list[str], *, include_platform_defaults: bool = True) -> wire.ReadOnlyAccess:
    """A restricted legacy ``ReadOnlyAccess`` as decoded."""
    return wire.ReadOnlyAccessRestricted(
        include_platform_defaults=include_platform_defaults,
        readable_roots=[wire.AbsPath(r) for r in roots],
    )


def raw(obj: Any) -> msgspec.Raw:
    return msgspec.Raw(json.dumps(obj).encode())


# --- legacy SandboxPolicy examples, PROTOCOL.md §6.1 ---

LEGACY_POLICIES = [
    ({"type": "danger-full-access"}, wire.DangerFullAccessPolicy()),
    ({"type": "read-only"}, wire.ReadOnlyPolicy(access=wire.ReadOnlyAccessFull())),
    (
        {
            "type": "read-only",
            "access": {
                "type": "restricted",
                "include_platform_defaults": False,
                "readable_roots": ["/srv/data"],
            },
        },
        wire.ReadOnlyPolicy(access=restricted(["/srv/data"], include_platform_defaults=False)),
    ),
    (
        {"type": "external-sandbox", "network_access": "enabled"},
        wire.ExternalSandboxPolicy(network_access="enabled"),
    ),
    ({"type": "external-sandbox"}, wire.ExternalSandboxPolicy()),
    (
        {
            "type": "workspace-write",
            "writable_roots": ["/srv/cache"],
            "read_only_access": {"type": "restricted", "include_platform_defaults": True},
            "network_access": False,
            "exclude_tmpdir_env_var": True,
            "exclude_slash_tmp": True,
        },
        wire.WorkspaceWritePolicy(
            writable_roots=[wire.AbsPath("/srv/cache")],
            read_only_access=restricted([], include_platform_defaults=True),
            network_access=False,
            exclude_tmpdir_env_var=True,
            exclude_slash_tmp=True,
        ),
    ),
    # include_platform_defaults defaults to true when absent (PROTOCOL.md §17 trap 10)
    (
        {"type": "read-only", "access": {"type": "restricted"}},
        wire.ReadOnlyPolicy(access=restricted([], include_platform_defaults=True)),
    ),
    # file:// URIs and lexical normalisation inside policies
    (
        {"type": "workspace-write", "writable_roots": ["file:///srv/a/../b%20c"]},
        wire.WorkspaceWritePolicy(writable_roots=["/srv/b c"]),
    ),
]


@pytest.mark.parametrize(("obj", "expected"), LEGACY_POLICIES)
def test_legacy_policy_decodes(obj: dict[str, Any], expected: object) -> None:
    decoded = wire.decode_sandbox(json.dumps(obj), wire.SandboxPolicy)
    assert decoded == expected


def test_legacy_policy_encodes_snake_case_with_kebab_tags() -> None:
    policy = wire.WorkspaceWritePolicy(
        writable_roots=[wire.AbsPath("/srv/cache")],
        read_only_access=wire.ReadOnlyAccessRestricted(include_platform_defaults=False),
        exclude_slash_tmp=True,
    )
    out = json.loads(wire.encode_client_context(policy))
    assert out == {
        "type": "workspace-write",
        "writable_roots": ["/srv/cache"],
        "read_only_access": {"type": "restricted", "include_platform_defaults": False},
        "exclude_slash_tmp": True,
    }
    assert json.loads(wire.encode_client_context(wire.ReadOnlyPolicy())) == {"type": "read-only"}


BAD_POLICIES = [
    ({"type": "full-yolo"}, "sandbox.type: Invalid value 'full-yolo'"),
    ({}, "sandbox: missing field `type`"),
    ({"type": "workspace-write", "writable_roots": ["rel/dir"]}, "sandbox.writable_roots[0]"),
    ({"type": "workspace-write", "writable_roots": ["~/x"]}, "path must be absolute"),
    ({"type": "read-only", "access": {"type": "partial"}}, "sandbox.access.type"),
    ({"type": "external-sandbox", "network_access": "sometimes"}, "sandbox.network_access"),
    ({"type": "read-only", "network_access": "yes"}, "sandbox.network_access"),
    ({"type": "workspace-write", "writable_roots": "/x"}, "sandbox.writable_roots"),
    (
        {"type": "workspace-write", "writable_roots": ["http://x/y"]},
        "sandbox.writable_roots[0]",
    ),
]


@pytest.mark.parametrize(("obj", "needle"), BAD_POLICIES)
def test_bad_legacy_policy_names_the_field(obj: dict[str, Any], needle: str) -> None:
    with pytest.raises(InvalidParamsError) as info:
        wire.decode_sandbox(json.dumps(obj), wire.SandboxPolicy)
    assert needle in info.value.message


def test_uri_with_foreign_host_is_invalid_request() -> None:
    with pytest.raises(InvalidRequestError):
        wire.decode_sandbox(
            '{"type":"workspace-write","writable_roots":["file://otherhost/x"]}', wire.SandboxPolicy
        )


# --- SandboxLaunchConfig (process/start, legacy) ---

NO_SANDBOX = {
    "sandboxPreference": "forbid",
    "policy": {"type": "danger-full-access"},
    "fileSystemPolicy": {"kind": "unrestricted"},
    "networkPolicy": "enabled",
    "sandboxPolicyCwd": "/srv/proj",
    "additionalPermissions": None,
    "enforceManagedNetwork": False,
    "windowsSandboxLevel": "disabled",
    "windowsSandboxPrivateDesktop": False,
    "useLegacyLandlock": False,
}

PROCESS_START_SANDBOX = {  # PROTOCOL.md §8.1 example
    "sandboxPreference": "auto",
    "policy": {
        "type": "workspace-write",
        "network_access": False,
        "exclude_tmpdir_env_var": False,
        "exclude_slash_tmp": False,
    },
    "fileSystemPolicy": {
        "kind": "restricted",
        "entries": [
            {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
            {
                "path": {"type": "special", "value": {"kind": "current_working_directory"}},
                "access": "write",
            },
            {"path": {"type": "special", "value": {"kind": "slash_tmp"}}, "access": "write"},
            {"path": {"type": "special", "value": {"kind": "tmpdir"}}, "access": "write"},
        ],
    },
    "networkPolicy": "restricted",
    "sandboxPolicyCwd": "/srv/proj",
    "additionalPermissions": None,
    "enforceManagedNetwork": False,
    "windowsSandboxLevel": "disabled",
    "windowsSandboxPrivateDesktop": False,
    "useLegacyLandlock": False,
}


def test_no_sandbox_config() -> None:
    req = launch_request(decode_launch_sandbox(raw(NO_SANDBOX)), command_cwd="/elsewhere")
    assert req.generation is Generation.LEGACY
    assert req.preference == "forbid"
    assert req.fs_policy.kind is FsKind.UNRESTRICTED
    assert req.network is Network.ENABLED
    assert req.cwd == "/srv/proj"
    assert req.roots == ("/srv/proj",)


def test_process_start_example_decodes() -> None:
    req = launch_request(decode_launch_sandbox(raw(PROCESS_START_SANDBOX)), command_cwd="/srv/proj")
    assert req.preference == "auto"
    assert req.network is Network.RESTRICTED
    kinds = [(e.target, e.access) for e in req.fs_policy.entries]
    assert kinds == [
        (SpecialTarget(SpecialKind.ROOT), Access.READ),
        (SpecialTarget(SpecialKind.CURRENT_WORKING_DIRECTORY), Access.WRITE),
        (SpecialTarget(SpecialKind.SLASH_TMP), Access.WRITE),
        (SpecialTarget(SpecialKind.TMPDIR), Access.WRITE),
    ]
    assert req.needs_platform_sandbox


def test_absent_and_null_mean_no_sandbox() -> None:
    for value in (None, msgspec.Raw(b"null")):
        req = launch_request(decode_launch_sandbox(value), command_cwd="/w")
        assert req.generation is None
        assert not req.needs_platform_sandbox


def test_sandbox_alias_member_preselects_type() -> None:
    obj = dict(PROCESS_START_SANDBOX)
    del obj["sandboxPreference"]
    obj["sandbox"] = "linux-seccomp"
    req = launch_request(decode_launch_sandbox(raw(obj)), command_cwd="/srv/proj")
    assert req.forced_type is not None and req.forced_type.value == "linux-seccomp"


def test_sandbox_policy_cwd_accepts_uri() -> None:
    obj = dict(NO_SANDBOX, sandboxPolicyCwd="file:///srv/p%20q")
    assert launch_request(decode_launch_sandbox(raw(obj)), command_cwd="/x").cwd == "/srv/p q"


BAD_LAUNCH = [
    ({"sandboxPreference": "sometimes"}, "sandbox.sandboxPreference"),
    ({"sandboxPreference": None}, "missing field `sandboxPreference`"),
    ({"policy": {"type": "bogus"}}, "sandbox.policy.type: Invalid value 'bogus'"),
    ({"fileSystemPolicy": {"kind": "weird"}}, "sandbox.fileSystemPolicy.kind"),
    ({"networkPolicy": "partial"}, "sandbox.networkPolicy"),
    ({"sandboxPolicyCwd": "relative/dir"}, "sandbox.sandboxPolicyCwd: path must be absolute"),
    ({"windowsSandboxLevel": "max"}, "sandbox.windowsSandboxLevel"),
    (
        {
            "fileSystemPolicy": {
                "kind": "restricted",
                "entries": [{"path": {"type": "path", "path": "docs"}, "access": "read"}],
            }
        },
        "sandbox.fileSystemPolicy.entries[0].path.path: path must be absolute",
    ),
    (
        {
            "fileSystemPolicy": {
                "kind": "restricted",
                "entries": [
                    {"path": {"type": "special", "value": {"kind": "home"}}, "access": "read"}
                ],
            }
        },
        "sandbox.fileSystemPolicy.entries[0].path.value.kind: Invalid value 'home'",
    ),
    (
        {
            "fileSystemPolicy": {
                "kind": "restricted",
                "entries": [
                    {"path": {"type": "special", "value": {"kind": "root"}}, "access": "rw"}
                ],
            }
        },
        "sandbox.fileSystemPolicy.entries[0].access",
    ),
    (
        {"fileSystemPolicy": {"kind": "restricted", "entries": [{"access": "read"}]}},
        "sandbox.fileSystemPolicy.entries[0]: missing field `path`",
    ),
    (
        {"additionalPermissions": {"file_system": {"write": ["out"]}}},
        "sandbox.additionalPermissions.file_system.write[0]",
    ),
    (
        {
            "policy": {
                "type": "workspace-write",
                "writable_roots": ["/ok", "not/absolute"],
            }
        },
        "sandbox.policy.writable_roots[1]",
    ),
]


@pytest.mark.parametrize(("patch", "needle"), BAD_LAUNCH)
def test_bad_launch_config_names_the_field(patch: dict[str, Any], needle: str) -> None:
    obj = {**PROCESS_START_SANDBOX, **patch}
    if patch.get("sandboxPreference", "") is None:
        del obj["sandboxPreference"]
    with pytest.raises(InvalidParamsError) as info:
        launch_request(decode_launch_sandbox(raw(obj)), command_cwd="/srv/proj")
    assert needle.split(" - ")[0] in info.value.message


def test_missing_required_member() -> None:
    obj = dict(PROCESS_START_SANDBOX)
    del obj["enforceManagedNetwork"]
    with pytest.raises(InvalidParamsError, match="enforceManagedNetwork"):
        launch_request(decode_launch_sandbox(raw(obj)), command_cwd="/srv/proj")


@pytest.mark.parametrize(
    "value", [b"[]", b'"auto"', b"42", b"{}", b'{"unrelated":1}', b"{bad json"]
)
def test_unrecognisable_sandbox_objects_are_rejected(value: bytes) -> None:
    with pytest.raises(InvalidParamsError, match=r"^sandbox"):
        launch_request(decode_launch_sandbox(msgspec.Raw(value)), command_cwd="/w")


# --- current-client permission context (CLIENT_COMPAT.md §1.4, recordings) ---

WS = "file:///srv/data/harness/final/sandboxed_shell/workspace"
WS_PATH = "/srv/data/harness/final/sandboxed_shell/workspace"

RECORDED_START = {
    "permissions": {
        "type": "managed",
        "file_system": {
            "type": "restricted",
            "entries": [
                {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
                {
                    "path": {"type": "special", "value": {"kind": "project_roots"}},
                    "access": "write",
                },
                {"path": {"type": "special", "value": {"kind": "slash_tmp"}}, "access": "write"},
                {"path": {"type": "special", "value": {"kind": "tmpdir"}}, "access": "write"},
                *(
                    {
                        "path": {
                            "type": "special",
                            "value": {"kind": "project_roots", "subpath": name},
                        },
                        "access": "read",
                        "missing_path_behavior": "skip",
                    }
                    for name in (".git", ".agents", ".codex", ".aws")
                ),
            ],
        },
        "network": "restricted",
    },
    "cwd": WS,
    "workspaceRoots": [WS],
    "windowsSandboxLevel": "disabled",
    "windowsSandboxProxySettingsMode": "reconcile",
    "useLegacyLandlock": False,
}


def test_recorded_current_context_decodes() -> None:
    req = launch_request(decode_launch_sandbox(raw(RECORDED_START)), command_cwd=WS_PATH)
    assert req.generation is Generation.CURRENT
    assert req.network is Network.RESTRICTED
    assert req.cwd == WS_PATH
    assert req.roots == (WS_PATH,)
    entries = req.fs_policy.entries
    assert entries[1] == FsEntry(SpecialTarget(SpecialKind.PROJECT_ROOTS), Access.WRITE)
    assert entries[4] == FsEntry(SpecialTarget(SpecialKind.PROJECT_ROOTS, ".git"), Access.READ)
    assert req.needs_platform_sandbox


def _recorded_sandboxes() -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    if not RECORDINGS.is_dir():
        return out
    for path in sorted(RECORDINGS.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            msg = json.loads(line).get("msg")
            if isinstance(msg, dict) and isinstance(msg.get("params"), dict):
                sandbox = msg["params"].get("sandbox")
                if isinstance(sandbox, dict):
                    out.append((f"{path.name}:{msg.get('method')}", sandbox))
    return out


@pytest.mark.skipif(not RECORDINGS.is_dir(), reason="recordings not available")
def test_every_recorded_sandbox_object_decodes() -> None:
    seen = _recorded_sandboxes()
    assert seen
    for where, sandbox in seen:
        value = raw(sandbox)
        if where.endswith("process/start"):
            req = launch_request(decode_launch_sandbox(value), command_cwd="/")
            assert req.generation is Generation.CURRENT
        else:
            req = fs_context(decode_fs_sandbox(value), server_cwd="/srv")
            assert req is not None and req.generation is Generation.CURRENT, where


CURRENT_VARIANTS = [
    ({"type": "disabled"}, FsKind.UNRESTRICTED, Network.ENABLED),
    ({"type": "external", "network": "restricted"}, FsKind.EXTERNAL, Network.RESTRICTED),
    ({"type": "external", "network": "enabled"}, FsKind.EXTERNAL, Network.ENABLED),
    (
        {"type": "managed", "file_system": {"type": "unrestricted"}, "network": "restricted"},
        FsKind.UNRESTRICTED,
        Network.RESTRICTED,
    ),
    (
        {
            "type": "managed",
            "file_system": {"type": "restricted", "entries": []},
            "network": "enabled",
        },
        FsKind.RESTRICTED,
        Network.ENABLED,
    ),
]


@pytest.mark.parametrize(("perms", "kind", "network"), CURRENT_VARIANTS)
def test_current_permission_variants(perms: dict[str, Any], kind: FsKind, network: Network) -> None:
    ctx = {"permissions": perms, "windowsSandboxLevel": "disabled"}
    req = launch_request(decode_launch_sandbox(raw(ctx)), command_cwd="/w")
    assert (req.fs_policy.kind, req.network) == (kind, network)


def test_current_entries_deny_glob_unknown() -> None:
    ctx = {
        "permissions": {
            "type": "managed",
            "file_system": {
                "type": "restricted",
                "entries": [
                    {"path": {"type": "path", "path": "file:///srv/x"}, "access": "deny"},
                    {"path": {"type": "glob_pattern", "pattern": "**/*.env"}, "access": "none"},
                    {
                        "path": {"type": "special", "value": {"kind": "unknown", "path": ":tok"}},
                        "access": "read",
                    },
                ],
                "glob_scan_max_depth": 3,
            },
            "network": "restricted",
        },
        "windowsSandboxLevel": "mxc",
        "sandboxOverride": {"escalatedSandboxWithRestrictions": {}},
    }
    req = launch_request(decode_launch_sandbox(raw(ctx)), command_cwd="/w")
    assert [e.target for e in req.fs_policy.entries] == [
        PathTarget("/srv/x"),
        GlobTarget("**/*.env"),
        SpecialTarget(SpecialKind.UNKNOWN),
    ]
    assert [e.access for e in req.fs_policy.entries] == [Access.NONE] * 2 + [Access.READ]


def _one_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """A current-generation context whose managed filesystem policy is ``entry`` alone."""
    return {
        "permissions": {
            "type": "managed",
            "file_system": {"type": "restricted", "entries": [entry]},
            "network": "restricted",
        }
    }


def _project_subpath(subpath: str, access: str = "read") -> dict[str, Any]:
    return {
        "path": {"type": "special", "value": {"kind": "project_roots", "subpath": subpath}},
        "access": access,
    }


BAD_CURRENT = [
    ({"permissions": {"type": "lenient"}}, "sandbox.permissions.type: Invalid value 'lenient'"),
    ({"permissions": {"type": "managed", "network": "restricted"}}, "sandbox.permissions"),
    (
        {
            "permissions": {
                "type": "managed",
                "file_system": {"type": "partial"},
                "network": "restricted",
            }
        },
        "sandbox.permissions.file_system.type",
    ),
    ({"permissions": {"type": "external"}}, "`network`"),
    ({"permissions": {"type": "disabled"}, "windowsSandboxLevel": None}, "windowsSandboxLevel"),
    (
        _one_entry(_project_subpath("/abs")),
        "sandbox.permissions.file_system.entries[0].path.value.subpath",
    ),
    (
        _one_entry(
            {
                "path": {"type": "path", "path": "x"},
                "access": "read",
                "missing_path_behavior": "create",
            }
        ),
        "sandbox.permissions.file_system.entries[0]",
    ),
    *(
        (
            _one_entry(_project_subpath(above, "write")),
            "entries[0].path.value.subpath: subpath must stay inside the root",
        )
        for above in ("..", "../..", "a/../../b", "./../x")
    ),
    ({"permissions": {"type": "disabled"}, "cwd": "relative"}, "sandbox.cwd"),
    ({"permissions": {"type": "disabled"}, "workspaceRoots": ["a"]}, "sandbox.workspaceRoots[0]"),
]


@pytest.mark.parametrize(("ctx", "needle"), BAD_CURRENT)
def test_bad_current_context_names_the_field(ctx: dict[str, Any], needle: str) -> None:
    ctx = {"windowsSandboxLevel": "disabled", **ctx}
    if ctx["windowsSandboxLevel"] is None:
        del ctx["windowsSandboxLevel"]
    # refused by the decoder (the handler) or by the conversion: -32602 either way
    with pytest.raises((InvalidParamsError, SandboxPolicyError)) as info:
        launch_request(decode_launch_sandbox(raw(ctx)), command_cwd="/w")
    mapped = wire_error(info.value)
    assert mapped is not None and mapped.code == ErrorCode.INVALID_PARAMS
    assert needle in mapped.message
    with pytest.raises((InvalidParamsError, SandboxPolicyError)) as info:
        fs_context(decode_fs_sandbox(raw(ctx)), server_cwd="/w")
    assert type(wire_error(info.value)) is InvalidParamsError


def test_a_subpath_may_use_dots_that_stay_inside_the_root() -> None:
    """Only a subpath that climbs above its root is refused (see BAD_CURRENT)."""
    ctx = {"windowsSandboxLevel": "disabled", **_one_entry(_project_subpath("a/../.codex"))}
    launch_request(decode_launch_sandbox(raw(ctx)), command_cwd="/w")


# --- more PROTOCOL.md examples ---


def test_filesystem_context_example_section_6_8() -> None:
    ctx = {
        "sandboxPolicy": {
            "type": "read-only",
            "access": {
                "type": "restricted",
                "include_platform_defaults": False,
                "readable_roots": ["/srv/allowed"],
            },
        },
        "windowsSandboxLevel": "disabled",
        "windowsSandboxPrivateDesktop": False,
        "useLegacyLandlock": False,
        "additionalPermissions": None,
    }
    req = fs_context(decode_fs_sandbox(raw(ctx)), server_cwd="/srv/proj")
    assert req is not None and not req.direct
    assert req.resolve_access("/srv/allowed/note.txt") is Access.READ
    assert req.resolve_access("/srv/other") is Access.NONE


def test_appendix_a_read_outside_writable_roots_is_denied() -> None:
    """Appendix A request 5: restricted reads reach only writable and listed roots."""
    ctx = {
        "sandboxPolicy": {
            "type": "workspace-write",
            "network_access": False,
            "exclude_tmpdir_env_var": True,
            "exclude_slash_tmp": True,
            "read_only_access": {"type": "restricted", "include_platform_defaults": False},
        },
        "windowsSandboxLevel": "disabled",
    }
    req = fs_context(decode_fs_sandbox(raw(ctx)), server_cwd="/srv/proj")
    assert req is not None and not req.direct
    assert req.resolve_access("/srv/other/secret.txt") is Access.NONE
    assert req.resolve_access("/srv/proj/src/main.c") is Access.WRITE


def test_appendix_a_process_start_sandbox_is_no_sandbox() -> None:
    req = launch_request(decode_launch_sandbox(raw(NO_SANDBOX)), command_cwd="/srv/proj")
    assert req.preference == "forbid" and not req.needs_platform_sandbox
