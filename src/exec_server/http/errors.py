"""Errors of :mod:`exec_server.http`; ``message`` is the exact text a client sees."""

from __future__ import annotations

__all__ = ["HttpBodyFailed", "HttpError", "HttpRequestFailed", "HttpRequestInvalid"]


class HttpError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class HttpRequestInvalid(HttpError):
    """A method, URL, header or environment variable the executor will not send."""


class HttpRequestFailed(HttpError):
    """No response head arrived (connect, DNS, TLS, deadline)."""

    def __init__(self, cause: str) -> None:
        super().__init__(f"http/request failed: {cause}")
        self.cause = cause


class HttpBodyFailed(HttpError):
    """The body broke off; ``cause`` is what a streamed body's last frame reports."""

    def __init__(self, cause: str) -> None:
        super().__init__(f"failed to read http/request response body: {cause}")
        self.cause = cause
