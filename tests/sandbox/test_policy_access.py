"""Access resolution (PROTOCOL.md §6.11), predicates, protected subpaths and plan generation."""

from __future__ import annotations

from pathlib import Path

import pytest

from exec_server.protocol.types import sandbox as wire
from exec_server.sandbox.access import (
    ResolvedPolicy,
    has_full_disk_read,
    has_full_disk_write,
    includes_platform_defaults,
    resolve_target,
)
from exec_server.sandbox.plan import SandboxPlan
from exec_server.sandbox.policy import (
    Access,
    FileSystemPolicy,
    FsEntry,
    GlobTarget,
    Network,
    OsProbe,
    PathTarget,
    PolicyScope,
    SpecialKind,
    SpecialTarget,
    fs_policy_from_legacy,
    is_within,
)


def resolve_access(
    policy: FileSystemPolicy, path: str, scope: PolicyScope, probe: FakeProbe | None = None
) -> Access:
    """``resolve_access_with_cwd`` exactly as PROTOCOL.md §6.11 (no protected subpaths)."""
    return ResolvedPolicy(policy, scope, probe=probe, protect=False).resolve_access(path)


class FakeProbe:
    def __init__(self, dirs: set[str] | None = None, files: dict[str, str] | None = None) -> None:
        self.dirs = dirs or set()
        self.files = files or {}

    def is_dir(self, path: str) -> bool:
        return path in self.dirs

    def is_file(self, path: str) -> bool:
        return path in self.files

    def read_text(self, path: str) -> str | None:
        return self.files.get(path)


R, W, N = Access.READ, Access.WRITE, Access.NONE


def sp(kind: SpecialKind, access: Access, subpath: str | None = None) -> FsEntry:
    return FsEntry(SpecialTarget(kind, subpath), access)


def p(path: str, access: Access) -> FsEntry:
    return FsEntry(PathTarget(path), access)


ROOT, CWD, MIN = SpecialKind.ROOT, SpecialKind.CURRENT_WORKING_DIRECTORY, SpecialKind.MINIMAL
PROJ, TMP, STMP = SpecialKind.PROJECT_ROOTS, SpecialKind.TMPDIR, SpecialKind.SLASH_TMP
SCOPE = PolicyScope(cwd="/ws", roots=("/ws",), tmpdir="/var/tmp/me")
PROBE = FakeProbe(dirs={"/tmp"})


# --- §6.11 ---

SPECIFIC = FileSystemPolicy.restricted(
    [
        sp(CWD, W),
        p("/ws/docs", R),
        p("/ws/docs/private", N),
        p("/ws/docs/private/public", W),
    ]
)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/ws", W),  # §15.7 test 61
        ("/ws/docs", R),
        ("/ws/docs/readme.md", R),
        ("/ws/docs/private", N),
        ("/ws/docs/private/x", N),
        ("/ws/docs/private/public", W),
        ("/ws/docs/private/public/deep/f", W),
        ("/ws/docsX", W),  # component-wise prefix, not string prefix
        ("/elsewhere", N),  # no matching entry
        ("docs/readme.md", R),  # relative: joined to cwd
        ("/ws/src/../docs/x", R),  # lexically normalised
        ("/", N),
    ],
)
def test_most_specific_entry_wins(path: str, expected: Access) -> None:
    assert resolve_access(SPECIFIC, path, SCOPE, PROBE) is expected


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        ([p("/a", R), p("/a", W)], W),
        ([p("/a", W), p("/a", R)], W),
        ([p("/a", W), p("/a", N)], N),
        ([p("/a", N), p("/a", R)], N),
        ([sp(ROOT, W), p("/a", R)], R),
        ([sp(ROOT, R), sp(MIN, W)], R),  # minimal never matches
        ([sp(SpecialKind.UNKNOWN, W)], N),
        ([FsEntry(GlobTarget("/a/*"), W)], N),
    ],
)
def test_tie_break_and_unmatched(entries: list[FsEntry], expected: Access) -> None:
    assert resolve_access(FileSystemPolicy.restricted(entries), "/a/f", SCOPE, PROBE) is expected


