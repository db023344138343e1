"""Property tests: the plan mechanisms enforce agrees with §6.11, and decoding never crashes."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exec_server.exceptions import InvalidParamsError, InvalidRequestError
from exec_server.protocol.types.sandbox import decode_fs_sandbox, decode_launch_sandbox
from exec_server.sandbox.access import ResolvedPolicy
from exec_server.sandbox.convert import fs_context, launch_request
from exec_server.sandbox.plan import SandboxPlan
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


class FakeProbe:
    def __init__(self, dirs: set[str]) -> None:
        self.dirs = dirs

    def is_dir(self, path: str) -> bool:
        return path in self.dirs

    def is_file(self, path: str) -> bool:
        return False

    def read_text(self, path: str) -> str | None:
        return None


UNIVERSE = ["/", "/a", "/a/b", "/a/b/c", "/a/b/c/d", "/a/x", "/e", "/e/f", "/a/.git", "/a/.git/h"]
PROBE = FakeProbe({"/a/.git"})  # /a/.git is protected whenever /a is a writable root

entry = st.builds(
    FsEntry,
    st.one_of(
        st.sampled_from([p for p in UNIVERSE if p != "/"]).map(PathTarget),
        st.just(SpecialTarget(SpecialKind.ROOT)),
        st.just(SpecialTarget(SpecialKind.MINIMAL)),
    ),
    st.sampled_from(list(Access)),
)


def plan_access(plan: SandboxPlan, path: str) -> Access:
    """How a mechanism reads the plan: the deepest rule wins, none > write > read on ties."""
    if plan.full_write:
        return Access.WRITE
    rules: list[tuple[str, Access]] = [(p, Access.WRITE) for p in plan.writable_roots]
    rules += [(p, Access.READ) for p in plan.read_only_subpaths]
    rules += [(p, Access.NONE) for p in plan.denied_paths]
    rules += [("/", Access.READ)] if plan.full_read else []
    rules += [(p, Access.READ) for p in plan.readable_roots] if not plan.full_read else []
    best: tuple[int, int] | None = None
    access = Access.NONE
    for rule_path, rule_access in rules:
        if is_within(path, rule_path):
            key = (0 if rule_path == "/" else rule_path.count("/"), rule_access.precedence)
            if best is None or key > best:
                best, access = key, rule_access
    return access


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(entry, max_size=7))
def test_plan_agrees_with_access_resolution(entries: list[FsEntry]) -> None:
    scope = PolicyScope(cwd="/a", roots=("/a",))
    view = ResolvedPolicy(FileSystemPolicy.restricted(entries), scope, probe=PROBE)
    plan = view.plan(Network.RESTRICTED)
    for path in UNIVERSE:
        assert plan_access(plan, path) is view.resolve_access(path), (path, plan)


json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.sampled_from(
        [
            "",
            "/abs",
            "rel",
            "file:///x",
            "file://host/x",
            "read",
            "write",
            "deny",
            "none",
            "restricted",
            "enabled",
            "auto",
            "require",
            "forbid",
            "managed",
            "disabled",
            "external",
            "workspace-write",
            "read-only",
            "special",
            "path",
            "root",
            "project_roots",
        ]
    ),
)
KEYS = [
    "permissions",
    "type",
    "file_system",
    "network",
    "entries",
    "path",
    "access",
    "value",
    "kind",
    "subpath",
    "sandboxPolicy",
    "sandboxPreference",
    "policy",
    "fileSystemPolicy",
    "networkPolicy",
    "sandboxPolicyCwd",
    "windowsSandboxLevel",
    "writable_roots",
    "cwd",
    "workspaceRoots",
    "policyContext",
]
json_value = st.recursive(
    json_leaf,
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.sampled_from(KEYS), children, max_size=5)
    ),
    max_leaves=25,
)


@settings(max_examples=400, deadline=None)
@given(json_value)
def test_decoding_never_crashes(value: Any) -> None:
    raw = msgspec.Raw(json.dumps(value).encode())
    for decode in (
        lambda: launch_request(decode_launch_sandbox(raw), command_cwd="/w"),
        lambda: fs_context(decode_fs_sandbox(raw), server_cwd="/w"),
    ):
        with contextlib.suppress(InvalidParamsError, InvalidRequestError):
            decode()
