"""Finding a chunk's lines in a file: the four-pass seek ladder (APPLY_PATCH.md §9).

Each pass scans every candidate position before the next, looser pass starts,
so an exact match late in the file beats a whitespace-insensitive one early in
it (§16.1).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from exec_server.patch.parse import trim, trim_end

__all__ = ["normalise_punctuation", "seek_sequence"]

_PUNCTUATION = str.maketrans(
    {
        **dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015\u2212", "-"),
        **dict.fromkeys("\u2018\u2019\u201a\u201b", "'"),
        **dict.fromkeys("\u201c\u201d\u201e\u201f", '"'),
        **dict.fromkeys(
            "\u00a0\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f\u3000",
            " ",
        ),
    }
)


def normalise_punctuation(text: str) -> str:
    """Trim, then map typographic dashes, quotes and odd spaces to ASCII (pass 4)."""
    return trim(text).translate(_PUNCTUATION)


#: exact, then trailing whitespace ignored, then both ends, then punctuation folded.
_PASSES: tuple[Callable[[str], str], ...] = (str, trim_end, trim, normalise_punctuation)


def seek_sequence(
    lines: Sequence[str],
    pattern: Sequence[str],
    start: int,
    *,
    end_of_file: bool,
    cache: dict[int, list[str]],
) -> int | None:
    """Return the first index >= ``start`` where ``pattern`` matches ``lines``, or None.

    With ``end_of_file`` the only candidate is ``len(lines) - len(pattern)``,
    with no fallback search (§9.3); unlike §9.3's wording, the 0.163.0 binary
    also fails when that candidate lies before ``start``.

    ``cache`` (one dict per file, reused across calls) keeps each pass's
    normalised lines so a many-chunk hunk normalises the file once per pass.
    """
    if not pattern:
        return start
    k = len(pattern)
    if k > len(lines):
        return None
    last = len(lines) - k
    if end_of_file:
        # The pattern must be the last k lines, and (as the 0.163.0 binary does)
        # that position must not lie before the cursor.
        if last < start:
            return None
        candidates = range(last, last + 1)
    else:
        candidates = range(start, last + 1)
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
