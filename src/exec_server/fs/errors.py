"""The filesystem code's errors: a kind and the client's text; the wire code is given by
:func:`exec_server.exceptions.from_domain_error` (-32004, -32600, -32603)."""

from __future__ import annotations

import errno
import os
from types import TracebackType
from typing import Final

from exec_server.errno_text import os_error_text

__all__ = [
    "FsError",
    "FsFailedError",
    "FsNotFoundError",
    "FsRefusedError",
    "fs_error_from_os",
    "os_error",
    "translate_os_errors",
]


class FsError(Exception):
    """A filesystem operation failed; ``message`` is the text the client sees."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class FsNotFoundError(FsError):
    """The path (or a parent of it) does not exist."""


class FsRefusedError(FsError):
    """Refused: the input is invalid or the operation is not permitted."""


class FsFailedError(FsError):
    """Any other failure (wrong file type, exists, read-only filesystem, I/O…)."""


#: Rust's ``ErrorKind`` NotFound, PermissionDenied and InvalidInput. EROFS is not a
#: refusal: upstream answers -32603 (CLIENT_COMPAT.md §6.5).
_KINDS: Final[dict[int, type[FsError]]] = {
    errno.ENOENT: FsNotFoundError,
    errno.EACCES: FsRefusedError,
    errno.EPERM: FsRefusedError,
    errno.EINVAL: FsRefusedError,
}


def fs_error_from_os(exc: OSError) -> FsError:
    """The typed error for one ``OSError``, in Rust's ``<text> (os error N)`` (§5.3)."""
    if exc.errno is None:
        return FsFailedError(str(exc))
    return _KINDS.get(exc.errno, FsFailedError)(os_error_text(exc.errno))


def os_error(code: int) -> OSError:
    """An ``OSError`` for ``code`` (for failures we detect before the kernel would)."""
    return OSError(code, os.strerror(code))


class translate_os_errors:
    """Re-raise ``OSError`` as its typed error; a plain class, as calls may take ~10 µs."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, _: TracebackType | None
    ) -> None:
        if isinstance(exc, OSError):
            raise fs_error_from_os(exc) from exc
