"""Seatbelt profile text and ``sandbox-exec`` argv (SANDBOX.md §4): golden text, runs anywhere."""

from __future__ import annotations

import pytest

from exec_server.process.spec import LaunchSpec
from exec_server.sandbox.macos import seatbelt
from exec_server.sandbox.macos.seatbelt import (
    BASE_POLICY,
    NETWORK_POLICY,
    PLATFORM_DEFAULTS_POLICY,
    SANDBOX_EXEC,
    build,
    regex_escape,
    wrap,
)
from exec_server.sandbox.plan import SandboxPlan, SandboxType


def fake_realpath(path: str) -> str:
    """macOS aliases: /tmp and /var live under /private."""
    for alias in ("/tmp", "/var"):
        if path == alias or path.startswith(alias + "/"):
            return "/private" + path
    return path


def plan(**kwargs: object) -> SandboxPlan:
    base: dict[str, object] = {
        "full_read": True,
        "full_write": False,
        "network": False,
        "cwd": "/ws",
    }
    base.update(kwargs)
    return SandboxPlan(**base)  # type: ignore[arg-type]


def test_full_access_profile_composition() -> None:
    cmd = build(plan(full_write=True, network=True), realpath=fake_realpath)
    expected = "\n".join(
        [
            BASE_POLICY,
            "; allow read-only file operations\n(allow file-read*)",
            '(allow file-write* (regex #"^/"))',
            "",
            NETWORK_POLICY,
            "",
        ]
    )
    assert cmd.profile == expected
    assert cmd.params == ()


WORKSPACE_WRITE_SECTIONS = (
    "; allow read-only file operations\n(allow file-read*)",
    "(allow file-write*\n"
    '(require-all (subpath (param "WRITABLE_ROOT_0")) '
    '(require-not (literal (param "WRITABLE_ROOT_0_EXCLUDED_0"))) '
    '(require-not (subpath (param "WRITABLE_ROOT_0_EXCLUDED_0"))) '
    '(require-not (regex #"^/ws/\\.git(/.*)?$")) '
    '(require-not (regex #"^/ws/\\.agents(/.*)?$")) '
    '(require-not (regex #"^/ws/\\.codex(/.*)?$")) ) '
    '(require-all (subpath (param "WRITABLE_ROOT_1")) '
    '(require-not (regex #"^/private/tmp/\\.git(/.*)?$")) '
    '(require-not (regex #"^/private/tmp/\\.agents(/.*)?$")) '
    '(require-not (regex #"^/private/tmp/\\.codex(/.*)?$")) )'
    "\n)",
)


def test_workspace_write_golden() -> None:
    cmd = build(
        plan(writable_roots=("/ws", "/tmp"), read_only_subpaths=("/ws/.git",)),
        realpath=fake_realpath,
    )
    read, write = WORKSPACE_WRITE_SECTIONS
    assert cmd.profile == "\n".join([BASE_POLICY, read, write, "", "", ""])
    assert cmd.params == (
        ("WRITABLE_ROOT_0", "/ws"),
        ("WRITABLE_ROOT_0_EXCLUDED_0", "/ws/.git"),
        ("WRITABLE_ROOT_1", "/private/tmp"),
    )


def test_restricted_read_golden_and_param_order() -> None:
    cmd = build(
        plan(
            full_read=False,
            readable_roots=("/data", "/var/lib/x"),
            writable_roots=("/ws",),
            denied_paths=("/ws/secret",),
            network=True,
        ),
        include_platform_defaults=True,
        realpath=fake_realpath,
        user_cache_dir="/var/folders/ab/C",
    )
    read = (
        "; allow read-only file operations\n"
        "(allow file-read*\n"
        '(subpath (param "READABLE_ROOT_0")) (subpath (param "READABLE_ROOT_1")) '
        '(subpath (param "READABLE_ROOT_2"))\n)'
    )
    write = (
        "(allow file-write*\n"
        '(require-all (subpath (param "WRITABLE_ROOT_0")) '
        '(require-not (regex #"^/ws/\\.git(/.*)?$")) '
        '(require-not (regex #"^/ws/\\.agents(/.*)?$")) '
        '(require-not (regex #"^/ws/\\.codex(/.*)?$")) )\n)'
    )
    deny = '(deny file-read* file-write*\n(subpath (param "DENIED_PATH_0"))\n)'
    assert cmd.profile == "\n".join(
        [BASE_POLICY, read, write, deny, NETWORK_POLICY, PLATFORM_DEFAULTS_POLICY]
    )
    # read params, write params, denials, then DARWIN_USER_CACHE_DIR; values canonicalised
    assert cmd.params == (
        ("READABLE_ROOT_0", "/data"),
        ("READABLE_ROOT_1", "/private/var/lib/x"),
        ("READABLE_ROOT_2", "/ws"),
        ("WRITABLE_ROOT_0", "/ws"),
        ("DENIED_PATH_0", "/ws/secret"),
        ("DARWIN_USER_CACHE_DIR", "/private/var/folders/ab/C"),
    )


