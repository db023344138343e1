"""Expand glob deny entries (CLIENT_COMPAT.md §1.4/§1.6) into the paths they match now. Over
the scan budget the launch fails rather than deny less. Relative patterns anchor at every
workspace root (else the policy cwd), ``~/`` at home; ``**``: zero or more directories."""

from __future__ import annotations

import os
from collections.abc import Sequence
from fnmatch import fnmatchcase

from exec_server.sandbox.errors import SandboxError
from exec_server.sandbox.policy import PolicyScope, join_normalized

__all__ = ["DEFAULT_GLOB_SCAN_DEPTH", "MAX_GLOB_VISITS", "GlobScanError", "expand_glob"]

#: Directory levels scanned below a glob's anchor when the client sets no bound.
DEFAULT_GLOB_SCAN_DEPTH = 8
#: Directory entries examined per glob before the launch is refused.
MAX_GLOB_VISITS = 100_000

_MAGIC = frozenset("*?[")  # "**" included


class GlobScanError(SandboxError):
    """A glob could not be expanded within the scan budget."""


def _match(parts: Sequence[str], pats: Sequence[str]) -> bool:
    if not pats:
        return not parts
    head = pats[0]
    if head == "**":
        return _match(parts, pats[1:]) or (bool(parts) and _match(parts[1:], pats))
    return bool(parts) and fnmatchcase(parts[0], head) and _match(parts[1:], pats[1:])


def _anchors(pattern: str, scope: PolicyScope) -> list[tuple[str, list[str]]]:
    if pattern == "~" or pattern.startswith("~/"):
        if scope.home is None:
            return []
        bases = [scope.home]
        rest = pattern[2:]
    elif pattern.startswith("/"):
        bases = ["/"]
        rest = pattern[1:]
    else:
        bases = list(scope.roots) or [scope.cwd]
        rest = pattern
    comps = [c for c in rest.split("/") if c not in ("", ".")]
    out: list[tuple[str, list[str]]] = []
    for base in bases:
        anchor = base
        pats = list(comps)
        while pats and not _MAGIC.intersection(pats[0]):
            anchor = join_normalized(anchor, pats.pop(0))
        out.append((anchor, pats))
    return out


def expand_glob(pattern: str, scope: PolicyScope, *, max_depth: int | None = None) -> list[str]:
    """Existing paths matching ``pattern`` now (symlinks are matched, not followed)."""
    depth_limit = max_depth if max_depth is not None else DEFAULT_GLOB_SCAN_DEPTH
    matches: list[str] = []
    visits = 0
    for anchor, pats in _anchors(pattern, scope):
        if not pats:
            if os.path.lexists(anchor):
                matches.append(anchor)
            continue
        limit = depth_limit if "**" in pats else min(depth_limit, len(pats))
        stack: list[tuple[str, tuple[str, ...]]] = [(anchor, ())]
        while stack:
            directory, rel = stack.pop()
            try:
                entries = list(os.scandir(directory))
            except OSError:
                continue
            for entry in entries:
                visits += 1
                if visits > MAX_GLOB_VISITS:
                    raise GlobScanError(
                        f"glob `{pattern}` needs more than {MAX_GLOB_VISITS} entries scanned"
                    )
                parts = (*rel, entry.name)
                if _match(parts, pats):
                    matches.append(entry.path)
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    is_dir = False
                if is_dir and len(parts) < limit:
                    stack.append((entry.path, parts))
    return sorted(dict.fromkeys(matches))
