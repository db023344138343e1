"""Deny globs are materialised into concrete denied paths (CLIENT_COMPAT.md §1.6)."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from exec_server.protocol.types.sandbox import decode_fs_sandbox, decode_launch_sandbox
from exec_server.sandbox import globs
from exec_server.sandbox.access import ResolvedPolicy
from exec_server.sandbox.convert import fs_context, launch_request
from exec_server.sandbox.globs import GlobScanError, expand_glob
from exec_server.sandbox.policy import (
    Access,
    FileSystemPolicy,
    FsEntry,
    GlobTarget,
    Network,
    PolicyScope,
    SpecialKind,
    SpecialTarget,
)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    for rel in ("a/.env", "a/b/prod.env", "a/b/c/d/deep.env", "keep.txt", ".env", "x.env.bak"):
        path = ws / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("secret")
    (ws / "link.env").symlink_to(ws / "keep.txt")
    return ws


def scope(ws: Path, **kwargs: object) -> PolicyScope:
    return PolicyScope(cwd=str(ws), roots=(str(ws),), **kwargs)  # type: ignore[arg-type]


def rel(ws: Path, paths: list[str]) -> set[str]:
    return {str(Path(p).relative_to(ws)) for p in paths}


def test_double_star_matches_at_every_depth(tree: Path) -> None:
    got = rel(tree, expand_glob("**/*.env", scope(tree)))
    assert got == {".env", "link.env", "a/.env", "a/b/prod.env", "a/b/c/d/deep.env"}


def test_depth_bound(tree: Path) -> None:
    # matches are at most max_depth components below the anchor
    got = rel(tree, expand_glob("**/*.env", scope(tree), max_depth=3))
    assert got == {".env", "link.env", "a/.env", "a/b/prod.env"}
    assert rel(tree, expand_glob("**/*.env", scope(tree), max_depth=1)) == {".env", "link.env"}


def test_literal_prefix_and_single_level(tree: Path) -> None:
    assert rel(tree, expand_glob("a/*.env", scope(tree))) == {"a/.env"}
    assert rel(tree, expand_glob("a/b/prod.env", scope(tree))) == {"a/b/prod.env"}
    assert expand_glob("missing/*.env", scope(tree)) == []
    absolute = expand_glob(str(tree / "a" / "b" / "*.env"), scope(Path("/elsewhere")))
    assert rel(tree, absolute) == {"a/b/prod.env"}


def test_home_patterns(tree: Path) -> None:
    assert rel(tree, expand_glob("~/a/*.env", scope(Path("/x"), home=str(tree)))) == {"a/.env"}
    assert expand_glob("~/a/*.env", scope(Path("/x"))) == []


def test_budget_fails_closed(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(globs, "MAX_GLOB_VISITS", 3)
    with pytest.raises(GlobScanError, match="entries scanned"):
        expand_glob("**/*.env", scope(tree))


def test_deny_glob_in_resolution_and_plan(tree: Path) -> None:
    policy = FileSystemPolicy.restricted(
        [
            FsEntry(SpecialTarget(SpecialKind.ROOT), Access.READ),
            FsEntry(SpecialTarget(SpecialKind.PROJECT_ROOTS), Access.WRITE),
            FsEntry(GlobTarget("**/*.env"), Access.NONE),
            FsEntry(GlobTarget("**/*.txt"), Access.WRITE),  # grants nothing
        ]
    )
    view = ResolvedPolicy(policy, scope(tree))
    assert view.resolve_access(str(tree / "a" / "b" / "prod.env")) is Access.NONE
    assert view.resolve_access(str(tree / "keep.txt")) is Access.WRITE
    plan = view.plan(Network.RESTRICTED)
    assert str(tree / "a" / ".env") in plan.denied_paths
    assert str(tree / "keep.txt") not in plan.denied_paths


def test_wire_glob_scan_depth_is_carried(tree: Path) -> None:
    ctx = {
        "permissions": {
            "type": "managed",
            "file_system": {
                "type": "restricted",
                "entries": [
                    {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
                    {"path": {"type": "glob_pattern", "pattern": "**/*.env"}, "access": "deny"},
                ],
                "glob_scan_max_depth": 1,
            },
            "network": "restricted",
        },
        "cwd": str(tree),
        "workspaceRoots": [str(tree)],
        "windowsSandboxLevel": "disabled",
    }
    raw = msgspec.Raw(json.dumps(ctx).encode())
    request = launch_request(decode_launch_sandbox(raw), command_cwd=str(tree))
    assert request.fs_policy.glob_scan_max_depth == 1
    plan = request.plan(tmpdir=None, platform_defaults=())
    assert set(plan.denied_paths) == {str(tree / ".env"), str(tree / "link.env")}
    fs = fs_context(decode_fs_sandbox(raw), server_cwd="/")
    assert fs is not None and fs.resolve_access(str(tree / ".env")) is Access.NONE
    assert fs.resolve_access(str(tree / "a" / ".env")) is Access.READ
