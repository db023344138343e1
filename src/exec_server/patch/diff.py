"""Unified diff of an Update hunk for previews (APPLY_PATCH.md §13): hunks only, lines
keep their own terminators. Upstream uses Myers (Rust ``similar``); ``difflib``
without autojunk gives the same hunks for ordinary edits."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from exec_server.patch.apply import updated_contents
from exec_server.patch.content import split_file_lines
from exec_server.patch.fs import PatchFileSystem, SandboxT
from exec_server.patch.parse import UpdateChunk

__all__ = ["FileUpdate", "unified_diff", "unified_diff_from_chunks"]

_NO_NEWLINE = "\\ No newline at end of file\n"


@dataclass(frozen=True)
class FileUpdate:
    """A planned update: the preview diff, the original and the new contents."""

    unified_diff: str
    original_content: str
    content: str


def _range(start: int, stop: int) -> str:
    """``start,count`` (1-based); ``start`` alone for one line; GNU style for none."""
    length = stop - start
    if length == 1:
        return str(start + 1)
    if length == 0:
        return f"{start},0"
    return f"{start + 1},{length}"


def _emit(out: list[str], prefix: str, line: str) -> None:
    out.append(prefix + line)
    if not line.endswith(("\r", "\n")):
        out.append("\n" + _NO_NEWLINE)


def unified_diff(original: str, new: str) -> str:
    """The hunks (context radius 1) of a line diff from ``original`` to ``new``."""
    # Split as the applier reads files (as ``similar`` does), keeping the terminators.
    a = [line.text + line.ending for line in split_file_lines(original)]
    b = [line.text + line.ending for line in split_file_lines(new)]
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    out: list[str] = []
    for group in matcher.get_grouped_opcodes(1):
        first, last = group[0], group[-1]
        out.append(f"@@ -{_range(first[1], last[2])} +{_range(first[3], last[4])} @@\n")
        for tag, i1, i2, j1, j2 in group:
            for line in a[i1:i2]:
                _emit(out, " " if tag == "equal" else "-", line)
            if tag != "equal":
                for line in b[j1:j2]:
                    _emit(out, "+", line)
    return "".join(out)


async def unified_diff_from_chunks(
    path: Path,
    chunks: Sequence[UpdateChunk],
    fs: PatchFileSystem[SandboxT],
    sandbox: SandboxT | None = None,
) -> FileUpdate:
    """Read ``path`` through ``fs``, apply ``chunks`` in memory, and diff the result; raises
    ApplyError with the same messages as applying the hunk (§7.4, §8.6)."""
    original, content = await updated_contents(fs, path, chunks, sandbox)
    return FileUpdate(unified_diff(original, content), original, content)
