"""Client-side errors that are not wire errors.

Wire errors come back as the :mod:`exec_server.exceptions` classes (rebuilt from
their code by ``error_for_code``). These classes describe the client's own
connection state: closed by us (:class:`ClientClosedError`) versus broken by the
peer or the network (:class:`ConnectionLostError`), after trio's Closed/Broken
split.

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
    """The client was closed with ``aclose()``; no further calls are possible."""


class ConnectionLostError(ClientError, ConnectionError):
    """The transport dropped; pending calls fail with this.

    Message: ``exec-server transport disconnected`` optionally followed by
    ``: <reason>`` (PROTOCOL.md §13.3).
    """

    def __init__(self, reason: str | None = None) -> None:
        msg = TRANSPORT_DISCONNECTED if not reason else f"{TRANSPORT_DISCONNECTED}: {reason}"
        super().__init__(msg)
        self.reason = reason


class HandshakeError(ClientError):
    """Connecting or the ``initialize`` handshake failed (or timed out).

    ``status`` is the HTTP status of a refused upgrade (401: the token was
    missing or wrong, the message says which), else None.
    """

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ServerProtocolError(ClientError):
    """The server answered with a result that does not fit the method's result type."""


class NotSupportedError(ClientError):
    """The server answered an extension method (``process/resizePty``,
    ``process/closeStdin``) with "method not found" (upstream does); the
    client does not send it to that connection again."""


class ProcessError(ClientError):
    """A command run by ``run(check=True)`` failed; carries what it produced.

    Attributes:
        argv: the command as started.
        exit_code: its exit code (``128+N`` after signal N; -1 if unobservable).
        stdout, stderr: everything it wrote (PTY output is in ``stdout``).
    """

    def __init__(self, argv: Sequence[str], exit_code: int, stdout: bytes, stderr: bytes,
                 message: str | None = None) -> None:
        super().__init__(message or f"command {list(argv)!r} exited with code {exit_code}")
        self.argv = tuple(argv)
        self.exit_code = exit_code
        self.stdout = stdout
        self.stderr = stderr


class ProcessTimeoutError(ProcessError, TimeoutError):
    """``run(timeout=...)`` ran out: the process group was terminated.

    ``stdout``/``stderr`` hold the output up to then; ``exit_code`` is the
    status after the termination (-1 if it was not observed in time).
    """
