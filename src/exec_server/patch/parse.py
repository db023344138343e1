"""Patch text -> typed hunks (pure; APPLY_PATCH.md §2-§5).

The parser reproduces the lenient rules of codex-cli 0.163.0: the whole text is
trimmed, lines split on ``\\n`` only (one ``\\r`` before it dropped), the envelope
checked strictly and then once more after unwrapping a literal ``<<EOF`` heredoc,
hunk headers trimmed, diff lines not. Errors carry the exact upstream messages
because agents read them.
"""

from __future__ import annotations

from dataclasses import dataclass

from exec_server.patch.errors import InvalidHunkError, InvalidPatchError, ParseError

__all__ = [
    "BEGIN_PATCH",
    "END_PATCH",
    "AddFile",
    "DeleteFile",
    "Hunk",
    "InvalidHunkError",
    "InvalidPatchError",
    "ParseError",
    "ParsedPatch",
    "UpdateChunk",
    "UpdateFile",
    "parse_patch",
    "split_lines",
    "trim",
    "trim_end",
]

BEGIN_PATCH = "*** Begin Patch"
END_PATCH = "*** End Patch"
_ADD = "*** Add File: "
_DELETE = "*** Delete File: "
_UPDATE = "*** Update File: "
_MOVE = "*** Move to: "
_EOF = "*** End of File"
_ENV_ID = "*** Environment ID:"
_HEREDOC_OPENERS = ("<<EOF", "<<'EOF'", '<<"EOF"')

#: Unicode White_Space, i.e. Rust ``char::is_whitespace`` (str.strip() would also
#: strip U+001C-U+001F, which Rust keeps; §2.2).
WHITESPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)


def trim(text: str) -> str:
    """Rust ``str::trim``."""
    return text.strip(WHITESPACE)


def trim_end(text: str) -> str:
    """Rust ``str::trim_end``."""
    return text.rstrip(WHITESPACE)


def split_lines(text: str) -> list[str]:
    """Split like Rust ``str::lines``: on ``\\n`` only, dropping one ``\\r`` before it.

    ``str.splitlines()`` also splits on U+2028, form feed, ... which the format
    treats as ordinary characters (§2.2).
    """
    if not text:
        return []
    parts = text.split("\n")
    if parts[-1] == "":
        parts.pop()
    return [p[:-1] if p.endswith("\r") else p for p in parts]


@dataclass(frozen=True)
class UpdateChunk:
    """One ``@@`` section: old lines are context + ``-``, new lines context + ``+``.

    ``ops`` keeps the diff lines in order so the applier can keep context lines
    verbatim from the file (§8.3).
    """

    anchor: str | None
    old_lines: tuple[str, ...]
    new_lines: tuple[str, ...]
    is_end_of_file: bool = False
    ops: tuple[tuple[str, str], ...] = ()
    """The chunk's diff lines in order as ``(kind, text)``, kind in `` ``, ``-``, ``+``."""


@dataclass(frozen=True)
class AddFile:
    path: str
    contents: str


@dataclass(frozen=True)
class DeleteFile:
    path: str


@dataclass(frozen=True)
class UpdateFile:
    path: str
    move_path: str | None
    chunks: tuple[UpdateChunk, ...]


Hunk = AddFile | DeleteFile | UpdateFile


@dataclass(frozen=True)
class ParsedPatch:
    """Result of `parse_patch`: the hunks and the canonical patch text (§3.5)."""

    hunks: tuple[Hunk, ...]
    patch: str
    environment_id: str | None = None


def _check_envelope(lines: list[str]) -> None:
    first = trim(lines[0]) if lines else None
    last = trim(lines[-1]) if lines else None
    if first == BEGIN_PATCH and last == END_PATCH and len(lines) >= 2:
        return
    if first is not None and first != BEGIN_PATCH:
        raise InvalidPatchError("The first line of the patch must be '*** Begin Patch'")
    raise InvalidPatchError("The last line of the patch must be '*** End Patch'")


def _envelope(lines: list[str]) -> list[str]:
    """Return the envelope lines (Begin..End), unwrapping a literal heredoc once (§3.2)."""
    try:
        _check_envelope(lines)
        return lines
    except InvalidPatchError:
        if len(lines) >= 4 and lines[0] in _HEREDOC_OPENERS and lines[-1].endswith("EOF"):
            inner = lines[1:-1]
            _check_envelope(inner)
            return inner
        raise


def _is_bare_at(line: str) -> bool:
    return line.startswith("@@") and trim_end(line) == "@@"


def _is_eof_marker(line: str) -> bool:
    return line.startswith(_EOF) and trim_end(line) == _EOF