def test_unrestricted_and_external_resolve_to_write() -> None:
    for policy in (FileSystemPolicy.unrestricted(), FileSystemPolicy.external()):
        assert resolve_access(policy, "/anything", SCOPE, PROBE) is W


@pytest.mark.parametrize(
    ("target", "scope", "probe", "expected"),
    [
        (SpecialTarget(ROOT), SCOPE, PROBE, ("/",)),
        (SpecialTarget(MIN), SCOPE, PROBE, ()),
        (SpecialTarget(CWD), SCOPE, PROBE, ("/ws",)),
        (SpecialTarget(PROJ, "a/b"), SCOPE, PROBE, ("/ws/a/b",)),
        (SpecialTarget(PROJ, ".."), SCOPE, PROBE, ("/",)),
        (
            SpecialTarget(PROJ, ".git"),
            PolicyScope("/c", ("/r1", "/r2")),
            PROBE,
            ("/r1/.git", "/r2/.git"),
        ),
        (SpecialTarget(CWD), PolicyScope("/c", ()), PROBE, ()),
        (SpecialTarget(TMP), SCOPE, PROBE, ("/var/tmp/me",)),
        (SpecialTarget(TMP), PolicyScope("/c", ("/c",), tmpdir=""), PROBE, ()),
        (SpecialTarget(TMP), PolicyScope("/c", ("/c",), tmpdir="rel"), PROBE, ()),
        (SpecialTarget(TMP), PolicyScope("/c", ("/c",), tmpdir="/t/../u/"), PROBE, ("/u",)),
        (SpecialTarget(STMP), SCOPE, PROBE, ("/tmp",)),
        (SpecialTarget(STMP), SCOPE, FakeProbe(), ()),
        (SpecialTarget(SpecialKind.UNKNOWN, "x"), SCOPE, PROBE, ()),
        (PathTarget("/x/y"), SCOPE, PROBE, ("/x/y",)),
        (GlobTarget("**/*.env"), SCOPE, PROBE, ()),
    ],
)
def test_resolve_target(
    target: SpecialTarget | PathTarget | GlobTarget,
    scope: PolicyScope,
    probe: FakeProbe,
    expected: tuple[str, ...],
) -> None:
    assert resolve_target(target, scope, probe) == expected


def test_is_within() -> None:
    assert is_within("/a/b", "/a/b") and is_within("/a/b/c", "/a/b") and is_within("/x", "/")
    assert not is_within("/a/bc", "/a/b") and not is_within("/a", "/a/b")


# --- predicates ---


@pytest.mark.parametrize(
    ("entries", "full_read", "full_write", "defaults"),
    [
        ([sp(ROOT, R)], True, False, False),
        ([sp(ROOT, W)], True, True, False),
        ([sp(ROOT, W), sp(MIN, R)], True, True, False),  # minimal never narrows
        ([sp(ROOT, W), p("/a", R)], True, False, False),  # narrowed by a read entry
        ([sp(ROOT, W), p("/a", R), p("/a", W)], True, True, False),  # overridden at same target
        ([sp(ROOT, W), sp(ROOT, R)], True, True, False),
        ([sp(ROOT, W), sp(ROOT, N)], False, False, False),
        ([sp(ROOT, W), p("/a", N)], False, False, False),
        ([sp(ROOT, R), p("/secret", N)], False, False, False),
        ([sp(CWD, R), sp(MIN, R)], False, False, True),
        ([sp(CWD, R), sp(MIN, N)], False, False, False),
        ([sp(CWD, W)], False, False, False),
        ([], False, False, False),
    ],
)
def test_predicates(
    entries: list[FsEntry], full_read: bool, full_write: bool, defaults: bool
) -> None:
    policy = FileSystemPolicy.restricted(entries)
    assert has_full_disk_read(policy) is full_read
    assert has_full_disk_write(policy) is full_write
    assert includes_platform_defaults(policy) is defaults


def test_predicates_for_unrestricted_kinds() -> None:
    for policy in (FileSystemPolicy.unrestricted(), FileSystemPolicy.external()):
        assert has_full_disk_read(policy) and has_full_disk_write(policy)
        assert not includes_platform_defaults(policy)


# --- protected subpaths in the resolved view ---


