"""Handshake state of one server connection (PROTOCOL.md §4.1-§4.3), and lifecycle texts::

    NEW --initialize--> REQUESTED --ok--> ACCEPTED --initialized--> READY
                             \\--failed--> NEW   (client may retry)
"""

from __future__ import annotations

import enum
from typing import Final, Literal, TypeAlias

from exec_server.exceptions import InvalidRequestError, ProtocolClosedError

__all__ = [
    "NO_SESSION",
    "SESSION_RESUMED",
    "Family",
    "Handshake",
    "HandshakeState",
    "already_attached_text",
    "malformed_message_text",
    "method_not_found_text",
    "unknown_session_text",
]

#: Which gate a method passes through (§4.3); ``None`` means "no gating".
Family: TypeAlias = Literal["exec", "filesystem", "http", "environment config"] | None

NO_SESSION: Final = "client must call initialize before using methods"
SESSION_RESUMED: Final = "session has been resumed by another connection"


def unknown_session_text(session_id: str) -> str:
    return f"unknown session id {session_id}"


def already_attached_text(session_id: str) -> str:
    return f"session {session_id} is already attached to another connection"


def method_not_found_text(method: str) -> str:
    return f"exec-server stub does not implement `{method}` yet"


def malformed_message_text(kind: str, label: str, detail: str) -> str:
    """The answer to a message that is not JSON-RPC (§3.6)."""
    framing = "websocket JSON-RPC" if kind == "websocket" else "JSON-RPC"
    return f"failed to parse {framing} message from {label}: {detail}"


class HandshakeState(enum.Enum):
    NEW = "new"
    REQUESTED = "requested"
    ACCEPTED = "accepted"
    READY = "ready"


class Handshake:
    """``initialize`` -> ``initialized`` ordering for one connection."""

    def __init__(self) -> None:
        self.state = HandshakeState.NEW

    def begin_initialize(self) -> None:
        """Raises InvalidRequestError when ``initialize`` was already sent (§4.1)."""
        if self.state is not HandshakeState.NEW:
            raise InvalidRequestError("initialize may only be sent once per connection")
        self.state = HandshakeState.REQUESTED

    def initialize_failed(self) -> None:
        """Attaching failed: the client may send ``initialize`` again (§4.1 step 3)."""
        if self.state is HandshakeState.REQUESTED:
            self.state = HandshakeState.NEW

    def initialize_succeeded(self) -> None:
        if self.state is HandshakeState.REQUESTED:
            self.state = HandshakeState.ACCEPTED

    def on_initialized(self, *, attached: bool) -> None:
        """The ``initialized`` notification (§4.2), idempotent; ProtocolClosedError
        before ``initialize`` or after eviction."""
        if self.state in (HandshakeState.NEW, HandshakeState.REQUESTED):
            raise ProtocolClosedError("received `initialized` notification before `initialize`")
        if not attached:
            raise ProtocolClosedError(SESSION_RESUMED)
        self.state = HandshakeState.READY

    def gate(self, family: Family, *, has_session: bool, attached: bool) -> None:
        """The §4.3 checks for a ``family`` method, in the spec's order; raises
        InvalidRequestError with upstream's text."""
        if family is None:
            return
        if self.state in (HandshakeState.NEW, HandshakeState.REQUESTED):
            raise InvalidRequestError(f"client must call initialize before using {family} methods")
        if not has_session:
            raise InvalidRequestError(NO_SESSION)
        if not attached:
            raise InvalidRequestError(SESSION_RESUMED)
        if self.state is not HandshakeState.READY:
            raise InvalidRequestError(f"client must send initialized before using {family} methods")