class _Parser:
    """Walks the body lines; ``offset`` converts a body index into a patch line number."""

    def __init__(self, body: list[str], offset: int) -> None:
        self.body = body
        self.offset = offset
        self.pos = 0

    def line_no(self, index: int) -> int:
        return index + self.offset

    def header_error(self, index: int) -> InvalidHunkError:
        text = trim(self.body[index])
        return InvalidHunkError(
            f"'{text}' is not a valid hunk header. Valid hunk headers: "
            "'*** Add File: {path}', '*** Delete File: {path}', '*** Update File: {path}'",
            self.line_no(index),
        )

    def hunks(self) -> list[Hunk]:
        body = self.body
        hunks: list[Hunk] = []
        while self.pos < len(body):
            header = trim(body[self.pos])
            if header == END_PATCH:
                # [rev] an inner end marker ends the body; only whitespace may follow.
                if any(trim(rest) for rest in body[self.pos + 1 :]):
                    raise InvalidPatchError("The last line of the patch must be '*** End Patch'")
                break
            if header.startswith(_ADD):
                hunks.append(self.add_hunk(header[len(_ADD) :]))
            elif header.startswith(_DELETE):
                hunks.append(DeleteFile(header[len(_DELETE) :]))
                self.pos += 1
            elif header.startswith(_UPDATE):
                hunks.append(self.update_hunk(header[len(_UPDATE) :]))
            else:
                raise self.header_error(self.pos)
        return hunks

    def add_hunk(self, path: str) -> AddFile:
        body = self.body
        self.pos += 1
        content: list[str] = []
        while self.pos < len(body) and body[self.pos].startswith("+"):
            content.append(body[self.pos][1:] + "\n")
            self.pos += 1
        return AddFile(path, "".join(content))

    def update_hunk(self, path: str) -> UpdateFile:
        body = self.body
        header_index = self.pos
        self.pos += 1
        move_path: str | None = None
        if self.pos < len(body) and body[self.pos].startswith(_MOVE):
            move_path = trim_end(body[self.pos][len(_MOVE) :])
            self.pos += 1
        chunks: list[UpdateChunk] = []
        after_eof = False
        while self.pos < len(body):
            line = body[self.pos]
            if after_eof and not trim(line):
                # 0.163.0 skips blank lines after an End of File marker.
                self.pos += 1
                continue
            if line.startswith("*"):
                break
            chunk = self.chunk(first=not chunks)
            chunks.append(chunk)
            after_eof = chunk.is_end_of_file
        if not chunks:
            raise InvalidHunkError(
                f"Update file hunk for path '{path}' is empty", self.line_no(header_index)
            )
        return UpdateFile(path, move_path, tuple(chunks))

    def chunk(self, *, first: bool) -> UpdateChunk:
        body = self.body
        line = body[self.pos]
        anchor: str | None = None
        if _is_bare_at(line):
            self.pos += 1
        elif line.startswith("@@ "):
            anchor = trim_end(line[3:]) or None
            self.pos += 1
        elif not first:
            raise InvalidHunkError(
                f"Expected update hunk to start with a @@ context marker, got: '{line}'",
                self.line_no(self.pos),
            )
        if self.pos >= len(body):
            raise InvalidHunkError("Update hunk does not contain any lines", self.line_no(self.pos))
        ops: list[tuple[str, str]] = []
        is_eof = False
        while self.pos < len(body):
            text = body[self.pos]
            if _is_eof_marker(text):
                if not ops:
                    raise InvalidHunkError(
                        "Update hunk does not contain any lines", self.line_no(self.pos)
                    )
                is_eof = True
                self.pos += 1
                break
            kind = text[:1]
            if kind == "":
                ops.append((" ", ""))
            elif kind in (" ", "-", "+"):
                ops.append((kind, text[1:]))
            else:
                if not ops:
                    raise InvalidHunkError(
                        f"Unexpected line found in update hunk: '{text}'. Every line should "
                        "start with ' ' (context line), '+' (added line), or '-' (removed line)",
                        self.line_no(self.pos),
                    )
                break
            self.pos += 1
        old = tuple(t for k, t in ops if k != "+")
        new = tuple(t for k, t in ops if k != "-")
        return UpdateChunk(anchor, old, new, is_eof, tuple(ops))


def parse_patch(text: str) -> ParsedPatch:
    """Parse patch text into hunks.

    Raises:
        ParseError: `InvalidPatchError` or `InvalidHunkError`; ``str(err)`` is the
            message to print (§10).
    """
    lines = _envelope(split_lines(trim(text)))
    body = lines[1:-1]
    offset = 2  # body[0] is line 2: Begin is line 1 (§3.6)
    env_id: str | None = None
    while body and trim(body[0]).startswith(_ENV_ID):
        if env_id is not None:
            raise InvalidPatchError("apply_patch environment_id cannot be specified more than once")
        env_id = trim(trim(body[0])[len(_ENV_ID) :])
        if not env_id:
            raise InvalidPatchError("apply_patch environment_id cannot be empty")
        body = body[1:]
        offset += 1
    hunks = _Parser(body, offset).hunks()
    return ParsedPatch(tuple(hunks), "\n".join(lines), env_id)
