"""Every error the exec-server answers with, and its JSON-RPC code (PROTOCOL.md §3.3).

Tree::

    ExecServerError                      base, never raised directly
    ├── InvalidRequestError     -32600   protocol-state violations, permission
    │   │                                problems, sandbox denials
    │   └── AlreadyAttachedError -32010  resume of an attached session (0.163 servers)
    ├── MethodNotFoundError     -32601
    ├── InvalidParamsError      -32602   params that do not decode / validate
    ├── InternalError           -32603   spawn failures, other OS errors
    └── NotFoundError           -32004   filesystem "not found"

Domain packages raise their own errors, free of codes: :func:`from_domain_error`
is the one place they become the classes above. ``ProtocolClosedError`` is no wire
error: the transport closes the connection without replying (§3.5).
"""

from __future__ import annotations

import enum
import re

from exec_server.errno_text import os_error_text
from exec_server.fs.errors import FsError, FsNotFoundError, FsRefusedError
from exec_server.hostconfig import ConfigReadError
from exec_server.http.errors import HttpError, HttpRequestInvalid
from exec_server.process.errors import ProcessError, ProcessInvalidError, ProcessRefusedError
from exec_server.sandbox.errors import SandboxError, SandboxPolicyError

__all__ = [
    "AlreadyAttachedError",
    "ErrorCode",
    "ExecServerError",
    "InternalError",
    "InvalidParamsError",
    "InvalidRequestError",
    "MethodNotFoundError",
    "NotFoundError",
    "ProtocolClosedError",
    "error_for_code",
    "from_domain_error",
    "os_error_message",
    "params_error_text",
    "u64_param",
    "wire_error",
]


class ErrorCode(enum.IntEnum):
    """JSON-RPC error codes the server produces (PROTOCOL.md §3.3)."""

    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603
    NOT_FOUND = -32004
    ALREADY_ATTACHED = -32010


class ExecServerError(Exception):
    """Base of every error that becomes a JSON-RPC error object; ``message`` is the wire
    text, ``path`` (set by the client's filesystem API) is named by ``str()``."""

    code: int = ErrorCode.INTERNAL_ERROR

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.path = path

    def __str__(self) -> str:
        if self.path is None or self.path in self.message:
            return self.message
        return f"{self.path}: {self.message}"


class InvalidRequestError(ExecServerError):
    code = ErrorCode.INVALID_REQUEST


class AlreadyAttachedError(InvalidRequestError):
    code = ErrorCode.ALREADY_ATTACHED


class MethodNotFoundError(ExecServerError):
    code = ErrorCode.METHOD_NOT_FOUND


class InvalidParamsError(ExecServerError):
    code = ErrorCode.INVALID_PARAMS


class InternalError(ExecServerError):
    code = ErrorCode.INTERNAL_ERROR


class NotFoundError(ExecServerError):
    code = ErrorCode.NOT_FOUND


class ProtocolClosedError(Exception):
    """The peer broke the protocol in a way that closes the connection unanswered."""


_BY_CODE: dict[int, type[ExecServerError]] = {
    c.code: c
    for c in (InvalidRequestError, AlreadyAttachedError, MethodNotFoundError, InvalidParamsError,
              InternalError, NotFoundError)
}


def error_for_code(code: int, message: str) -> ExecServerError:
    """Rebuild a typed error from a received code; unknown codes become the base."""
    cls = _BY_CODE.get(code)
    if cls is None:
        err = ExecServerError(message)
        err.code = code
        return err
    return cls(message)


def from_domain_error(exc: BaseException) -> ExecServerError | None:
    """The wire error for a domain package's error, or None (PROTOCOL.md §9.1; the table is
    in docs/ARCHITECTURE.md)."""
    if isinstance(exc, FsError):
        if isinstance(exc, FsNotFoundError):
            return NotFoundError(exc.message)
        if isinstance(exc, FsRefusedError):
            return InvalidRequestError(exc.message)
        return InternalError(exc.message)
    if isinstance(exc, ProcessRefusedError):
        return InvalidRequestError(exc.message)
    if isinstance(exc, SandboxPolicyError | HttpRequestInvalid | ProcessInvalidError):
        return InvalidParamsError(exc.message)
    if isinstance(exc, SandboxError | HttpError | ConfigReadError | ProcessError):
        return InternalError(exc.message)
    return None


def wire_error(exc: BaseException) -> ExecServerError | None:
    if isinstance(exc, ExecServerError):
        return exc
    return from_domain_error(exc)


def u64_param(value: int | None, name: str) -> int | None:
    """Upstream's ``u64`` bound in serde's words (msgspec's ``int`` is unbounded)."""
    if value is not None and not 0 <= value <= 2**64 - 1:
        raise InvalidParamsError(f"invalid value: integer `{value}`, expected u64 for `{name}`")
    return value


def os_error_message(exc: OSError) -> str:
    """An OSError as upstream (Rust std on musl) shows it: ``<text> (os error N)``."""
    if exc.errno is None:
        return str(exc)
    return os_error_text(exc.errno)


_MISSING_FIELD = re.compile(r"\bObject missing required field (`[^`]*`)")


def params_error_text(message: str) -> str:
    """msgspec's params error with a missing member in serde's words, ``missing field
    `x```, which CLIENT_COMPAT.md quotes; other texts are no contract (PROTOCOL.md §3.2)."""
    return _MISSING_FIELD.sub(r"missing field \1", message)
