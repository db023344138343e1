"""Computing an updated file from its text and a hunk's chunks (pure; APPLY_PATCH.md §8).

Line model (0.163.0): lines end at ``\\n``, ``\\r\\n`` or a lone ``\\r``.
Context lines are kept verbatim from the file, inserted lines take the file's
first line ending, and the result always ends with a line break.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby

from exec_server.patch.errors import ApplyError
from exec_server.patch.parse import UpdateChunk
from exec_server.patch.seek import seek_sequence

__all__ = ["Line", "derive_new_contents", "split_file_lines"]

_LINE_BREAK = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class Line:
    """A file line: its text and its terminator (``\\n``, ``\\r\\n``, ``\\r`` or ``""``)."""

    text: str
    ending: str


def split_file_lines(content: str) -> list[Line]:
    """Split file contents into lines (never ``str.splitlines()``).

    §8.1 describes ``\n`` and ``\r\n``; the 0.163.0 binary also ends a line at
    a lone ``\r`` (checked by experiment), and nothing else (form feed, U+2028,
    U+0085 stay ordinary characters). Text after the last break is a final line
    with no ending.
    """
    lines: list[Line] = []
    start = 0
    for match in _LINE_BREAK.finditer(content):
        lines.append(Line(content[start : match.start()], match.group()))
        start = match.end()
    if start < len(content):
        lines.append(Line(content[start:], ""))
    return lines


def _drop_trailing_empty(ops: list[tuple[str, str]], drop_new: bool) -> list[tuple[str, str]]:
    """Remove the last old line and, if ``drop_new``, the last new line from ``ops``.

    A context op has both roles; removing one role turns it into a ``+`` or ``-`` op.
    """
    ops = list(ops)
    # An op with kind ``keeper`` lacks the role being removed ("+" has no old line).
    for keeper in ("+", "-") if drop_new else ("+",):
        index = max((i for i, (k, _) in enumerate(ops) if k != keeper), default=None)
        if index is None:
            continue
        kind, text = ops[index]
        if kind == " ":
            ops[index] = (keeper, text)
        else:
            del ops[index]
    return ops


def _runs(
    ops: Sequence[tuple[str, str]], found: int, preferred: str
) -> list[tuple[int, int, list[Line]]]:
    """Split a matched chunk into one replacement per run of ``-``/``+`` lines (§8.3).

    Context lines between runs stay untouched in the file, with their own text
    and ending; new lines get the preferred ending.
    """
    runs: list[tuple[int, int, list[Line]]] = []
    position = found
    for is_context, group in groupby(ops, key=lambda op: op[0] == " "):
        run = list(group)
        if is_context:
            position += len(run)
            continue
        removed = sum(kind == "-" for kind, _ in run)
        runs.append((position, removed, [Line(t, preferred) for k, t in run if k == "+"]))
        position += removed
    return runs


def derive_new_contents(original: str, chunks: Sequence[UpdateChunk], display_path: str) -> str:
    """Return the new contents of a file after applying ``chunks``.

    Args:
        original: the file's current text.
        chunks: the Update hunk's chunks, in patch order.
        display_path: the absolute path used in error messages.

    Raises:
        ApplyError: an anchor or a chunk's old lines cannot be found (§8.6).
    """
    lines = split_file_lines(original)
    texts = [line.text for line in lines]
    preferred = next((line.ending for line in lines if line.ending), "\n")
    # (position, number of file lines replaced, replacement lines)
    replacements: list[tuple[int, int, list[Line]]] = []
    cursor = 0
    cache: dict[int, list[str]] = {}
    for chunk in chunks:
        if chunk.anchor is not None:
            found = seek_sequence(texts, [chunk.anchor], cursor, end_of_file=False, cache=cache)
            if found is None:
                raise ApplyError(f"Failed to find context '{chunk.anchor}' in {display_path}")
            cursor = found + 1
        if not chunk.old_lines:
            # Pure addition: appended at end of file whatever the anchor (§8.2.2).
            added = [Line(text, preferred) for text in chunk.new_lines]
            replacements.append((len(lines), 0, added))
            continue
        ops = list(chunk.ops)
        pattern = list(chunk.old_lines)
        found = seek_sequence(texts, pattern, cursor, end_of_file=chunk.is_end_of_file, cache=cache)
        if found is None and pattern[-1] == "":
            drop_new = bool(chunk.new_lines) and chunk.new_lines[-1] == ""
            ops = _drop_trailing_empty(ops, drop_new)
            pattern = pattern[:-1]
            found = seek_sequence(
                texts, pattern, cursor, end_of_file=chunk.is_end_of_file, cache=cache
            )
        if found is None:
            old = "\n".join(chunk.old_lines)
            raise ApplyError(f"Failed to find expected lines in {display_path}:\n{old}")
        replacements.extend(_runs(ops, found, preferred))
        cursor = found + len(pattern)

    # Stable: at one position, earlier chunks' lines come first (as upstream).
    replacements.sort(key=lambda r: r[0])
    result: list[Line] = []
    index = 0
    for start, count, new in replacements:
        result.extend(lines[index:start])
        result.extend(new)
        index = max(index, start + count)
    result.extend(lines[index:])
    return "".join(line.text + (line.ending or preferred) for line in result)
