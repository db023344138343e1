"""Sandbox manager: selection (PROTOCOL.md §7.2-§7.3), transform (§7.4-§7.5), fail-closed errors."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec
import pytest

from exec_server.config import ServerConfig
from exec_server.exceptions import ErrorCode, InvalidParamsError, from_domain_error
from exec_server.process.spec import LaunchSpec
from exec_server.protocol.types.sandbox import decode_launch_sandbox
from exec_server.sandbox.convert import (
    Generation,
    LaunchSandboxRequest,
    launch_request,
)
from exec_server.sandbox.errors import SandboxUnavailableError
from exec_server.sandbox.manager import (
    NETWORK_DISABLED_ENV,
    SandboxLaunchError,
    SandboxManager,
    select_sandbox_type,
)
from exec_server.sandbox.plan import SandboxPlan, SandboxType
from exec_server.sandbox.policy import (
    Access,
    FileSystemPolicy,
    FsEntry,
    Network,
    SpecialKind,
    SpecialTarget,
)

LINUX, MAC, NONE = SandboxType.LINUX_SECCOMP, SandboxType.MACOS_SEATBELT, SandboxType.NONE
UNRESTRICTED = {"kind": "unrestricted"}
ROOT_READ = {
    "kind": "restricted",
    "entries": [{"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"}],
}
ROOT_WRITE = {
    "kind": "restricted",
    "entries": [{"path": {"type": "special", "value": {"kind": "root"}}, "access": "write"}],
}


def legacy(
    preference: str = "auto",
    *,
    fs: dict[str, Any] | None = None,
    network: str = "enabled",
    policy: dict[str, Any] | None = None,
    managed: bool = False,
    cwd: str = "/srv/proj",
    **extra: Any,
) -> msgspec.Raw:
    obj = {
        "sandboxPreference": preference,
        "policy": policy or {"type": "danger-full-access"},
        "fileSystemPolicy": fs or UNRESTRICTED,
        "networkPolicy": network,
        "sandboxPolicyCwd": cwd,
        "additionalPermissions": None,
        "enforceManagedNetwork": managed,
        "windowsSandboxLevel": "disabled",
        "windowsSandboxPrivateDesktop": False,
        "useLegacyLandlock": False,
        **extra,
    }
    return msgspec.Raw(json.dumps(obj).encode())


def current(perms: dict[str, Any], **extra: Any) -> msgspec.Raw:
    obj = {"permissions": perms, "windowsSandboxLevel": "disabled", **extra}
    return msgspec.Raw(json.dumps(obj).encode())


def req(raw: msgspec.Raw | None, **kwargs: Any) -> LaunchSandboxRequest:
    return launch_request(decode_launch_sandbox(raw), command_cwd="/srv/proj", **kwargs)


# --- §7.3 selection matrix ---

SELECTION = [
    # (request, platform, expected)
    (legacy("auto", fs=UNRESTRICTED, network="enabled"), LINUX, NONE),  # §15.7 test 53
    (legacy("auto", fs=UNRESTRICTED, network="enabled", managed=True), LINUX, LINUX),  # 54
    (legacy("auto", fs=ROOT_READ, network="enabled"), LINUX, LINUX),  # 55
    (legacy("auto", fs=UNRESTRICTED, network="restricted"), LINUX, LINUX),  # 56
    (legacy("auto", fs=UNRESTRICTED, network="restricted"), NONE, NONE),  # 56, no platform
    (legacy("auto", fs=ROOT_WRITE, network="enabled"), LINUX, NONE),
    (legacy("auto", fs={"kind": "external-sandbox"}, network="restricted"), LINUX, NONE),
    (legacy("auto", fs=ROOT_READ, network="enabled"), MAC, MAC),
    (legacy("forbid", fs=ROOT_READ, network="restricted"), LINUX, NONE),
    (legacy("require", fs=UNRESTRICTED, network="enabled"), LINUX, LINUX),
    (legacy("require", fs=UNRESTRICTED, network="enabled"), MAC, MAC),
    (legacy("require", fs=UNRESTRICTED, network="enabled"), NONE, NONE),
    (None, LINUX, NONE),
    (msgspec.Raw(b"null"), LINUX, NONE),
    (current({"type": "disabled"}), LINUX, NONE),
    (current({"type": "external", "network": "enabled"}), LINUX, NONE),
    # the current client blocks network for external + restricted (CLIENT_COMPAT §1.6)
    (current({"type": "external", "network": "restricted"}), LINUX, LINUX),
    (
        current(
            {"type": "managed", "file_system": {"type": "unrestricted"}, "network": "restricted"}
        ),
        LINUX,
        LINUX,
    ),
    (
        current(
            {
                "type": "managed",
                "file_system": {"type": "restricted", "entries": ROOT_WRITE["entries"]},
                "network": "enabled",
            }
        ),
        LINUX,
        NONE,
    ),
    (
        current(
            {
                "type": "managed",
                "file_system": {"type": "restricted", "entries": ROOT_READ["entries"]},
                "network": "enabled",
            }
        ),
        LINUX,
        LINUX,
    ),
]


@pytest.mark.parametrize(("raw", "platform", "expected"), SELECTION)
def test_selection(raw: msgspec.Raw | None, platform: SandboxType, expected: SandboxType) -> None:
    assert select_sandbox_type(req(raw), platform) is expected


def test_current_managed_network_flag_requires_sandbox() -> None:
    raw = current({"type": "disabled"})
    assert select_sandbox_type(req(raw), LINUX) is NONE
    assert select_sandbox_type(req(raw, enforce_managed_network=True), LINUX) is LINUX


def test_selection_uses_effective_policies() -> None:
    """Additional permissions enabling the network make a network-only sandbox unnecessary."""
    raw = legacy(
        "auto",
        fs={"kind": "external-sandbox"},
        network="restricted",
        additionalPermissions={"network": {"enabled": True}},
    )
    request = req(raw)
    assert request.network is Network.ENABLED
    assert select_sandbox_type(request, LINUX) is NONE


# --- transform ---


class FakeBackend:
    name = "fake"

    def __init__(self) -> None:
        self.calls: list[tuple[LaunchSpec, SandboxPlan]] = []

    def wrap(self, spec: LaunchSpec, plan: SandboxPlan) -> LaunchSpec:
        self.calls.append((spec, plan))
        return replace(spec, argv=["/fake/wrapper", "--", *spec.argv], arg0=None)


class FakeSelector:
    def __init__(self, backend: FakeBackend | None, error: Exception | None = None) -> None:
        self.backend = backend
        self.error = error
        self.calls: list[tuple[str, bool]] = []

    def __call__(self, backend: str = "auto", *, allow_unsandboxed: bool = False) -> Any:
        self.calls.append((backend, allow_unsandboxed))
        if self.error is not None:
            raise self.error
        if self.backend is None and not allow_unsandboxed:
            raise SandboxUnavailableError("no usable Linux sandbox (auto): nothing works")
        return self.backend


def spec(**kwargs: Any) -> LaunchSpec:
    base: dict[str, Any] = {
        "argv": ["/bin/sh", "-c", "true"],
        "cwd": "/srv/proj",
        "env": {"PATH": "/usr/bin:/bin", "TMPDIR": "/var/tmp/me"},
    }
    base.update(kwargs)
    return LaunchSpec(**base)


def manager(
    platform: SandboxType = LINUX,
    backend: FakeBackend | None = None,
    *,
    allow_unsandboxed: bool = False,
    sandbox_backend: Any = "auto",
    error: Exception | None = None,
) -> tuple[SandboxManager, FakeSelector]:
    selector = FakeSelector(backend, error)
    config = ServerConfig(allow_unsandboxed=allow_unsandboxed, sandbox_backend=sandbox_backend)
    return SandboxManager(config, platform=platform, selector=selector), selector


WW_POLICY = {
    "type": "workspace-write",
    "network_access": False,
    "exclude_tmpdir_env_var": False,
    "exclude_slash_tmp": True,
}
WW_FS = {
    "kind": "restricted",
    "entries": [
        {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
        {
            "path": {"type": "special", "value": {"kind": "current_working_directory"}},
            "access": "write",
        },
        {"path": {"type": "special", "value": {"kind": "tmpdir"}}, "access": "write"},
    ],
}


def test_legacy_workspace_write_is_wrapped_with_plan() -> None:
    backend = FakeBackend()
    mgr, selector = manager(backend=backend, sandbox_backend="bwrap")
    original = spec()
    ctx = decode_launch_sandbox(legacy("auto", fs=WW_FS, network="restricted", policy=WW_POLICY))
    out = mgr.prepare(original, ctx)
    assert out.argv == ["/fake/wrapper", "--", "/bin/sh", "-c", "true"]
    assert out.sandbox_type is LINUX
    assert (out.sandbox_type.value, out.sandbox_type.camel) == ("linux-seccomp", "linuxSeccomp")
    assert out.env[NETWORK_DISABLED_ENV] == "1"
    assert selector.calls == [("bwrap", False)]
    ((wrapped_spec, plan),) = backend.calls
    assert wrapped_spec.env[NETWORK_DISABLED_ENV] == "1"  # backends see the final env
    assert plan.full_read and not plan.full_write and not plan.network
    # tmpdir resolves from the child's env
    assert set(plan.writable_roots) == {"/srv/proj", "/var/tmp/me"}
    assert plan.cwd == "/srv/proj"
    # the request spec is untouched
    assert original.argv == ["/bin/sh", "-c", "true"] and NETWORK_DISABLED_ENV not in original.env
    assert original.sandbox_type is NONE


def test_legacy_forbid_with_restricted_network_marks_env_only() -> None:
    mgr, selector = manager(backend=FakeBackend())
    ctx = decode_launch_sandbox(legacy("forbid", fs=ROOT_READ, network="restricted"))
    out = mgr.prepare(spec(), ctx)
    assert out.argv == ["/bin/sh", "-c", "true"]
    assert out.sandbox_type is NONE
    assert out.env[NETWORK_DISABLED_ENV] == "1"
    assert selector.calls == []


def test_no_sandbox_runs_directly_and_env_is_exact() -> None:
    mgr, selector = manager(backend=FakeBackend())
    for raw in (None, legacy("forbid"), current({"type": "disabled"})):
        original = spec(arg0="custom")
        out = mgr.prepare(original, decode_launch_sandbox(raw))
        assert out.argv == original.argv and out.env == original.env
        assert out.arg0 == "custom" and out.sandbox_type is NONE
    assert selector.calls == []


def test_current_client_env_is_not_marked() -> None:
    """Upstream 0.163.0 adds nothing to the env; the client sets the marker itself."""
    backend = FakeBackend()
    mgr, _ = manager(backend=backend)
    perms = {"type": "managed", "file_system": {"type": "unrestricted"}, "network": "restricted"}
    out = mgr.prepare(spec(), decode_launch_sandbox(current(perms)))
    assert out.sandbox_type is LINUX
    assert NETWORK_DISABLED_ENV not in out.env
    ((_, plan),) = backend.calls
    assert plan.full_read and plan.full_write and not plan.network


def test_current_recorded_shell_plan(tmp_path: Path) -> None:
    ws = tmp_path / "workspace"
    (ws / ".git").mkdir(parents=True)
    entries = [
        {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
        {"path": {"type": "special", "value": {"kind": "project_roots"}}, "access": "write"},
        {"path": {"type": "special", "value": {"kind": "tmpdir"}}, "access": "write"},
        {
            "path": {"type": "special", "value": {"kind": "project_roots", "subpath": ".codex"}},
            "access": "read",
            "missing_path_behavior": "skip",
        },
    ]
    perms = {
        "type": "managed",
        "file_system": {"type": "restricted", "entries": entries},
        "network": "restricted",
    }
    uri = "file://" + str(ws)
    backend = FakeBackend()
    mgr, _ = manager(backend=backend)
    out = mgr.prepare(
        spec(cwd=str(ws), env={"TMPDIR": str(tmp_path / "t")}),
        decode_launch_sandbox(current(perms, cwd=uri, workspaceRoots=[uri])),
    )
    assert out.sandbox_type is LINUX
    ((_, plan),) = backend.calls
    assert set(plan.writable_roots) == {str(ws), str(tmp_path / "t")}
    assert set(plan.read_only_subpaths) == {str(ws / ".git"), str(ws / ".codex")}


def test_require_without_platform_sandbox_fails_closed() -> None:
    mgr, _ = manager(platform=NONE, allow_unsandboxed=True)
    with pytest.raises(SandboxLaunchError) as info:
        mgr.prepare(spec(), decode_launch_sandbox(legacy("require")))
    mapped = from_domain_error(info.value)
    assert mapped is not None and mapped.code is ErrorCode.INTERNAL_ERROR
    assert info.value.message.startswith("failed to build sandbox launch: ")
    assert "sandboxPreference" in info.value.message


def test_require_without_backend_fails_even_when_unsandboxed_allowed() -> None:
    mgr, selector = manager(backend=None, allow_unsandboxed=True)
    with pytest.raises(SandboxLaunchError, match="no usable Linux sandbox"):
        mgr.prepare(spec(), decode_launch_sandbox(legacy("require")))
    assert selector.calls == [("auto", False)]


def test_needed_sandbox_without_backend_fails_closed() -> None:
    mgr, _ = manager(backend=None)
    with pytest.raises(SandboxLaunchError) as info:
        ctx = decode_launch_sandbox(legacy("auto", fs=ROOT_READ, network="restricted"))
        mgr.prepare(spec(), ctx)
    assert info.value.message == (
        "failed to build sandbox launch: no usable Linux sandbox (auto): nothing works"
    )


def test_allow_unsandboxed_runs_auto_launch_unconfined() -> None:
    mgr, selector = manager(backend=None, allow_unsandboxed=True)
    ctx = decode_launch_sandbox(legacy("auto", fs=ROOT_READ, network="restricted"))
    out = mgr.prepare(spec(), ctx)
    assert out.argv == ["/bin/sh", "-c", "true"] and out.sandbox_type is NONE
    assert out.env[NETWORK_DISABLED_ENV] == "1"
    assert selector.calls == [("auto", True)]


def test_backend_error_becomes_launch_error() -> None:
    class Broken(FakeBackend):
        def wrap(self, spec: LaunchSpec, plan: SandboxPlan) -> LaunchSpec:
            raise SandboxUnavailableError("bwrap at /ws/bwrap lies inside a writable root")

    mgr, _ = manager(backend=Broken())
    with pytest.raises(SandboxLaunchError, match="lies inside a writable root"):
        mgr.prepare(spec(), decode_launch_sandbox(legacy("require")))


def test_forced_type_from_older_sandbox_member() -> None:
    obj = json.loads(bytes(legacy("auto")))
    del obj["sandboxPreference"]
    obj["sandbox"] = "macos-seatbelt"
    mgr, _ = manager(backend=FakeBackend())
    with pytest.raises(SandboxLaunchError, match="seatbelt sandbox is only available on macOS"):
        mgr.prepare(spec(), decode_launch_sandbox(msgspec.Raw(json.dumps(obj).encode())))
    obj["sandbox"] = "linux-seccomp"
    out = mgr.prepare(spec(), decode_launch_sandbox(msgspec.Raw(json.dumps(obj).encode())))
    assert out.sandbox_type is LINUX
    obj["sandbox"] = "none"
    ctx = decode_launch_sandbox(msgspec.Raw(json.dumps(obj).encode()))
    assert mgr.prepare(spec(), ctx).sandbox_type is NONE


def test_macos_platform_uses_seatbelt() -> None:
    mgr, selector = manager(platform=MAC)
    ctx = decode_launch_sandbox(legacy("auto", fs=WW_FS, network="restricted"))
    out = mgr.prepare(spec(arg0="ignored"), ctx)
    assert out.sandbox_type is MAC
    assert (out.sandbox_type.value, out.sandbox_type.camel) == ("macos-seatbelt", "macosSeatbelt")
    assert out.argv[:2] == ["/usr/bin/sandbox-exec", "-p"]
    assert out.argv[-4:] == ["--", "/bin/sh", "-c", "true"]
    assert out.arg0 is None
    assert out.env["CODEX_SANDBOX"] == "seatbelt"
    assert out.env[NETWORK_DISABLED_ENV] == "1"
    assert selector.calls == []


def test_malformed_sandbox_is_invalid_params() -> None:
    mgr, _ = manager(backend=FakeBackend())
    with pytest.raises(InvalidParamsError, match=r"sandbox\.policy\.type"):
        mgr.prepare(spec(), decode_launch_sandbox(legacy(policy={"type": "yolo"})))


def test_wrap_plan_for_helper() -> None:
    backend = FakeBackend()
    mgr, selector = manager(backend=backend, allow_unsandboxed=True)
    plan = SandboxPlan(full_read=False, full_write=False, network=False, cwd="/srv")
    out = mgr.wrap_plan(spec(env={}), plan)
    assert out.sandbox_type is LINUX and out.env == {NETWORK_DISABLED_ENV: "1"}
    assert selector.calls == [("auto", False)]  # the helper is never allowed unconfined
    with pytest.raises(SandboxLaunchError):
        manager(platform=NONE)[0].wrap_plan(spec(), plan)


def test_request_generation_and_plan_network() -> None:
    request = req(legacy("auto", fs=ROOT_READ, network="enabled", managed=True))
    assert request.generation is Generation.LEGACY
    # managed networking without a proxy means no direct network
    assert not request.plan(tmpdir=None, platform_defaults=()).network
    policy = FileSystemPolicy.restricted([FsEntry(SpecialTarget(SpecialKind.ROOT), Access.READ)])
    assert (
        LaunchSandboxRequest(Generation.LEGACY, policy, Network.ENABLED, "/", ("/",))
        .plan(tmpdir=None)
        .network
    )


# --- one real launch through the configured backend (skips when none is usable) ---


def test_real_backend_denies_write_outside_workspace(tmp_path: Path) -> None:
    """§15.5 test 19 without the server: wire JSON → manager → kernel says no."""
    from exec_server.sandbox.select import select_backend

    try:
        select_backend("auto")
    except Exception as exc:  # probe failure: environment without any sandbox
        pytest.skip(f"no usable Linux sandbox here: {exc}")
    ws = tmp_path / "ws"
    ws.mkdir()
    outside = tmp_path / "outside.txt"
    policy = {
        "type": "workspace-write",
        "network_access": False,
        "exclude_tmpdir_env_var": True,
        "exclude_slash_tmp": True,
    }
    fs = {
        "kind": "restricted",
        "entries": [
            {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
            {
                "path": {"type": "special", "value": {"kind": "current_working_directory"}},
                "access": "write",
            },
        ],
    }
    raw = legacy("require", fs=fs, network="restricted", policy=policy, cwd=str(ws))
    mgr = SandboxManager(ServerConfig())
    launch = mgr.prepare(
        LaunchSpec(
            argv=["/bin/sh", "-c", f"echo in > inside.txt; echo out > {outside}"],
            cwd=str(ws),
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        ),
        decode_launch_sandbox(raw),
    )
    assert launch.sandbox_type is LINUX
    try:
        proc = subprocess.run(
            launch.argv,
            executable=launch.argv[0],
            cwd=launch.cwd,
            env=launch.env,
            pass_fds=launch.pass_fds,
            capture_output=True,
            timeout=60,
            check=False,
        )
    finally:
        for fd in launch.pass_fds:
            os.close(fd)
        if launch.cleanup is not None:
            launch.cleanup()
    assert proc.returncode != 0
    assert (ws / "inside.txt").read_text() == "in\n"
    assert not outside.exists()
