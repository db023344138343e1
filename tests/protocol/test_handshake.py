"""The per-connection handshake state machine (PROTOCOL.md §4.1-§4.3), no I/O."""

from __future__ import annotations

import pytest

from exec_server.exceptions import InvalidRequestError, ProtocolClosedError
from exec_server.protocol.handshake import Handshake, HandshakeState


def test_happy_path() -> None:
    h = Handshake()
    h.begin_initialize()
    h.initialize_succeeded()
    assert h.state is HandshakeState.ACCEPTED
    h.on_initialized(attached=True)
    h.on_initialized(attached=True)  # twice is harmless
    assert h.state is HandshakeState.READY
    h.gate("exec", has_session=True, attached=True)
    h.gate(None, has_session=False, attached=False)  # ungated methods


def test_initialize_once_and_retry_after_failure() -> None:
    h = Handshake()
    h.begin_initialize()
    h.initialize_failed()
    h.begin_initialize()  # allowed again (§4.1 step 3)
    h.initialize_succeeded()
    with pytest.raises(InvalidRequestError) as info:
        h.begin_initialize()
    assert info.value.message == "initialize may only be sent once per connection"


@pytest.mark.parametrize(
    ("setup", "has_session", "attached", "message"),
    [
        ("new", False, False, "client must call initialize before using exec methods"),
        ("accepted", False, False, "client must call initialize before using methods"),
        ("accepted", True, False, "session has been resumed by another connection"),
        ("accepted", True, True, "client must send initialized before using exec methods"),
        ("ready", True, False, "session has been resumed by another connection"),
    ],
)
def test_gate_order(setup: str, has_session: bool, attached: bool, message: str) -> None:
    h = Handshake()
    if setup != "new":
        h.begin_initialize()
        h.initialize_succeeded()
    if setup == "ready":
        h.on_initialized(attached=True)
    with pytest.raises(InvalidRequestError) as info:
        h.gate("exec", has_session=has_session, attached=attached)
    assert info.value.message == message
    assert info.value.code == -32600


def test_initialized_before_initialize_or_after_eviction_closes() -> None:
    with pytest.raises(ProtocolClosedError, match="before `initialize`"):
        Handshake().on_initialized(attached=True)
    h = Handshake()
    h.begin_initialize()
    h.initialize_succeeded()
    with pytest.raises(ProtocolClosedError, match="resumed by another connection"):
        h.on_initialized(attached=False)
