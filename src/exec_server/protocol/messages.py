"""Inbound JSON-RPC-lite envelopes (PROTOCOL.md §3.1) and the ``initialize`` payloads.

No ``"jsonrpc"`` member. Payloads stay :class:`msgspec.Raw` until the method is known,
so the envelope decoder never builds dicts."""

from __future__ import annotations

from typing import Annotated, Final, TypeAlias

import msgspec

from exec_server.protocol.json_span import StringSpan

__all__ = [
    "MALFORMED_ID",
    "EnvironmentCapabilities",
    "EnvironmentInfo",
    "ErrorObject",
    "ErrorResponse",
    "InitializeParams",
    "InitializeResult",
    "Message",
    "Notification",
    "Request",
    "RequestId",
    "Response",
    "ShellInfo",
]

#: An i64 or a string, echoed unchanged; any other id makes the message malformed.
RequestId: TypeAlias = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)] | str

#: The id used when answering a message that could not be parsed (§3.5).
MALFORMED_ID: Final[int] = -1


class Request(msgspec.Struct, frozen=True):
    """``params`` is None when absent (``null`` is ``Raw(b"null")``); ``span``, a big
    ``fs/writeFile``'s ``dataBase64`` left in place (``codec.decode_message``)."""

    id: RequestId
    method: str
    params: msgspec.Raw | None = None
    span: StringSpan | None = None


class Notification(msgspec.Struct, frozen=True):
    method: str
    params: msgspec.Raw | None = None


class Response(msgspec.Struct, frozen=True):
    id: RequestId
    result: msgspec.Raw


class ErrorObject(msgspec.Struct, frozen=True, omit_defaults=True):
    """The ``error`` member of an error answer; the server never sets ``data``."""

    code: int
    message: str
    data: msgspec.Raw | None = None


class ErrorResponse(msgspec.Struct, frozen=True):
    id: RequestId
    error: ErrorObject


#: Every inbound message shape, in decoding order (§3.1 "first shape that fits").
Message: TypeAlias = Request | Notification | Response | ErrorResponse

# --- lifecycle and environment payloads (PROTOCOL.md §4.1, CLIENT_COMPAT.md §2-§3)


class InitializeParams(msgspec.Struct, frozen=True, rename="camel"):
    """``initialize`` params; ``clientName`` is only logged."""

    client_name: str
    resume_session_id: str | None = None


class ShellInfo(msgspec.Struct, frozen=True):
    """The login shell the current client wraps commands in (a plain path)."""

    name: str
    path: str


class EnvironmentCapabilities(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    """Optional features; every flag defaults to false and is omitted when false."""

    network_proxy_launch: bool = False
    capability_discovery_sandbox: bool = False
    capability_discovery_v2: bool = False
    environment_config_read: bool = False
    http_header_env_vars: bool = False
    sandboxed_file_streaming: bool = False
    file_write_streaming: bool = False
    shell_snapshot_v2: bool = False
    windows_mxc: bool = False
    linux_root_write_preserves_devices: bool = False
    linux_approved_root_write_preserves_restrictions: bool = False


class EnvironmentInfo(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    """``environmentInfo`` / ``environment/info`` result (CLIENT_COMPAT.md §2); paths
    are URIs."""

    shell: ShellInfo
    executor_version: str = "0.0.0"
    provider_id: str | None = None
    cwd: str | None = None
    user_home_dir: str | None = None
    platform_os: str | None = None
    prepend_path_dirs: list[str] | None = None
    temporary_directories: list[str] | None = None
    temp_dir: str | None = None
    capabilities: EnvironmentCapabilities = msgspec.field(default_factory=EnvironmentCapabilities)


class InitializeResult(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    """``environmentInfo`` is for the current client generation only."""

    session_id: str
    environment_info: EnvironmentInfo | None = None
