"""Errors of the apply_patch package; ``str(err)`` is the exact text agents read::

    PatchError
    ├── ParseError            the patch text breaks the grammar
    │   ├── InvalidPatchError     ``Invalid patch: …``
    │   └── InvalidHunkError      ``Invalid patch hunk on line N: …``
    ├── ApplyError            a hunk could not be applied (I/O or unmatched context)
    └── CorrectnessError      verified parse of a shell command failed (§12.2)
"""

from __future__ import annotations

__all__ = [
    "ApplyError",
    "CorrectnessError",
    "InvalidHunkError",
    "InvalidPatchError",
    "ParseError",
    "PatchError",
]


class PatchError(Exception):
    """Base of every error this package raises."""


class ParseError(PatchError):
    """A patch that does not follow the grammar."""


class InvalidPatchError(ParseError):
    def __init__(self, message: str) -> None:
        super().__init__(f"Invalid patch: {message}")
        self.message = message


class InvalidHunkError(ParseError):
    """``line_number``: Begin is line 1."""

    def __init__(self, message: str, line_number: int) -> None:
        super().__init__(f"Invalid patch hunk on line {line_number}: {message}")
        self.message = message
        self.line_number = line_number


class ApplyError(PatchError):
    """Applying a hunk failed; earlier hunks stay applied (no rollback, §7.1)."""


class CorrectnessError(PatchError):
    """``kind``: ``"implicit_invocation"``, ``"parse"``, ``"io"`` or ``"compute"``."""

    def __init__(self, kind: str, message: str, cause: Exception | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.cause = cause
