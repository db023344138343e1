"""The one place where filesystem failures become typed errors (PROTOCOL.md §9.1).

| kind                                              | error                 | code   |
|---------------------------------------------------|-----------------------|--------|
| not found (ENOENT)                                | ``NotFoundError``     | -32004 |
| invalid input (EINVAL, our own validation)        | ``InvalidRequestError`` | -32600 |
| permission denied (EACCES, EPERM)                 | ``InvalidRequestError`` | -32600 |
| anything else (EISDIR, ENOTDIR, EEXIST, EROFS, …) | ``InternalError``     | -32603 |

The message is the OS error text in Rust's format, ``<text> (os error N)``
(PROTOCOL.md §5.3), in musl's wording as upstream's static build prints it
(:mod:`exec_server.errno_text`: ``I/O error``, ``Symbolic link loop``...).
EROFS is deliberately *not* a permission error: upstream
answers ``-32603 Read-only file system (os error 30)`` (CLIENT_COMPAT.md §6.5).
The current Codex client depends on -32004 for a missing parent in
``fs/writeFile`` to create the directory and retry.
"""

from __future__ import annotations

import errno
import os
from types import TracebackType
from typing import Final

from exec_server.exceptions import (
    ExecServerError,
    InternalError,
    InvalidRequestError,
    NotFoundError,
    os_error_message,
)

__all__ = [
    "INVALID_INPUT_ERRNOS",
    "NOT_FOUND_ERRNOS",
    "PERMISSION_ERRNOS",
    "fs_error_from_os",
    "os_error",
    "translate_os_errors",
]

NOT_FOUND_ERRNOS = frozenset({errno.ENOENT})
#: Rust's ``ErrorKind::PermissionDenied`` (EACCES, EPERM).
PERMISSION_ERRNOS = frozenset({errno.EACCES, errno.EPERM})
#: Rust's ``ErrorKind::InvalidInput`` (EINVAL).
INVALID_INPUT_ERRNOS = frozenset({errno.EINVAL})


def fs_error_from_os(exc: OSError) -> ExecServerError:
    """Translate one ``OSError`` into the typed error the wire expects."""
    message = os_error_message(exc)
    code = exc.errno
    if code in NOT_FOUND_ERRNOS:
        return NotFoundError(message)
    if code in PERMISSION_ERRNOS or code in INVALID_INPUT_ERRNOS:
        return InvalidRequestError(message)
    return InternalError(message)


def os_error(code: int) -> OSError:
    """An ``OSError`` for ``code`` (for failures we detect before the kernel would)."""
    return OSError(code, os.strerror(code))


class _TranslateOsErrors:
    """A plain context manager: about a third of ``@contextmanager``'s cost, and
    it wraps every filesystem call, some of them answered in ~10 µs."""

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