def test_protected_subpaths_are_read_only_in_resolution() -> None:
    probe = FakeProbe(dirs={"/tmp", "/ws/.git", "/ws/.codex", "/ws/.agents", "/tmp/.git"})
    policy = FileSystemPolicy.restricted([sp(ROOT, R), sp(CWD, W), sp(STMP, W)])
    view = ResolvedPolicy(policy, SCOPE, probe=probe)
    assert view.resolve_access("/ws/src/main.py") is W
    for name in (".git", ".codex", ".agents"):
        assert view.resolve_access(f"/ws/{name}") is R
        assert view.resolve_access(f"/ws/{name}/x/y") is R
    assert view.resolve_access("/ws/.github/workflows") is W
    assert view.resolve_access("/tmp/.git/config") is R
    # without protection (the bare §6.11) the workspace is writable throughout
    assert resolve_access(policy, "/ws/.git/config", SCOPE, probe) is W
    unprotected = ResolvedPolicy(policy, SCOPE, probe=probe, protect=False)
    assert unprotected.resolve_access("/ws/.git/config") is W


def test_protected_subpaths_on_real_disk(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / ".git").mkdir(parents=True)
    scope = PolicyScope(cwd=str(ws), roots=(str(ws),))
    view = ResolvedPolicy(
        FileSystemPolicy.restricted([sp(ROOT, R), sp(CWD, W)]), scope, probe=OsProbe()
    )
    assert view.resolve_access(str(ws / "a.txt")) is Access.WRITE
    assert view.resolve_access(str(ws / ".git" / "HEAD")) is Access.READ
    # §6.10 protects .codex/.agents only when they exist as directories
    assert view.resolve_access(str(ws / ".codex" / "config.toml")) is Access.WRITE


def test_explicit_deeper_write_beats_protection() -> None:
    probe = FakeProbe(dirs={"/ws/.git"})
    policy = FileSystemPolicy.restricted([sp(CWD, W), p("/ws/.git/hooks", W)])
    view = ResolvedPolicy(policy, SCOPE, probe=probe)
    assert view.resolve_access("/ws/.git/config") is R
    assert view.resolve_access("/ws/.git/hooks/pre-commit") is W


def test_full_disk_write_has_no_protection() -> None:
    probe = FakeProbe(dirs={"/ws/.git"})
    view = ResolvedPolicy(FileSystemPolicy.restricted([sp(ROOT, W)]), SCOPE, probe=probe)
    assert view.protected == ()
    assert view.resolve_access("/ws/.git/x") is W


# --- plan generation ---


def plan_of(
    entries: list[FsEntry],
    *,
    network: Network = Network.RESTRICTED,
    probe: FakeProbe | None = None,
    defaults: tuple[str, ...] = (),
    scope: PolicyScope = SCOPE,
) -> SandboxPlan:
    probe = probe or FakeProbe(dirs={"/tmp", "/usr", "/bin"})
    view = ResolvedPolicy(FileSystemPolicy.restricted(entries), scope, probe=probe)
    return view.plan(network, platform_defaults=defaults)


def test_plan_workspace_write_default() -> None:
    probe = FakeProbe(dirs={"/tmp", "/ws/.git"})
    policy = fs_policy_from_legacy(wire.WorkspaceWritePolicy(), SCOPE, probe)
    plan = ResolvedPolicy(policy, SCOPE, probe=probe).plan(Network.RESTRICTED)
    assert plan.full_read and not plan.full_write and not plan.network
    # shallow first, so mechanisms can bind parents before children
    assert plan.writable_roots == ("/tmp", "/ws", "/var/tmp/me")
    assert plan.read_only_subpaths == ("/ws/.git",)
    assert plan.readable_roots == () and plan.denied_paths == ()
    assert plan.cwd == "/ws"


def test_plan_unrestricted_and_external() -> None:
    for policy, network in (
        (FileSystemPolicy.unrestricted(), Network.ENABLED),
        (FileSystemPolicy.external(), Network.RESTRICTED),
    ):
        plan = ResolvedPolicy(policy, SCOPE, probe=PROBE).plan(network)
        assert plan.full_read and plan.full_write
        assert plan.network is (network is Network.ENABLED)
        assert plan.writable_roots == plan.readable_roots == ()
    plan = ResolvedPolicy(FileSystemPolicy.unrestricted(), SCOPE).plan(Network.ENABLED)
    assert plan.full_read and plan.full_write and plan.network and not plan.denied_paths


