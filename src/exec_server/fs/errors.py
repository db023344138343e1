"""The errors the filesystem code raises: a kind and the client's text, no wire code.

| kind                                          | error               | code   |
|-----------------------------------------------|---------------------|--------|
| not found (ENOENT)                            | ``FsNotFoundError`` | -32004 |
| invalid input (EINVAL, our own validation)    | ``FsRefusedError``  | -32600 |
| permission denied (EACCES, EPERM)             | ``FsRefusedError``  | -32600 |
| anything else (EISDIR, ENOTDIR, EEXIST, EROFS) | ``FsFailedError``   | -32603 |

The codes are assigned in one place, :func:`exec_server.exceptions.from_domain_error`
(PROTOCOL.md §9.1). The message is the OS error text in Rust's format,
``<text> (os error N)`` (PROTOCOL.md §5.3), in musl's wording as upstream's
static build prints it (:mod:`exec_server.errno_text`). EROFS is deliberately
*not* a refusal: upstream answers ``-32603 Read-only file system (os error 30)``
(CLIENT_COMPAT.md §6.5). The current Codex client depends on -32004 for a
missing parent in ``fs/writeFile`` to create the directory and retry.
"""

from __future__ import annotations

import errno
import os
from types import TracebackType
from typing import Final

from exec_server.errno_text import os_error_text

__all__ = [
    "INVALID_INPUT_ERRNOS",
    "NOT_FOUND_ERRNOS",
    "PERMISSION_ERRNOS",
    "FsError",
    "FsFailedError",
    "FsNotFoundError",
    "FsRefusedError",
    "fs_error_from_os",
    "os_error",
    "translate_os_errors",
]

NOT_FOUND_ERRNOS = frozenset({errno.ENOENT})
#: Rust's ``ErrorKind::PermissionDenied`` (EACCES, EPERM).
PERMISSION_ERRNOS = frozenset({errno.EACCES, errno.EPERM})
#: Rust's ``ErrorKind::InvalidInput`` (EINVAL).
INVALID_INPUT_ERRNOS = frozenset({errno.EINVAL})


class FsError(Exception):
    """A filesystem operation failed; ``message`` is the text the client sees.

    ``path`` (optional) is the path asked about: ``str()`` then names it, the
    wire text does not (upstream's words often leave it out).
    """

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.path = path

    def __str__(self) -> str:
        if self.path is None or self.path in self.message:
            return self.message
        return f"{self.path}: {self.message}"


class FsNotFoundError(FsError):
    """The path (or a parent of it) does not exist."""


class FsRefusedError(FsError):
    """Refused: the input is invalid or the operation is not permitted."""


class FsFailedError(FsError):
    """Any other failure (wrong file type, exists, read-only filesystem, I/O…)."""


def fs_error_from_os(exc: OSError) -> FsError:
    """The typed error for one ``OSError``."""
    code = exc.errno
    if code is None:
        return FsFailedError(str(exc))
    message = os_error_text(code)
    if code in NOT_FOUND_ERRNOS:
        return FsNotFoundError(message)
    if code in PERMISSION_ERRNOS or code in INVALID_INPUT_ERRNOS:
        return FsRefusedError(message)
    return FsFailedError(message)


def os_error(code: int) -> OSError:
    """An ``OSError`` for ``code`` (for failures we detect before the kernel would)."""
    return OSError(code, os.strerror(code))


class _TranslateOsErrors:
    """A plain context manager: it wraps every filesystem call, some answered in ~10 µs."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(exc, OSError):
            raise fs_error_from_os(exc) from exc


_TRANSLATE: Final = _TranslateOsErrors()


def translate_os_errors() -> _TranslateOsErrors:
    """Re-raise any ``OSError`` in the ``with`` block as its typed error, cause chained."""
    return _TRANSLATE
