"""Errors of the :mod:`exec_server.http` package; ``message`` is the exact text a client sees.

Tree::

    HttpError                  base, never raised directly
    ├── HttpRequestInvalid     the request is refused before anything is sent
    ├── HttpRequestFailed      no response head arrived (connect, DNS, TLS, deadline)
    └── HttpBodyFailed         the response body broke off (truncated, reset, deadline)
"""

from __future__ import annotations

__all__ = ["HttpBodyFailed", "HttpError", "HttpRequestFailed", "HttpRequestInvalid"]


class HttpError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class HttpRequestInvalid(HttpError):
    """A method, URL, header or environment variable the executor will not send."""


class HttpRequestFailed(HttpError):
    """The request got no response head."""

    def __init__(self, cause: str) -> None:
        super().__init__(f"http/request failed: {cause}")
        self.cause = cause


class HttpBodyFailed(HttpError):
    """The body ended early; ``cause`` is what a streamed body's last frame reports."""

    def __init__(self, cause: str) -> None:
        super().__init__(f"failed to read http/request response body: {cause}")
        self.cause = cause