def test_plan_restricted_reads_with_platform_defaults() -> None:
    plan = plan_of(
        [sp(CWD, R), sp(MIN, R), p("/data", R), p("/ws/sub", R)],
        defaults=("/usr", "/bin", "/lib64"),
    )
    assert not plan.full_read and not plan.full_write
    # /ws/sub is inside the readable cwd; /lib64 does not exist
    assert plan.readable_roots == ("/data", "/ws", "/usr", "/bin")
    assert plan.writable_roots == ()


def test_plan_without_minimal_has_no_platform_defaults() -> None:
    plan = plan_of([sp(CWD, R)], defaults=("/usr",))
    assert plan.readable_roots == ("/ws",)


def test_plan_carve_outs() -> None:
    plan = plan_of(
        [
            sp(ROOT, R),
            sp(CWD, W),
            p("/ws/docs", R),
            p("/ws/docs/private", N),
            p("/ws/docs/private/public", W),
            p("/ws/sub", W),  # redundant: already writable
            p("/secret", N),
            p("/nothing/here", N),  # inside readable root: still denied
        ]
    )
    assert plan.writable_roots == ("/ws", "/ws/docs/private/public")
    assert plan.read_only_subpaths == ("/ws/docs",)
    assert plan.denied_paths == ("/secret", "/nothing/here", "/ws/docs/private")
    assert not plan.full_read  # a `none` entry makes reads non-full (§6.11)


def test_plan_root_write_narrowed() -> None:
    plan = plan_of([sp(ROOT, W), p("/etc", R)])
    assert not plan.full_write
    assert plan.writable_roots == ("/",)
    assert plan.read_only_subpaths == ("/etc",)


def test_plan_full_write() -> None:
    plan = plan_of([sp(ROOT, W)], network=Network.ENABLED)
    assert plan.full_write and plan.full_read and plan.network
    assert plan.writable_roots == ()


def test_plan_current_client_recorded_policy() -> None:
    """The 0.163.0 workspace-write entries: explicit carve-outs even when missing."""
    probe = FakeProbe(dirs={"/tmp", "/ws/.git"})
    entries = [
        sp(ROOT, R),
        sp(PROJ, W),
        sp(STMP, W),
        sp(TMP, W),
        *(sp(PROJ, R, name) for name in (".git", ".agents", ".codex", ".aws")),
    ]
    plan = plan_of(entries, probe=probe, scope=PolicyScope("/ws", ("/ws",), tmpdir=None))
    assert plan.writable_roots == ("/tmp", "/ws")
    assert set(plan.read_only_subpaths) == {"/ws/.git", "/ws/.agents", "/ws/.codex", "/ws/.aws"}
    assert plan.full_read and not plan.network


def test_plan_no_roots_grants_nothing() -> None:
    plan = plan_of([sp(ROOT, R), sp(PROJ, W)], scope=PolicyScope("/c", ()))
    assert plan.writable_roots == ()


# --- regressions found by the plan/resolution property test ---


def test_denial_tied_with_write_still_narrows_full_write() -> None:
    policy = FileSystemPolicy.restricted([p("/a/b", W), sp(ROOT, W), p("/a/b", N)])
    assert not has_full_disk_write(policy)
    plan = plan_of([p("/a/b", W), sp(ROOT, W), p("/a/b", N)])
    assert plan.denied_paths == ("/a/b",) and plan.writable_roots == ("/",)


def test_explicit_write_on_protected_path_is_honoured_by_plan() -> None:
    probe = FakeProbe(dirs={"/ws/.git"})
    view = ResolvedPolicy(
        FileSystemPolicy.restricted([sp(CWD, W), p("/ws/.git", W)]), SCOPE, probe=probe
    )
    assert view.resolve_access("/ws/.git/config") is W
    plan = view.plan(Network.RESTRICTED)
    assert "/ws/.git" not in plan.read_only_subpaths
