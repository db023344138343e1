"""The fs pre-check's resolution for current-client contexts (docs/sandbox-policy.md).

``ResolvedPolicy`` with a canonicaliser, always-protected names and platform
default read roots (pure: fake probe, fake canonicaliser), then the
``FsSandboxRequest`` each generation decodes to, on a real directory tree:
current contexts get all three, legacy ones keep PROTOCOL.md §10.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from exec_server.protocol.types.sandbox import decode_fs_sandbox
from exec_server.sandbox.access import PROTECTED_NAMES_ALWAYS, ResolvedPolicy
from exec_server.sandbox.convert import fs_context
from exec_server.sandbox.fs_request import FsSandboxRequest
from exec_server.sandbox.platform import platform_default_read_roots
from exec_server.sandbox.policy import (
    Access,
    FileSystemPolicy,
    FsEntry,
    Network,
    PathTarget,
    PolicyScope,
    SpecialKind,
    SpecialTarget,
    is_within,
)

R, W, N = Access.READ, Access.WRITE, Access.NONE
ROOT, CWD, MINIMAL = SpecialKind.ROOT, SpecialKind.CURRENT_WORKING_DIRECTORY, SpecialKind.MINIMAL
SCOPE = PolicyScope(cwd="/ws", roots=("/ws",))


class FakeProbe:
    def __init__(self, dirs: set[str] | None = None) -> None:
        self.dirs = dirs or set()

    def is_dir(self, path: str) -> bool:
        return path in self.dirs

    def is_file(self, path: str) -> bool:
        return False

    def read_text(self, path: str) -> str | None:
        return None


def links(table: dict[str, str]) -> Any:
    """A canonicaliser for a pretend tree where each key is a symlink to its value."""

    def canonical(path: str) -> str:
        for link, target in table.items():
            if is_within(path, link):
                return target + path[len(link) :]
        return path

    return canonical


def sp(kind: SpecialKind, access: Access) -> FsEntry:
    return FsEntry(SpecialTarget(kind), access)


def p(path: str, access: Access) -> FsEntry:
    return FsEntry(PathTarget(path), access)


def view(
    entries: list[FsEntry],
    *,
    scope: PolicyScope = SCOPE,
    canonical: dict[str, str] | None = None,
    names: tuple[str, ...] = (),
    defaults: tuple[str, ...] = (),
    dirs: set[str] | None = None,
) -> ResolvedPolicy:
    return ResolvedPolicy(
        FileSystemPolicy.restricted(entries),
        scope,
        probe=FakeProbe(dirs),
        canonicalize=links(canonical) if canonical is not None else None,
        protect_names=names,
        default_read_roots=defaults,
    )


# --- entries through symlinks ---


def test_write_entry_through_symlink_grants_its_target_not_the_link() -> None:
    entries = [sp(ROOT, R), p("/ws/link", W)]
    v = view(entries, canonical={"/ws/link": "/extra"})
    assert v.resolve_access("/extra/a.txt") is W
    assert v.resolve_access("/ws/link/a.txt") is W  # a preserved path below the link
    assert v.resolve_access("/ws/link") is R  # the link itself lives in /ws
    assert v.rules == (("/", R), ("/extra", W))
    # §6.11 as written (no canonicaliser): the entry never matches a check path.
    assert view(entries).resolve_access("/extra/a.txt") is R


def test_workspace_root_through_symlink() -> None:
    scope = PolicyScope(cwd="/wslink", roots=("/wslink",))
    v = view(
        [sp(ROOT, R), sp(CWD, W)],
        scope=scope,
        canonical={"/wslink": "/ws"},
        names=PROTECTED_NAMES_ALWAYS,
    )
    assert v.resolve_access("/ws/src/a.py") is W
    assert v.resolve_access("/wslink/src/a.py") is W
    assert v.resolve_access("/wslink") is R
    for name in PROTECTED_NAMES_ALWAYS:
        assert v.resolve_access(f"/ws/{name}/config") is R
        assert v.resolve_access(f"/wslink/{name}") is R


def test_deny_and_read_entries_through_symlinks_keep_both_forms() -> None:
    v = view(
        [sp(ROOT, R), sp(CWD, W), p("/ws/linkdir/s.txt", N), p("/ws/ro_link", R)],
        canonical={"/ws/linkdir": "/ws/realdir", "/ws/ro_link": "/ws/docs"},
    )
    assert v.resolve_access("/ws/realdir/s.txt") is N
    assert v.resolve_access("/ws/linkdir/s.txt") is N
    assert v.resolve_access("/ws/realdir/other.txt") is W
    assert v.resolve_access("/ws/docs/a.md") is R
    assert v.resolve_access("/ws/ro_link") is R  # fail closed: the link is kept too
    assert ("/ws/linkdir/s.txt", N) in v.rules and ("/ws/realdir/s.txt", N) in v.rules


# --- always-protected names ---


def test_missing_names_are_read_only_under_every_writable_root() -> None:
    entries = [sp(ROOT, R), sp(CWD, W), p("/extra", W)]
    v = view(entries, names=PROTECTED_NAMES_ALWAYS)
    for root in ("/ws", "/extra"):
        for name in PROTECTED_NAMES_ALWAYS:
            assert v.resolve_access(f"{root}/{name}") is R
            assert v.resolve_access(f"{root}/{name}/hooks/pre-commit") is R
        assert v.resolve_access(f"{root}/.github/x") is W
        assert v.resolve_access(f"{root}/.gitignore") is W
        assert v.resolve_access(f"{root}/sub/.git/config") is W  # only directly under a root
    plan = v.plan(Network.RESTRICTED)
    assert "/extra/.git" in plan.read_only_subpaths and "/ws/.aws" in plan.read_only_subpaths
    # Without the names (legacy, §6.10): only existing ones are protected.
    assert view(entries).resolve_access("/extra/.git/config") is W


def test_explicit_entries_still_beat_protected_names() -> None:
    v = view(
        [sp(CWD, W), p("/ws/.codex/memories", W), p("/ws/.aws", N)],
        names=PROTECTED_NAMES_ALWAYS,
    )
    assert v.resolve_access("/ws/.codex/config.toml") is R
    assert v.resolve_access("/ws/.codex/memories/m.md") is W
    assert v.resolve_access("/ws/.aws/credentials") is N


def test_full_disk_write_protects_nothing() -> None:
    v = view([sp(ROOT, W)], names=PROTECTED_NAMES_ALWAYS)
    assert v.protected == ()
    assert v.resolve_access("/ws/.git/config") is W


# --- platform default read roots ---

DEFAULTS = ("/etc", "/usr", "/nix/store")
DIRS = {"/etc", "/usr"}


def test_readable_minimal_reads_the_platform_defaults() -> None:
    v = view([sp(MINIMAL, R), sp(CWD, W)], defaults=DEFAULTS, dirs=DIRS)
    assert v.resolve_access("/etc/hostname") is R
    assert v.resolve_access("/usr/bin/env") is R
    assert v.resolve_access("/nix/store/x") is N  # missing roots are dropped
    assert v.resolve_access("/home/u/.ssh/id") is N
    assert v.resolve_access("/ws/a") is W
    # The plan is untouched: mechanisms get the defaults through plan(platform_defaults=...).
    bare = view([sp(MINIMAL, R), sp(CWD, W)], dirs=DIRS)
    assert v.plan(Network.RESTRICTED) == bare.plan(Network.RESTRICTED)


def test_platform_defaults_need_a_readable_minimal_and_restricted_reads() -> None:
    assert view([sp(CWD, W)], defaults=DEFAULTS, dirs=DIRS).resolve_access("/etc/x") is N
    no_minimal = view([sp(MINIMAL, N), sp(CWD, W)], defaults=DEFAULTS, dirs=DIRS)
    assert no_minimal.resolve_access("/etc/x") is N


def test_platform_defaults_never_demote_and_yield_to_deny_entries() -> None:
    v = view(
        [sp(MINIMAL, R), sp(CWD, W), p("/etc/shadow", N), p("/usr", N), p("/etc/ssl", W)],
        defaults=DEFAULTS,
        dirs=DIRS,
    )
    assert v.resolve_access("/etc/passwd") is R
    assert v.resolve_access("/etc/shadow") is N  # deeper deny
    assert v.resolve_access("/usr/lib/x") is N  # equally deep deny wins the tie
    assert v.resolve_access("/etc/ssl/certs/x") is W
    wide = view([sp(MINIMAL, R), p("/", W), p("/home", N)], defaults=DEFAULTS, dirs=DIRS)
    assert wide.resolve_access("/etc/hosts") is W  # never turned into read-only


# --- decoded requests on disk ---


def _tree(tmp_path: Path) -> dict[str, Path]:
    root = tmp_path.resolve()
    ws, extra = root / "ws", root / "extra"
    (ws / "realdir").mkdir(parents=True)
    extra.mkdir()
    (ws / "link_extra").symlink_to("../extra")
    (root / "wslink").symlink_to("ws")
    return {"root": root, "ws": ws, "extra": extra, "wslink": root / "wslink"}


def _current(workspace: Path, entries: list[dict[str, Any]]) -> FsSandboxRequest:
    uri = "file://" + str(workspace)
    ctx = {
        "permissions": {
            "type": "managed",
            "file_system": {"type": "restricted", "entries": entries},
            "network": "restricted",
        },
        "cwd": uri,
        "workspaceRoots": [uri],
        "windowsSandboxLevel": "disabled",
    }
    req = fs_context(decode_fs_sandbox(json.dumps(ctx).encode()), server_cwd=str(workspace))
    assert req is not None and not req.direct
    return req


def _legacy(policy: dict[str, Any], cwd: Path) -> FsSandboxRequest:
    ctx = {"sandboxPolicy": policy, "windowsSandboxLevel": "disabled"}
    req = fs_context(decode_fs_sandbox(msgspec.Raw(json.dumps(ctx).encode())), server_cwd=str(cwd))
    assert req is not None and not req.direct
    return req


def _special(kind: str, access: str) -> dict[str, Any]:
    return {"path": {"type": "special", "value": {"kind": kind}}, "access": access}


def _path(path: Path, access: str) -> dict[str, Any]:
    return {"path": {"type": "path", "path": "file://" + str(path)}, "access": access}


def test_current_request_resolves_symlinked_roots_and_protects_names(tmp_path: Path) -> None:
    t = _tree(tmp_path)
    ws, extra = t["ws"], t["extra"]
    req = _current(
        t["wslink"],
        [
            _special("root", "read"),
            _special("project_roots", "write"),
            _path(ws / "link_extra", "write"),
        ],
    )
    assert req.can_write(str(ws / "a.txt")) and req.can_write(str(extra / "a.txt"))
    assert req.can_write(str(ws / "link_extra"))  # the link itself lives in the workspace
    for root in (ws, extra):
        for name in PROTECTED_NAMES_ALWAYS:
            assert req.resolve_access(str(root / name / "x")) is R
    plan = req.helper_plan()
    assert set(plan.writable_roots) >= {str(ws), str(extra)}
    assert str(extra / ".git") in plan.read_only_subpaths


def test_current_request_reads_platform_defaults_with_minimal(tmp_path: Path) -> None:
    t = _tree(tmp_path)
    req = _current(t["ws"], [_special("minimal", "read"), _special("project_roots", "write")])
    roots = [r for r in platform_default_read_roots() if Path(r).is_dir()]
    for root in roots:
        assert req.resolve_access(root + "/x") is R
    assert req.resolve_access(str(t["root"] / "other")) is N


def test_legacy_request_keeps_protocol_10(tmp_path: Path) -> None:
    t = _tree(tmp_path)
    ws, extra = t["ws"], t["extra"]
    ww = _legacy(
        {
            "type": "workspace-write",
            "writable_roots": [str(ws / "link_extra")],
            "exclude_tmpdir_env_var": True,
            "exclude_slash_tmp": True,
        },
        ws,
    )
    # §6.11: entry paths are not canonicalised; §10.1 keeps nested user symlinks.
    assert not ww.can_write(str(extra / "a.txt"))
    # §6.10: missing .git/.codex/.agents are not protected.
    assert ww.can_write(str(ws / ".git" / "config"))
    assert str(ws / ".git") not in ww.helper_plan().read_only_subpaths
    ro = _legacy(
        {
            "type": "read-only",
            "access": {
                "type": "restricted",
                "include_platform_defaults": True,
                "readable_roots": [],
            },
        },
        ws,
    )
    # §10.1 step 3: minimal never matches a path in the pre-check.
    assert ro.resolve_access("/etc/passwd") is N


def test_cache_hit_still_finds_a_gitdir_created_between_calls(tmp_path: Path) -> None:
    """Existence-dependent protection (a ``gitdir:`` target) is resolved per request."""
    ws = tmp_path.resolve() / "ws"
    (ws / "store").mkdir(parents=True)
    entries = [_special("root", "read"), _special("project_roots", "write")]
    first = _current(ws, entries)
    assert first.can_write(str(ws / "store" / "HEAD"))
    (ws / ".git").write_text("gitdir: store\n")
    second = _current(ws, entries)  # the same bytes: a cache hit
    assert second == first and second is not first
    assert not second.can_write(str(ws / "store" / "HEAD"))
    assert str(ws / "store") in second.helper_plan().read_only_subpaths


def test_canonicaliser_matches_the_check_path_rule(tmp_path: Path) -> None:
    """Entries resolve exactly like check paths (``fs.ops.resolve_existing_prefix``)."""
    from exec_server.fs.direct import resolve_existing_prefix
    from exec_server.sandbox.fs_request import _Canonical

    root = tmp_path.resolve()
    (root / "d" / "e").mkdir(parents=True)
    (root / "f.txt").write_text("x")
    links = {
        "up": "..",
        "abs_d": str(root / "d"),
        "rel_e": "d/e",
        "chain": "rel_e",
        "dangling": "nowhere/x",
        "loop_a": "loop_b",
        "loop_b": "loop_a",
        "to_file": "f.txt",
        "d/e/back": "../..",
    }
    for name, target in links.items():
        (root / name).symlink_to(target)
    tails = ["", "/x", "/x/y", "/e", "/e/z", "/d/e/back/chain/q"]
    names = ["d", "d/e", "f.txt", "missing", *links]
    canonical = _Canonical()  # one instance: later paths hit earlier prefixes
    for name in names:
        for tail in tails:
            path = f"{root}/{name}{tail}"
            assert canonical(path) == resolve_existing_prefix(path), path
            assert _Canonical()(path) == resolve_existing_prefix(path), path


def test_copy_conflict_finds_protected_names_in_the_source_tree(tmp_path: Path) -> None:
    t = _tree(tmp_path)
    ws, extra = t["ws"], t["extra"]
    (ws / "gitsrc" / ".git").mkdir(parents=True)
    (ws / "gitsrc" / ".git" / "config").write_text("[core]\n")
    (ws / "plain" / "sub").mkdir(parents=True)
    (ws / "plain" / "secret").mkdir()
    req = _current(
        ws,
        [
            _special("root", "read"),
            _special("project_roots", "write"),
            _path(extra, "write"),
            _path(extra / "secret", "none"),
        ],
    )
    assert req.copy_conflict(str(ws / "gitsrc"), str(extra)) == str(extra / ".git")
    assert req.copy_conflict(str(ws / "plain"), str(extra)) == str(extra / "secret")
    assert req.copy_conflict(str(ws / "gitsrc"), str(extra / "vendored")) is None
    assert req.copy_conflict(str(ws / "plain" / "sub"), str(extra)) is None
    (ws / "plain" / "secret").rmdir()
    (ws / "plain" / ".aws").symlink_to("nowhere")  # even a dangling link would be created
    assert req.copy_conflict(str(ws / "plain"), str(extra)) == str(extra / ".aws")
