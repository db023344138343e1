"""The process table's errors (``message``: the client's text); the wire code is given by
:func:`exec_server.exceptions.from_domain_error` (-32600, -32602, -32603)."""

from __future__ import annotations

__all__ = ["ProcessError", "ProcessFailedError", "ProcessInvalidError", "ProcessRefusedError"]


class ProcessError(Exception):

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ProcessRefusedError(ProcessError):
    """The process id is unknown, taken or still starting (a protocol-state refusal)."""


class ProcessInvalidError(ProcessError):
    """The request does not fit the process (a resize of one without a PTY)."""


class ProcessFailedError(ProcessError):
    """The process could not be started."""
