"""Policy conversions: §6.9 legacy → filesystem policy, §6.10 writable roots, §6.12 effective
policies, §10.1 helper policies, fs routing, CLIENT_COMPAT §1.5 scopes, CLI policies."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import msgspec
import pytest

from exec_server.exceptions import InvalidParamsError
from exec_server.fs.context import route
from exec_server.protocol.types import sandbox as wire
from exec_server.protocol.types.sandbox import decode_fs_sandbox, decode_launch_sandbox
from exec_server.sandbox.convert import (
    Generation,
    cli_launch_request,
    fs_context,
    launch_request,
)
from exec_server.sandbox.errors import SandboxPolicyError
from exec_server.sandbox.policy import (
    Access,
    FileSystemPolicy,
    FsEntry,
    FsKind,
    Network,
    PathTarget,
    PolicyScope,
    SpecialKind,
    SpecialTarget,
    base_fs_policy_from_legacy,
    effective_fs_policy,
    effective_network,
    fs_policy_from_legacy,
    helper_legacy_policy,
    legacy_network,
    legacy_writable_roots,
    protected_subpaths,
)


def restricted(roots: list[str], *, include_platform_defaults: bool = True) -> wire.ReadOnlyAccess:
    """A restricted legacy ``ReadOnlyAccess`` as decoded."""
    return wire.ReadOnlyAccessRestricted(
        include_platform_defaults=include_platform_defaults,
        readable_roots=[wire.AbsPath(r) for r in roots],
    )


def extra_permissions(
    network_enabled: bool | None = None,
    read: tuple[str, ...] | None = None,
    write: tuple[str, ...] | None = None,
) -> wire.PermissionProfile:
    """Additional permissions as decoded (``None``: null on the wire)."""
    paths = lambda xs: None if xs is None else [wire.AbsPath(x) for x in xs]  # noqa: E731
    return wire.PermissionProfile(
        network=wire.NetworkPermissions(enabled=network_enabled),
        file_system=wire.FileSystemPermissions(read=paths(read), write=paths(write)),
    )


class FakeProbe:
    """In-memory filesystem: a set of directories and a map of files."""

    def __init__(self, dirs: set[str] | None = None, files: dict[str, str] | None = None) -> None:
        self.dirs = dirs or set()
        self.files = files or {}

    def is_dir(self, path: str) -> bool:
        return path in self.dirs

    def is_file(self, path: str) -> bool:
        return path in self.files

    def read_text(self, path: str) -> str | None:
        return self.files.get(path)


def sp(kind: SpecialKind, access: Access, subpath: str | None = None) -> FsEntry:
    return FsEntry(SpecialTarget(kind, subpath), access)


def p(path: str, access: Access) -> FsEntry:
    return FsEntry(PathTarget(path), access)


R, W, N = Access.READ, Access.WRITE, Access.NONE
ROOT, CWD, MIN = SpecialKind.ROOT, SpecialKind.CURRENT_WORKING_DIRECTORY, SpecialKind.MINIMAL
TMP, STMP = SpecialKind.TMPDIR, SpecialKind.SLASH_TMP

# --- §6.9 base conversion ---

BASE_CASES = [
    (wire.DangerFullAccessPolicy(), FileSystemPolicy.unrestricted()),
    (wire.ExternalSandboxPolicy(network_access="enabled"), FileSystemPolicy.external()),
    (wire.ReadOnlyPolicy(), FileSystemPolicy.restricted([sp(ROOT, R)])),
    (
        wire.ReadOnlyPolicy(access=restricted(["/a", "/b"], include_platform_defaults=True)),
        FileSystemPolicy.restricted([sp(CWD, R), sp(MIN, R), p("/a", R), p("/b", R)]),
    ),
    (
        wire.ReadOnlyPolicy(access=restricted(["/a"], include_platform_defaults=False)),
        FileSystemPolicy.restricted([sp(CWD, R), p("/a", R)]),
    ),
    (
        wire.WorkspaceWritePolicy(),
        FileSystemPolicy.restricted([sp(ROOT, R), sp(CWD, W), sp(STMP, W), sp(TMP, W)]),
    ),
    (
        wire.WorkspaceWritePolicy(
            writable_roots=["/w1", "/w2"],
            read_only_access=restricted(["/r"], include_platform_defaults=True),
            exclude_slash_tmp=True,
        ),
        FileSystemPolicy.restricted(
            [sp(MIN, R), p("/r", R), sp(CWD, W), sp(TMP, W), p("/w1", W), p("/w2", W)]
        ),
    ),
    (
        wire.WorkspaceWritePolicy(
            read_only_access=restricted([], include_platform_defaults=False),
            exclude_tmpdir_env_var=True,
            exclude_slash_tmp=True,
        ),
        FileSystemPolicy.restricted([sp(CWD, W)]),
    ),
]


@pytest.mark.parametrize(("legacy", "expected"), BASE_CASES)
def test_base_conversion(legacy: Any, expected: FileSystemPolicy) -> None:
    assert base_fs_policy_from_legacy(legacy) == expected


def test_from_legacy_drops_readable_roots_inside_writable_roots() -> None:
    probe = FakeProbe(dirs={"/w/.git"})
    policy = wire.WorkspaceWritePolicy(
        writable_roots=["/w"],
        read_only_access=restricted(
            ["/w/sub", "/w/.git/hooks", "/elsewhere", "/proj/docs"], include_platform_defaults=False
        ),
        exclude_slash_tmp=True,
        exclude_tmpdir_env_var=True,
    )
    fs = fs_policy_from_legacy(policy, PolicyScope.legacy("/proj", None), probe)
    # /w/sub (writable) and /proj/docs (under the cwd) go; the protected one and outside stay
    assert fs.entries == (p("/w/.git/hooks", R), p("/elsewhere", R), sp(CWD, W), p("/w", W))


def test_from_legacy_keeps_other_variants_unchanged() -> None:
    scope = PolicyScope.legacy("/proj", None)
    for legacy in (
        wire.ReadOnlyPolicy(access=restricted(["/proj/x"])),
        wire.DangerFullAccessPolicy(),
    ):
        assert fs_policy_from_legacy(legacy, scope, FakeProbe()) == base_fs_policy_from_legacy(
            legacy
        )


@pytest.mark.parametrize(
    ("legacy", "network"),
    [
        (wire.DangerFullAccessPolicy(), Network.ENABLED),
        (wire.ExternalSandboxPolicy(), Network.RESTRICTED),
        (wire.ExternalSandboxPolicy(network_access="enabled"), Network.ENABLED),
        (wire.ReadOnlyPolicy(network_access=True), Network.ENABLED),
        (wire.ReadOnlyPolicy(), Network.RESTRICTED),
        (wire.WorkspaceWritePolicy(network_access=True), Network.ENABLED),
        (wire.WorkspaceWritePolicy(), Network.RESTRICTED),
    ],
)
def test_legacy_network(legacy: Any, network: Network) -> None:
    assert legacy_network(legacy) is network


# --- §6.10 writable roots and protected subpaths (real filesystem) ---


def test_protected_subpaths_on_disk(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / ".git").mkdir(parents=True)
    (root / ".agents").mkdir()
    (root / ".codex").write_text("a file, not a directory")
    got = protected_subpaths(str(root), probe=_os_probe())
    assert got == (str(root / ".git"), str(root / ".agents"))


def test_protected_subpaths_follow_gitdir_pointer(tmp_path: Path) -> None:
    root = tmp_path / "worktree"
    root.mkdir()
    real = tmp_path / "main" / ".git" / "worktrees" / "wt"
    real.mkdir(parents=True)
    (root / ".git").write_text("gitdir: ../main/.git/worktrees/wt\n")
    assert protected_subpaths(str(root), _os_probe()) == (str(root / ".git"), str(real))
    (root / ".git").write_text("gitdir: /nonexistent/path\n")
    assert protected_subpaths(str(root), _os_probe()) == (str(root / ".git"),)


def test_legacy_writable_roots_order_and_exclusions() -> None:
    probe = FakeProbe(dirs={"/tmp", "/proj/.git", "/tmp/.codex"})
    scope = PolicyScope.legacy("/proj", "/var/tmp/me")
    roots = legacy_writable_roots(
        wire.WorkspaceWritePolicy(writable_roots=["/extra"]), scope, probe
    )
    assert [r.root for r in roots] == ["/extra", "/proj", "/tmp", "/var/tmp/me"]
    assert roots[1].read_only_subpaths == ("/proj/.git",)
    assert roots[2].read_only_subpaths == ("/tmp/.codex",)
    assert roots[1].allows_write("/proj/src/a.py")
    assert not roots[1].allows_write("/proj/.git/config")
    assert not roots[1].allows_write("/projX")
    excluded = wire.WorkspaceWritePolicy(exclude_slash_tmp=True, exclude_tmpdir_env_var=True)
    assert [r.root for r in legacy_writable_roots(excluded, scope, probe)] == ["/proj"]
    # relative or empty TMPDIR is ignored; missing /tmp is skipped
    bad_tmp = PolicyScope.legacy("/proj", "relative/tmp")
    assert [
        r.root for r in legacy_writable_roots(wire.WorkspaceWritePolicy(), bad_tmp, FakeProbe())
    ] == ["/proj"]
    assert legacy_writable_roots(wire.ReadOnlyPolicy(), scope, probe) == []


# --- §6.12 effective policies ---

PROFILE_NET = extra_permissions(network_enabled=True, read=("/tmp",), write=())


def test_effective_external_sandbox_gains_network() -> None:  # §15.7 test 58
    assert effective_network(Network.RESTRICTED, PROFILE_NET) is Network.ENABLED
    assert effective_fs_policy(FileSystemPolicy.external(), PROFILE_NET) == (
        FileSystemPolicy.external()
    )


def test_effective_fs_policy_preserves_denials() -> None:  # §15.7 test 59
    base = FileSystemPolicy.restricted([sp(ROOT, R), p("/w/denied", N)])
    extra = extra_permissions(write=("/w/allowed",))
    assert effective_fs_policy(base, extra).entries == (
        sp(ROOT, R),
        p("/w/denied", N),
        p("/w/allowed", W),
    )
    assert effective_network(Network.RESTRICTED, extra) is Network.RESTRICTED


def test_effective_fs_policy_dedups_and_keeps_order() -> None:
    base = FileSystemPolicy.restricted([p("/a", R)])
    extra = extra_permissions(read=("/a", "/b", "/b"), write=("/c", "/c"))
    assert effective_fs_policy(base, extra).entries == (p("/a", R), p("/b", R), p("/c", W))
    assert effective_fs_policy(base, None) is base
    assert effective_fs_policy(base, extra_permissions(read=(), write=None)) is base


@pytest.mark.parametrize(
    ("base", "extra", "expected"),
    [
        (Network.RESTRICTED, None, Network.RESTRICTED),
        (Network.ENABLED, None, Network.ENABLED),
        (Network.ENABLED, extra_permissions(), Network.ENABLED),
        (Network.RESTRICTED, extra_permissions(), Network.RESTRICTED),
        (Network.RESTRICTED, extra_permissions(network_enabled=False), Network.RESTRICTED),
        (Network.RESTRICTED, extra_permissions(network_enabled=True), Network.ENABLED),
    ],
)
def test_effective_network(
    base: Network, extra: wire.PermissionProfile | None, expected: Network
) -> None:
    assert effective_network(base, extra) is expected


def test_launch_config_merges_additional_permissions() -> None:
    cfg = {
        "sandboxPreference": "forbid",
        "policy": {"type": "external-sandbox"},
        "fileSystemPolicy": {"kind": "unrestricted"},
        "networkPolicy": "restricted",
        "sandboxPolicyCwd": "/w",
        "additionalPermissions": {"network": {"enabled": True}, "file_system": {"read": ["/r"]}},
        "enforceManagedNetwork": False,
        "windowsSandboxLevel": "disabled",
        "windowsSandboxPrivateDesktop": False,
        "useLegacyLandlock": False,
    }
    req = launch_request(decode_launch_sandbox(json.dumps(cfg).encode()), command_cwd="/w")
    assert req.network is Network.ENABLED
    assert req.fs_policy == FileSystemPolicy.unrestricted()  # §15.7 test 57 shape
    cfg["additionalPermissions"] = None
    req = launch_request(decode_launch_sandbox(json.dumps(cfg).encode()), command_cwd="/w")
    assert (req.fs_policy.kind, req.network) == (FsKind.UNRESTRICTED, Network.RESTRICTED)


# --- §10.1 helper policies (§15.7 tests 41-43) ---


def test_helper_policy_enables_platform_defaults_for_read_only() -> None:
    ro = wire.ReadOnlyPolicy(access=restricted([], include_platform_defaults=False))
    assert helper_legacy_policy(ro) == wire.ReadOnlyPolicy(access=restricted([]))


def test_helper_policy_enables_platform_defaults_for_workspace_reads() -> None:
    ww = wire.WorkspaceWritePolicy(
        writable_roots=["/w"],
        read_only_access=restricted(["/r"], include_platform_defaults=False),
        network_access=True,
        exclude_slash_tmp=True,
    )
    assert helper_legacy_policy(ww) == wire.WorkspaceWritePolicy(
        writable_roots=["/w"],
        read_only_access=restricted(["/r"], include_platform_defaults=True),
        network_access=True,
        exclude_slash_tmp=True,
    )
    assert helper_legacy_policy(wire.DangerFullAccessPolicy()) == wire.DangerFullAccessPolicy()


def _ctx(policy: dict[str, Any], **extra: Any) -> msgspec.Raw:
    obj = {"sandboxPolicy": policy, "windowsSandboxLevel": "disabled", **extra}
    return msgspec.Raw(json.dumps(obj).encode())


def test_helper_strips_network_grants_keeps_fs_grants(tmp_path: Path) -> None:  # test 43
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    policy = {
        "type": "read-only",
        "access": {
            "type": "restricted",
            "include_platform_defaults": False,
            "readable_roots": [str(allowed)],
        },
    }
    extra = {"network": {"enabled": True}, "file_system": {"read": ["/R"], "write": ["/W"]}}
    cwd = str(tmp_path / "cwd")
    req = fs_context(decode_fs_sandbox(_ctx(policy, additionalPermissions=extra)), server_cwd=cwd)
    assert req is not None and not req.direct
    plan = req.helper_plan(platform_defaults=("/usr",), runtime_read_roots=("/py",))
    assert not plan.network
    assert plan.writable_roots == ("/W",)
    assert set(plan.readable_roots) >= {str(allowed), "/R", "/usr", "/py", cwd}
    # the pre-check ignores additional permissions (§10.1 note)
    assert req.resolve_access("/W/x") is Access.NONE
    assert req.resolve_access(str(allowed / "x")) is Access.READ


RO_ALLOWED = {
    "type": "read-only",
    "access": {
        "type": "restricted",
        "include_platform_defaults": False,
        "readable_roots": ["/srv/allowed"],
    },
}


@pytest.mark.parametrize(
    ("policy", "direct"),
    [
        ({"type": "danger-full-access"}, True),
        ({"type": "external-sandbox", "network_access": "restricted"}, True),
        ({"type": "read-only"}, False),
        (RO_ALLOWED, False),
        ({"type": "workspace-write"}, False),
    ],
)
def test_legacy_fs_routing(policy: dict[str, Any], direct: bool) -> None:
    req = fs_context(decode_fs_sandbox(_ctx(policy)), server_cwd="/srv/cwd")
    assert req is not None and req.generation is Generation.LEGACY
    assert req.direct is direct
    decided = route(decode_fs_sandbox(bytes(_ctx(policy))))
    assert decided.confined is (not direct)


def test_fs_routing_absent_and_null() -> None:
    assert fs_context(decode_fs_sandbox(None)) is None
    assert fs_context(decode_fs_sandbox(msgspec.Raw(b"null"))) is None
    assert not route(decode_fs_sandbox(None)).confined
    assert not route(decode_fs_sandbox(b" null ")).confined


def test_fs_context_pre_check_uses_server_cwd() -> None:
    req = fs_context(decode_fs_sandbox(_ctx(RO_ALLOWED)), server_cwd="/srv/cwd", probe=FakeProbe())
    assert req is not None
    assert req.resolve_access("/srv/allowed/note.txt") is Access.READ
    assert req.resolve_access("/srv/cwd/x") is Access.READ  # read-only includes the cwd
    assert req.resolve_access("/srv/blocked.txt") is Access.NONE
    assert req.resolve_access("relative.txt") is Access.READ  # joined to the cwd
    assert not req.can_write("/srv/allowed/note.txt")


def test_fs_context_workspace_write_pre_check() -> None:
    probe = FakeProbe(dirs={"/srv/allowed/.git"})
    ww = {
        "type": "workspace-write",
        "writable_roots": ["/srv/allowed"],
        "read_only_access": {"type": "restricted", "include_platform_defaults": False},
        "network_access": False,
        "exclude_tmpdir_env_var": True,
        "exclude_slash_tmp": True,
    }
    req = fs_context(decode_fs_sandbox(_ctx(ww)), server_cwd="/srv/cwd", probe=probe)
    assert req is not None
    assert req.can_write("/srv/allowed/new.txt")
    assert req.resolve_access("/srv/allowed/.git/config") is Access.READ
    assert req.can_write("/srv/cwd/out.txt")
    assert req.resolve_access("/srv/outside/x") is Access.NONE
    assert req.resolve_access("/tmp/x") is Access.NONE


def test_fs_context_accepts_launch_config_shape() -> None:
    cfg = {
        "sandboxPreference": "auto",
        "policy": RO_ALLOWED,
        "fileSystemPolicy": {"kind": "restricted"},
        "networkPolicy": "restricted",
        "sandboxPolicyCwd": "/x",
        "enforceManagedNetwork": False,
        "windowsSandboxLevel": "disabled",
        "windowsSandboxPrivateDesktop": False,
        "useLegacyLandlock": False,
    }
    req = fs_context(decode_fs_sandbox(json.dumps(cfg).encode()), server_cwd="/srv/cwd")
    assert req is not None and not req.direct
    assert req.resolve_access("/srv/allowed/a") is Access.READ


def test_fs_context_missing_permissions() -> None:
    with pytest.raises(InvalidParamsError, match="missing field `permissions`"):
        fs_context(decode_fs_sandbox(msgspec.Raw(b'{"windowsSandboxLevel":"disabled"}')))
    with pytest.raises(InvalidParamsError, match=r"sandbox\.sandboxPolicy\.type"):
        fs_context(decode_fs_sandbox(_ctx({"type": "nope"})))
    with pytest.raises(InvalidParamsError, match="windowsSandboxLevel"):
        fs_context(decode_fs_sandbox(msgspec.Raw(b'{"sandboxPolicy":{"type":"read-only"}}')))


# --- current client: scope (CLIENT_COMPAT §1.5) and fs routing ---


def _current(perms: dict[str, Any], **extra: Any) -> msgspec.Raw:
    return msgspec.Raw(
        json.dumps({"permissions": perms, "windowsSandboxLevel": "disabled", **extra}).encode()
    )


MANAGED_WS = {
    "type": "managed",
    "file_system": {
        "type": "restricted",
        "entries": [
            {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
            {"path": {"type": "special", "value": {"kind": "project_roots"}}, "access": "write"},
            {
                "path": {"type": "special", "value": {"kind": "current_working_directory"}},
                "access": "read",
            },
        ],
    },
    "network": "restricted",
}


@pytest.mark.parametrize(
    ("extra", "cwd", "roots"),
    [
        ({}, "/proc-cwd", ()),
        ({"cwd": "file:///c"}, "/c", ()),
        ({"cwd": "/c", "workspaceRoots": ["/r1", "file:///r2"]}, "/c", ("/r1", "/r2")),
        (
            {"cwd": "/c", "workspaceRoots": ["/r1"], "policyContext": {"cwd": "/pc"}},
            "/pc",
            (),
        ),
        (
            {
                "cwd": "/c",
                "workspaceRoots": ["/r1"],
                "policyContext": {"workspaceRoots": ["/p1", "/p1"]},
            },
            "/c",
            ("/p1",),
        ),
    ],
)
def test_current_scope_rules(extra: dict[str, Any], cwd: str, roots: tuple[str, ...]) -> None:
    ctx = decode_launch_sandbox(_current(MANAGED_WS, **extra))
    req = launch_request(ctx, command_cwd="/proc-cwd")
    assert (req.cwd, req.roots) == (cwd, roots)


def test_current_project_roots_expand_to_every_root() -> None:
    value = _current(MANAGED_WS, cwd="/c", workspaceRoots=["/r1", "/r2"])
    req = fs_context(decode_fs_sandbox(value), server_cwd="/srv", probe=FakeProbe())
    assert req is not None and not req.direct
    assert req.can_write("/r1/a") and req.can_write("/r2/b")
    # current_working_directory also means the workspace roots (0.163.0), not cwd
    assert req.resolve_access("/c/x") is Access.READ  # via root: read only
    no_roots = fs_context(decode_fs_sandbox(_current(MANAGED_WS, cwd="/c")), server_cwd="/srv")
    assert no_roots is not None and not no_roots.can_write("/c/x")


@pytest.mark.parametrize(
    ("perms", "direct"),
    [
        ({"type": "disabled"}, True),
        ({"type": "external", "network": "restricted"}, True),
        (
            {"type": "managed", "file_system": {"type": "unrestricted"}, "network": "restricted"},
            True,
        ),
        (
            {
                "type": "managed",
                "file_system": {
                    "type": "restricted",
                    "entries": [
                        {"path": {"type": "special", "value": {"kind": "root"}}, "access": "write"}
                    ],
                },
                "network": "restricted",
            },
            True,
        ),
        (MANAGED_WS, False),
    ],
)
def test_current_fs_routing(perms: dict[str, Any], direct: bool) -> None:
    req = fs_context(decode_fs_sandbox(_current(perms)), server_cwd="/srv")
    assert req is not None and req.generation is Generation.CURRENT
    assert req.direct is direct


def test_current_helper_plan_adds_platform_defaults_when_reads_restricted() -> None:
    perms = {
        "type": "managed",
        "file_system": {
            "type": "restricted",
            "entries": [
                {"path": {"type": "path", "path": "file:///data"}, "access": "read"},
            ],
        },
        "network": "enabled",
    }
    ctx = decode_fs_sandbox(_current(perms))
    req = fs_context(ctx, server_cwd="/srv", probe=FakeProbe({"/usr"}))
    assert req is not None
    plan = req.helper_plan(platform_defaults=("/usr", "/missing"))
    assert plan.readable_roots == ("/data", "/usr")
    assert not plan.network


# --- CLI policies ---


def test_cli_policies() -> None:
    probe = FakeProbe()
    ro = cli_launch_request("read-only", cwd="/w", probe=probe)
    assert ro.fs_policy == FileSystemPolicy.restricted([sp(ROOT, R)])
    assert ro.network is Network.RESTRICTED
    assert ro.needs_platform_sandbox
    ww = cli_launch_request(
        "workspace-write", cwd="/w/", writable_roots=["/x/../y"], network=True, probe=probe
    )
    assert p("/y", W) in ww.fs_policy.entries and p("/x/../y", W) not in ww.fs_policy.entries
    assert ww.cwd == "/w"
    assert ww.network is Network.ENABLED
    full = cli_launch_request("danger-full-access", cwd="/w", probe=probe)
    assert not full.needs_platform_sandbox


@pytest.mark.parametrize(
    ("mode", "kwargs", "needle"),
    [
        ("workspace-write", {"writable_roots": ["rel"]}, "--writable-root must be an absolute"),
        ("read-only", {"writable_roots": ["/abs"]}, "--writable-root needs"),
        ("yolo", {}, "--sandbox: unknown mode"),
    ],
)
def test_cli_policy_errors(mode: str, kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(SandboxPolicyError, match=needle):
        cli_launch_request(mode, cwd="/w", **kwargs)
    with pytest.raises(SandboxPolicyError, match="cwd must be absolute"):
        cli_launch_request("read-only", cwd="rel")


def _os_probe() -> Any:
    from exec_server.sandbox.policy import OsProbe

    return OsProbe()


# --- §10.1 root-alias normalisation and server cwd ---


def test_root_alias_normalize_keeps_nested_symlinks(tmp_path: Path) -> None:
    from exec_server.sandbox.convert import root_alias_normalize

    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    # a symlink below the top level is user data: its lexical form is kept
    nested = str(tmp_path / "link" / "missing" / "file.txt")
    assert root_alias_normalize(nested) == nested
    plain = str(real / "a")
    assert root_alias_normalize(plain) == plain
    assert root_alias_normalize("/") == "/"


def test_root_alias_normalize_resolves_top_level_alias(monkeypatch: pytest.MonkeyPatch) -> None:
    """macOS ``/var`` → ``/private/var``, simulated with a fake filesystem."""
    from exec_server.sandbox import convert

    links = {"/var": "/private/var"}
    existing = {"/", "/var", "/var/folders", "/private", "/private/var", "/private/var/folders"}

    def lexists(path: str) -> bool:
        return path in existing

    def islink(path: str) -> bool:
        return path in links

    def realpath(path: str) -> str:
        for alias, target in links.items():
            if path == alias or path.startswith(alias + "/"):
                return target + path[len(alias) :]
        return path

    monkeypatch.setattr(os.path, "lexists", lexists)
    monkeypatch.setattr(os.path, "islink", islink)
    monkeypatch.setattr(os.path, "realpath", realpath)
    assert convert.root_alias_normalize("/var/folders/x/new.txt") == (
        "/private/var/folders/x/new.txt"
    )
    assert convert.root_alias_normalize("/srv/other") == "/srv/other"


def test_unreadable_server_cwd_is_internal_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from exec_server.exceptions import InternalError, from_domain_error
    from exec_server.sandbox.errors import SandboxError

    def gone() -> str:
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(os, "getcwd", gone)
    with pytest.raises(SandboxError, match="failed to read current dir: No such file") as info:
        fs_context(decode_fs_sandbox(_ctx(RO_ALLOWED)))
    assert type(from_domain_error(info.value)) is InternalError
