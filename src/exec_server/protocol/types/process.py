"""Wire structs of the ``process/*`` methods, both generations (PROTOCOL.md §8,
CLIENT_COMPAT.md §4-§5): current-only members default to ``UNSET`` (omitted), and
their presence tells the generations apart (CLIENT_COMPAT §1.2 rule 4)."""

from __future__ import annotations

import enum
from typing import Annotated, Literal, TypeAlias

import msgspec
from msgspec import UNSET, UnsetType

__all__ = [
    "METHOD_CLOSE_STDIN",
    "METHOD_READ",
    "METHOD_RESIZE_PTY",
    "METHOD_SIGNAL",
    "METHOD_START",
    "METHOD_TERMINATE",
    "METHOD_WRITE",
    "NOTIFY_CLOSED",
    "NOTIFY_EXITED",
    "NOTIFY_OUTPUT",
    "CloseStdinParams",
    "CloseStdinResult",
    "ClosedNotification",
    "EnvPolicy",
    "ExitedNotification",
    "ManagedNetwork",
    "OutputChunk",
    "OutputNotification",
    "ProcessMetadata",
    "ProcessStream",
    "ReadParams",
    "ReadResult",
    "ResizePtyParams",
    "ResizePtyResult",
    "SignalParams",
    "SignalResult",
    "StartParams",
    "StartResult",
    "TerminateParams",
    "TerminateResult",
    "WriteParams",
    "WriteResult",
    "WriteStatus",
]

METHOD_START = "process/start"
METHOD_READ = "process/read"
METHOD_WRITE = "process/write"
METHOD_TERMINATE = "process/terminate"
METHOD_SIGNAL = "process/signal"
#: extensions of this server (upstream answers -32601).
METHOD_RESIZE_PTY = "process/resizePty"
METHOD_CLOSE_STDIN = "process/closeStdin"
NOTIFY_OUTPUT = "process/output"
NOTIFY_EXITED = "process/exited"
NOTIFY_CLOSED = "process/closed"


class ProcessStream(enum.Enum):
    """Label of an output chunk: pipes give stdout/stderr, a PTY gives ``pty``."""

    STDOUT = "stdout"
    STDERR = "stderr"
    PTY = "pty"


class WriteStatus(enum.Enum):
    """Result of ``process/write`` (PROTOCOL.md §8.5, CLIENT_COMPAT.md §5.1)."""

    ACCEPTED = "accepted"
    UNKNOWN_PROCESS = "unknownProcess"
    STARTING = "starting"
    STDIN_CLOSED = "stdinClosed"


class EnvPolicy(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Current client's shell-environment policy (CLIENT_COMPAT.md §4.1)."""

    inherit: Literal["all", "core", "none"]
    ignore_default_excludes: bool
    exclude: list[str]
    set: dict[str, str]
    include_only: list[str]


class ProcessMetadata(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Attribution only; accepted and ignored."""

    thread_id: str | None = None
    tool_call_id: str | None = None


class ManagedNetwork(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Managed-network details of the current client (not implemented here)."""

    loopback_ports: list[int] | None = None
    allow_local_binding: bool | None = None


class StartParams(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """``sandbox`` stays raw JSON for the sandbox layer (``sandbox_raw``)."""

    process_id: str
    argv: list[str]
    cwd: str
    env: dict[str, str]
    tty: bool
    arg0: str | None = None
    sandbox: msgspec.Raw | UnsetType = UNSET
    # current-client members
    env_policy: EnvPolicy | UnsetType | None = UNSET
    metadata: ProcessMetadata | UnsetType | None = UNSET
    pipe_stdin: bool | UnsetType | None = UNSET
    enforce_managed_network: bool | UnsetType | None = UNSET
    managed_network: ManagedNetwork | UnsetType | None = UNSET
    network_proxy: msgspec.Raw | UnsetType = UNSET
    shell_snapshot: msgspec.Raw | UnsetType = UNSET


class StartResult(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Legacy sets ``sandbox`` (kebab-case type), current ``sandboxType``."""

    process_id: str
    sandbox: str | UnsetType = UNSET
    sandbox_type: str | UnsetType = UNSET


class ReadParams(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    process_id: str
    after_seq: int | None = None
    max_bytes: int | None = None
    wait_ms: int | None = None


class OutputChunk(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    seq: int
    stream: ProcessStream
    chunk: bytes


class ReadResult(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """``sandboxDenied`` only for current-generation processes."""

    chunks: list[OutputChunk]
    next_seq: int
    exited: bool
    exit_code: int | None
    closed: bool
    failure: str | None = None
    sandbox_denied: bool | UnsetType = UNSET


class WriteParams(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    process_id: str
    chunk: bytes
    write_id: str | UnsetType = UNSET


class WriteResult(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    status: WriteStatus


class TerminateParams(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    process_id: str


CloseStdinParams: TypeAlias = TerminateParams


class TerminateResult(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    running: bool


class SignalParams(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Current client only; ``interrupt`` is SIGINT to the group."""

    process_id: str
    signal: Literal["interrupt"]


class SignalResult(msgspec.Struct, frozen=True):
    """``{}``, the result of ``process/signal``, ``resizePty`` and ``closeStdin``."""


ResizePtyResult: TypeAlias = SignalResult
CloseStdinResult: TypeAlias = SignalResult

#: A terminal dimension: ``struct winsize`` holds unsigned shorts.
WinSize = Annotated[int, msgspec.Meta(ge=1, le=65535)]


class ResizePtyParams(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    process_id: str
    rows: WinSize
    cols: WinSize


class OutputNotification(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    process_id: str
    seq: int
    stream: ProcessStream
    chunk: bytes


class ExitedNotification(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """``sandboxDenied`` only for current-generation processes."""

    process_id: str
    seq: int
    exit_code: int
    sandbox_denied: bool | UnsetType = UNSET


class ClosedNotification(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    process_id: str
    seq: int
