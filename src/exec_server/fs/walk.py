"""``fs/walk``: a bounded breadth-first listing of a directory tree (PROTOCOL_CURRENT §6),
by upstream's (0.163) rules. Stdlib only: the confined helper runs it too."""

from __future__ import annotations

import os
import stat
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from exec_server.fs.errors import fs_error_from_os

__all__ = [
    "MAX_DEPTH",
    "MAX_DIRECTORIES",
    "MAX_ENTRIES",
    "WalkOptions",
    "WalkOutcome",
    "limits_error",
    "walk",
]

MAX_DEPTH: Final = 64
MAX_DIRECTORIES: Final = 10_000
MAX_ENTRIES: Final = 50_000

LIMITS_TOO_LARGE: Final = (
    f"filesystem walk limits exceed maximums: depth={MAX_DEPTH}, "
    f"directories={MAX_DIRECTORIES}, entries={MAX_ENTRIES}"
)

@dataclass(frozen=True, slots=True)
class WalkOptions:
    max_depth: int
    max_directories: int
    max_entries: int
    follow_directory_symlinks: bool
    prune_hidden_directories: bool


@dataclass(slots=True)
class WalkOutcome:
    """Entries and errors by ``(directory, name)``: each directory is rendered once."""

    entries: list[tuple[str, str, bool]] = field(default_factory=list)
    errors: list[tuple[str, str, str]] = field(default_factory=list)
    truncated: bool = False


def limits_error(options: WalkOptions) -> str | None:
    """Upstream's ``-32600`` text for limits it refuses, or None (checked before the path)."""
    if options.max_directories == 0 or options.max_entries == 0:
        return "filesystem walk limits must be greater than zero"
    if (
        options.max_depth > MAX_DEPTH
        or options.max_directories > MAX_DIRECTORIES
        or options.max_entries > MAX_ENTRIES
    ):
        return LIMITS_TOO_LARGE
    return None


def _listing(path: str) -> list[tuple[str, os.DirEntry[str]]]:
    """The names of ``path`` sorted in byte order (``str`` order for ASCII names)."""
    with os.scandir(path) as it:
        found = [(entry.name, entry) for entry in it]
    if all(name.isascii() for name, _ in found):
        found.sort(key=lambda item: item[0])
    else:
        found.sort(key=lambda item: os.fsencode(item[0]))
    return found


def walk(
    root: str, options: WalkOptions, visible: Callable[[str], bool] | None = None
) -> WalkOutcome:
    """Paths stay under ``root`` as spelled; what ``visible`` hides is absent, as upstream."""
    outcome = WalkOutcome()
    follow = options.follow_directory_symlinks
    root_stat = os.stat(root)
    real_root = os.path.realpath(root) if visible is not None else root
    if visible is not None and not visible(real_root):
        raise FileNotFoundError(2, "No such file or directory")
    if not stat.S_ISDIR(root_stat.st_mode):
        return outcome
    if not follow and os.path.islink(root):
        return outcome
    queue: deque[tuple[str, str, int]] = deque([(root, real_root, 0)])
    visited: set[object] = {(root_stat.st_dev, root_stat.st_ino) if follow else root}
    queued = 1
    examined = 0
    max_entries = options.max_entries
    prune = options.prune_hidden_directories
    entries = outcome.entries
    while queue:
        directory, real_dir, depth = queue.popleft()
        try:
            listing = _listing(directory)
        except OSError as exc:
            if directory == root:
                raise
            outcome.errors.append((directory, "", fs_error_from_os(exc).message))
            continue
        descend = depth < options.max_depth
        real_prefix = real_dir.rstrip("/") + "/"
        for name, entry in listing:
            if examined >= max_entries:
                outcome.truncated = True
                return outcome
            st: os.stat_result | None = None
            try:
                is_link = entry.is_symlink()
                if is_link:
                    try:
                        st = entry.stat()
                    except OSError:
                        continue  # dangling or a loop: no name, as fs/readDirectory lists
                    is_dir = stat.S_ISDIR(st.st_mode)
                    is_file = False
                else:
                    # d_type, or one lstat where the directory gives none
                    is_dir = entry.is_dir(follow_symlinks=False)
                    is_file = not is_dir and entry.is_file(follow_symlinks=False)
            except OSError as exc:
                examined += 1
                outcome.errors.append((directory, name, fs_error_from_os(exc).message))
                continue
            examined += 1
            if is_link and (not follow or not is_dir):
                continue  # links to files are never listed; to directories when followed
            if not is_dir and not is_file:
                continue  # FIFOs, sockets, devices
            real = ""  # only ``visible`` needs real locations
            if visible is not None:
                real = os.path.realpath(entry.path) if is_link else real_prefix + name
                if not visible(real):
                    continue
            entries.append((directory, name, is_dir))
            if not is_dir or not descend or (prune and name.startswith(".")):
                continue
            if follow:
                if st is None:
                    try:
                        st = entry.stat()
                    except OSError as exc:  # gone since it was listed
                        outcome.errors.append((directory, name, fs_error_from_os(exc).message))
                        continue
                identity: object = (st.st_dev, st.st_ino)
            else:
                identity = entry.path
            if identity in visited:
                continue
            if queued >= options.max_directories:
                outcome.truncated = True
                continue
            visited.add(identity)
            queued += 1
            queue.append((entry.path, real, depth + 1))
    return outcome
