"""Client-side errors that are not wire errors (those come back as the
:mod:`exec_server.exceptions` classes). Closed by us vs broken by the peer follows trio.

Tree::

    ClientError
    ├── ClientClosedError       the client was closed by the caller
    ├── ConnectionLostError     transport dropped (also a builtin ConnectionError)
    ├── HandshakeError          connect/initialize failed or timed out
    ├── NotSupportedError       the server does not implement an extension method
    ├── ServerProtocolError     the server's reply does not have the expected shape
    └── ProcessError            ``run(check=True)``: the command exited non-zero
        └── ProcessTimeoutError ``run(timeout=...)`` ran out (also a builtin TimeoutError)
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "TRANSPORT_DISCONNECTED",
    "ClientClosedError",
    "ClientError",
    "ConnectionLostError",
    "HandshakeError",
    "NotSupportedError",
    "ProcessError",
    "ProcessTimeoutError",
    "ServerProtocolError",
]

#: PROTOCOL.md §13.3: the failure text reported for a dropped transport.
TRANSPORT_DISCONNECTED = "exec-server transport disconnected"


class ClientError(Exception):
    """Base of the client's own (non-wire) errors."""


class ClientClosedError(ClientError):
    """The client was closed with ``aclose()``."""


class ConnectionLostError(ClientError, ConnectionError):
    """The transport dropped: ``exec-server transport disconnected[: <reason>]``."""

    def __init__(self, reason: str | None = None) -> None:
        msg = TRANSPORT_DISCONNECTED if not reason else f"{TRANSPORT_DISCONNECTED}: {reason}"
        super().__init__(msg)
        self.reason = reason


class HandshakeError(ClientError):
    """Connecting or ``initialize`` failed; ``status`` is a refused upgrade's HTTP status."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ServerProtocolError(ClientError):
    """The server's result does not fit the method's result type."""


class NotSupportedError(ClientError):
    """The server answered an extension method with -32601; it is not sent again."""


class ProcessError(ClientError):
    """``run(check=True)`` saw a non-zero exit; carries ``argv``, ``exit_code``
    (``128+N`` after signal N, -1 if unobservable), ``stdout`` and ``stderr``."""

    def __init__(self, argv: Sequence[str], exit_code: int, stdout: bytes, stderr: bytes,
                 message: str | None = None) -> None:
        super().__init__(message or f"command {list(argv)!r} exited with code {exit_code}")
        self.argv = tuple(argv)
        self.exit_code = exit_code
        self.stdout = stdout
        self.stderr = stderr


class ProcessTimeoutError(ProcessError, TimeoutError):
    """``run(timeout=...)`` ran out and the group was terminated; output up to then."""
