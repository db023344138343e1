"""Computing an updated file from its text and a hunk's chunks (pure; APPLY_PATCH.md §8, §9):
context lines are kept verbatim from the file, inserted lines take the file's first line
ending, and the result always ends with a line break."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from itertools import groupby
from typing import NamedTuple

from exec_server.patch.errors import ApplyError
from exec_server.patch.parse import UpdateChunk, trim, trim_end

__all__ = ["Line", "derive_new_contents", "seek_sequence", "split_file_lines"]

_LINE_BREAK = re.compile(r"(\r\n|\r|\n)")
_ODD_SPACES = "\u00a0\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f\u3000"
_PUNCTUATION = str.maketrans({
    **dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015\u2212", "-"),
    **dict.fromkeys("\u2018\u2019\u201a\u201b", "'"),
    **dict.fromkeys("\u201c\u201d\u201e\u201f", '"'),
    **dict.fromkeys(_ODD_SPACES, " "),
})
#: The seek passes (§9), each over the whole file before the next (an exact match late
#: beats a looser one early): exact, trim end, trim both, fold punctuation to ASCII.
_PASSES: tuple[Callable[[str], str], ...] = (
    str,
    trim_end,
    trim,
    lambda text: trim(text).translate(_PUNCTUATION),
)


class Line(NamedTuple):
    """A file line: its text and its terminator (``\\n``, ``\\r\\n``, ``\\r`` or ``""``)."""

    text: str
    ending: str


def split_file_lines(content: str) -> list[Line]:
    """Split at ``\\n``, ``\\r\\n`` and, as the 0.163.0 binary does (§8.1 names only the
    first two), a lone ``\\r``; nothing else (``str.splitlines()`` would)."""
    parts = _LINE_BREAK.split(content)  # text, break, text, break, ..., text
    lines = [Line(*pair) for pair in zip(parts[::2], parts[1::2], strict=False)]
    if parts[-1]:
        lines.append(Line(parts[-1], ""))
    return lines


def seek_sequence(
    lines: Sequence[str],
    pattern: Sequence[str],
    start: int,
    *,
    end_of_file: bool,
    cache: dict[int, list[str]],
) -> int | None:
    """The first index >= ``start`` where ``pattern`` matches; with ``end_of_file`` only the
    last lines (§9.3), failing, like 0.163.0 unlike §9.3, when they lie before ``start``.
    ``cache`` (one per file) keeps normalised lines across chunks."""
    if not pattern:
        return start
    k = len(pattern)
    last = len(lines) - k
    candidates = range(max(start, last) if end_of_file else start, last + 1)
    if not candidates:
        return None
    for number, norm in enumerate(_PASSES):
        want = [norm(p) for p in pattern]
        have = cache.get(number)
        if have is None:
            have = cache[number] = [norm(line) for line in lines]
        head = want[0]
        for i in candidates:
            if have[i] == head and have[i : i + k] == want:
                return i
    return None


def _drop_trailing_empty(ops: list[tuple[str, str]], drop_new: bool) -> list[tuple[str, str]]:
    """Remove the last old line and, if ``drop_new``, the last new line from ``ops`` (a
    context op has both roles: removing one turns it into a ``+`` or ``-`` op)."""
    ops = list(ops)
    # An op with kind ``keeper`` lacks the role being removed ("+" has no old line).
    for keeper in ("+", "-") if drop_new else ("+",):
        index = max(i for i, (k, _) in enumerate(ops) if k != keeper)
        kind, text = ops[index]
        if kind == " ":
            ops[index] = (keeper, text)
        else:
            del ops[index]
    return ops


def _runs(
    ops: Sequence[tuple[str, str]], found: int, preferred: str
) -> list[tuple[int, int, list[Line]]]:
    """One replacement per run of ``-``/``+`` lines of a matched chunk (§8.3): context
    lines between runs stay untouched in the file."""
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
    """The text of ``original`` after ``chunks``; ApplyError, naming ``display_path``, when
    an anchor or a chunk's old lines cannot be found (§8.6)."""
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
        eof = chunk.is_end_of_file
        found = seek_sequence(texts, pattern, cursor, end_of_file=eof, cache=cache)
        if found is None and pattern[-1] == "":
            drop_new = bool(chunk.new_lines) and chunk.new_lines[-1] == ""
            ops = _drop_trailing_empty(ops, drop_new)
            pattern = pattern[:-1]
            found = seek_sequence(texts, pattern, cursor, end_of_file=eof, cache=cache)
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