def test_read_only_without_roots_has_empty_sections() -> None:
    cmd = build(plan(full_read=False), realpath=fake_realpath)
    assert cmd.profile == "\n".join(
        [BASE_POLICY, "; allow read-only file operations\n", "", "", "", ""]
    )
    # platform defaults only when asked for and reads are restricted
    with_defaults = build(plan(full_read=False), include_platform_defaults=True)
    assert with_defaults.profile.endswith("\n" + PLATFORM_DEFAULTS_POLICY)
    full = build(plan(full_read=True), include_platform_defaults=True)
    assert PLATFORM_DEFAULTS_POLICY not in full.profile


def test_root_writable_with_exclusions_guards_from_slash() -> None:
    cmd = build(plan(writable_roots=("/",), read_only_subpaths=("/etc",)), realpath=str)
    assert '(require-not (regex #"^/\\.git(/.*)?$"))' in cmd.profile
    assert ("WRITABLE_ROOT_0_EXCLUDED_0", "/etc") in cmd.params


def test_excluded_paths_belong_to_their_root_only() -> None:
    cmd = build(
        plan(writable_roots=("/a", "/b"), read_only_subpaths=("/b/.git", "/c/ro")), realpath=str
    )
    assert cmd.params == (
        ("WRITABLE_ROOT_0", "/a"),
        ("WRITABLE_ROOT_1", "/b"),
        ("WRITABLE_ROOT_1_EXCLUDED_0", "/b/.git"),
    )


def test_paths_never_appear_in_profile_except_guards() -> None:
    cmd = build(
        plan(
            full_read=False,
            readable_roots=("/secret-data",),
            writable_roots=("/work dir",),
            read_only_subpaths=("/work dir/.git",),
            denied_paths=("/work dir/private",),
        ),
        realpath=str,
    )
    assert "/secret-data" not in cmd.profile
    assert "/work dir/private" not in cmd.profile
    assert '"/work dir' not in cmd.profile


def test_escaping() -> None:
    assert regex_escape("/a.b/c+d(x)[y]{z}|^$*?\\") == (
        "/a\\.b/c\\+d\\(x\\)\\[y\\]\\{z\\}\\|\\^\\$\\*\\?\\\\"
    )
    assert regex_escape("/plain-path_with~chars & spaces") == "/plain-path_with~chars & spaces"
    cmd = build(plan(writable_roots=('/w"q.x',)), realpath=str)
    assert '(require-not (regex #"^/w\\"q\\.x/\\.git(/.*)?$"))' in cmd.profile


def test_argv_shape() -> None:
    cmd = build(plan(writable_roots=("/ws",)), realpath=str)
    argv = cmd.argv(["/bin/echo", "hi"])
    assert argv == [
        SANDBOX_EXEC,
        "-p",
        cmd.profile,
        "-DWRITABLE_ROOT_0=/ws",
        "--",
        "/bin/echo",
        "hi",
    ]
    assert SANDBOX_EXEC == "/usr/bin/sandbox-exec"


@pytest.mark.parametrize(("network", "marker"), [(False, "1"), (True, None)])
def test_wrap_sets_env_and_type(network: bool, marker: str | None) -> None:
    spec = LaunchSpec(argv=["ls", "-l"], cwd="/ws", env={"A": "b"}, arg0="custom")
    out = wrap(spec, plan(network=network))
    assert out.argv[0] == SANDBOX_EXEC and out.argv[-3:] == ["--", "ls", "-l"]
    assert out.env["CODEX_SANDBOX"] == "seatbelt" and out.env["A"] == "b"
    assert out.env.get("CODEX_SANDBOX_NETWORK_DISABLED") == marker
    assert out.arg0 is None and out.cwd == "/ws"
    assert out.sandbox_type is SandboxType.MACOS_SEATBELT
    assert spec.env == {"A": "b"} and spec.argv == ["ls", "-l"]


def test_base_policy_essentials() -> None:
    assert BASE_POLICY.startswith("(version 1)\n")
    for rule in (
        "(deny default)",
        "(allow process-exec)",
        "(allow process-fork)",
        "(allow signal (target same-sandbox))",
        "(allow process-info* (target same-sandbox))",
        '(sysctl-name "kern.grade_cputype")',
        '(iokit-registry-entry-class "RootDomainUserClient")',
        '(global-name "com.apple.system.opendirectoryd.libinfo")',
        "(allow ipc-posix-sem)",
        "(allow pseudo-tty)",
        "(allow user-preference-read)",
        "(with no-sandbox)",
    ):
        assert rule in BASE_POLICY
    assert "network-outbound" not in BASE_POLICY  # network only via NETWORK_POLICY
    for service in ("com.apple.trustd.agent", "com.apple.SystemConfiguration.configd"):
        assert service in NETWORK_POLICY


@pytest.mark.parametrize(
    "profile_plan",
    [
        plan(full_write=True, network=True),
        plan(writable_roots=("/a", "/b"), read_only_subpaths=("/a/.git",)),
        plan(full_read=False, readable_roots=("/x",), denied_paths=("/x/y",), network=True),
    ],
)
def test_profiles_have_balanced_parentheses(profile_plan: SandboxPlan) -> None:
    text = build(profile_plan, include_platform_defaults=True, realpath=str).profile
    depth = 0
    in_string = False
    escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"':
            in_string = True
        elif ch == ";":
            continue
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            assert depth >= 0
    assert depth == 0 and not in_string


def test_darwin_user_cache_dir_is_optional_off_macos() -> None:
    value = seatbelt.darwin_user_cache_dir()
    assert value is None or value.startswith("/")
