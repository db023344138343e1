"""Patch text -> typed hunks (pure; APPLY_PATCH.md §2-§5), with codex-cli 0.163.0's
lenient rules and exact error messages (agents read them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from exec_server.patch.errors import InvalidHunkError, InvalidPatchError

__all__ = [
    "AddFile",
    "DeleteFile",
    "Hunk",
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
    """Split like Rust ``str::lines``: on ``\\n`` only, dropping one ``\\r`` before it
    (``str.splitlines()`` also splits on U+2028, form feed, ...: §2.2)."""
    parts = text.split("\n")
    if parts[-1] == "":
        parts.pop()
    return [p.removesuffix("\r") for p in parts]


@dataclass(frozen=True)
class UpdateChunk:
    """One ``@@`` section; ``ops``, the ``(kind, text)`` diff lines in order, let the applier
    keep context lines verbatim from the file (§8.3)."""

    anchor: str | None
    old_lines: tuple[str, ...]
    new_lines: tuple[str, ...]
    is_end_of_file: bool = False
    ops: tuple[tuple[str, str], ...] = ()


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


def _envelope(lines: list[str]) -> list[str]:
    """The envelope lines (Begin..End), unwrapping a literal heredoc once (§3.2)."""
    heredoc = len(lines) >= 4 and lines[0] in _HEREDOC_OPENERS and lines[-1].endswith("EOF")
    for candidate in (lines, lines[1:-1]) if heredoc else (lines,):
        if candidate and trim(candidate[0]) != BEGIN_PATCH:
            error = "The first line of the patch must be '*** Begin Patch'"
        elif not candidate or trim(candidate[-1]) != END_PATCH:
            error = "The last line of the patch must be '*** End Patch'"
        else:
            return candidate
    raise InvalidPatchError(error)


_VALID_HEADERS = (
    "Valid hunk headers: "
    "'*** Add File: {path}', '*** Delete File: {path}', '*** Update File: {path}'"
)


def _unexpected_line(line: str, line_number: int) -> InvalidHunkError:
    return InvalidHunkError(
        f"Unexpected line found in update hunk: '{line}'. Every line should start with "
        "' ' (context line), '+' (added line), or '-' (removed line)",
        line_number,
    )


def _expected_marker(line: str, line_number: int) -> InvalidHunkError:
    return InvalidHunkError(
        f"Expected update hunk to start with a @@ context marker, got: '{line}'", line_number
    )


@dataclass
class _Chunk:
    anchor: str | None
    ops: list[tuple[str, str]] = field(default_factory=list)
    is_end_of_file: bool = False

    def build(self) -> UpdateChunk:
        old = tuple(t for k, t in self.ops if k != "+")
        new = tuple(t for k, t in self.ops if k != "-")
        return UpdateChunk(self.anchor, old, new, self.is_end_of_file, tuple(self.ops))


class _Parser:
    """Line-at-a-time state machine over the body, as 0.163.0 parses it: modes ``started``,
    ``add``, ``delete``, ``update``, ``ended``. Header lines are trimmed, inside an Update
    hunk only at the end, so an indented line there stays a context line."""

    def __init__(self) -> None:
        self.mode = "started"
        self.hunks: list[Hunk] = []
        self.environment_id: str | None = None
        # The hunk being read: its path and header line, Add lines, Update move and chunks.
        self.path = ""
        self.header_line = 0
        self.add_lines: list[str] = []
        self.move_path: str | None = None
        self.chunks: list[_Chunk] = []

    def close_current(self, line: str, line_number: int, *, at_end: bool) -> None:
        """Finish the current hunk before a header, the End marker or the body's end."""
        if self.mode == "add":
            self.hunks.append(AddFile(self.path, "".join(self.add_lines)))
        elif self.mode == "delete":
            self.hunks.append(DeleteFile(self.path))
        elif self.mode == "update":
            if not self.chunks:
                raise InvalidHunkError(
                    f"Update file hunk for path '{self.path}' is empty", self.header_line
                )
            if not self.chunks[-1].ops:
                if at_end:
                    raise InvalidHunkError("Update hunk does not contain any lines", line_number)
                raise _unexpected_line(line, line_number)
            chunks = tuple(c.build() for c in self.chunks)
            self.hunks.append(UpdateFile(self.path, self.move_path, chunks))

    def _header(self, text: str, line: str, line_number: int) -> bool:
        if text == END_PATCH:
            self.close_current(line, line_number, at_end=True)
            self.mode = "ended"
            return True
        for marker, mode in ((_ADD, "add"), (_DELETE, "delete"), (_UPDATE, "update")):
            if text.startswith(marker):
                self.close_current(line, line_number, at_end=False)
                self.mode = mode
                self.path = text[len(marker) :]
                self.header_line = line_number
                self.add_lines = []
                self.move_path = None
                self.chunks = []
                return True
        return False

    def feed(self, line: str, line_number: int) -> None:
        trimmed = trim(line)
        if self.mode == "ended":
            # [rev] after an inner End Patch only whitespace may follow (§3.3).
            if trimmed:
                raise InvalidPatchError("The last line of the patch must be '*** End Patch'")
            return
        if self.mode == "started" and trimmed.startswith(_ENV_ID):
            if self.environment_id is not None:
                raise InvalidPatchError(
                    "apply_patch environment_id cannot be specified more than once"
                )
            self.environment_id = trim(trimmed[len(_ENV_ID) :])
            if not self.environment_id:
                raise InvalidPatchError("apply_patch environment_id cannot be empty")
            return
        header_text = trim_end(line) if self.mode == "update" else trimmed
        if self._header(header_text, line, line_number):
            return
        if self.mode == "add" and line.startswith("+"):
            self.add_lines.append(line[1:] + "\n")
            return
        if self.mode == "update":
            self._update_line(line, line_number)
            return
        raise InvalidHunkError(
            f"'{trimmed}' is not a valid hunk header. {_VALID_HEADERS}", line_number
        )

    def _update_line(self, line: str, line_number: int) -> None:
        text = trim_end(line)
        chunks = self.chunks
        last = chunks[-1] if chunks else None
        is_marker = text == "@@" or text.startswith("@@ ")
        if last is not None and last.is_end_of_file:
            # After End of File only blank lines or a new @@ chunk may follow.
            if not text:
                return
            if not is_marker:
                raise _expected_marker(line, line_number)
        if last is None and self.move_path is None and text.startswith(_MOVE):
            self.move_path = text[len(_MOVE) :]
            return
        if is_marker:
            if last is not None and not last.ops:
                raise _unexpected_line(line, line_number)  # stacked @@ lines (§2.1)
            chunks.append(_Chunk(text[3:] if text != "@@" else None))
            return
        if text == _EOF:
            if last is not None and not last.ops:
                raise InvalidHunkError("Update hunk does not contain any lines", line_number)
            if last is not None:
                last.is_end_of_file = True
            return
        kind = line[:1]
        if kind in ("", " ", "-", "+"):
            if last is None:
                last = _Chunk(None)
                chunks.append(last)
            last.ops.append((" ", "") if kind == "" else (kind, line[1:]))
            return
        if last is not None and last.ops:
            raise _expected_marker(line, line_number)
        raise _unexpected_line(line, line_number)


def parse_patch(text: str) -> ParsedPatch:
    """Raises ParseError (`InvalidPatchError`, `InvalidHunkError`): ``str(err)`` is the
    message to print (§10)."""
    lines = _envelope(split_lines(trim(text)))
    parser = _Parser()
    # Begin is line 1 (§3.6); the final End line is not fed to the state machine.
    for number, line in enumerate(lines[1:-1], start=2):
        parser.feed(line, number)
    if parser.mode != "ended":
        parser.close_current(lines[-1], len(lines), at_end=True)
    return ParsedPatch(tuple(parser.hunks), "\n".join(lines), parser.environment_id)
