"""Server configuration: one frozen value the CLI builds from flags (the library never reads
the environment or argv). Every limit is a named default (STYLE.md §2.12)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Final, Literal

__all__ = [
    "DEFAULT_CLOSED_RETENTION",
    "DEFAULT_CONCURRENT_REQUESTS",
    "DEFAULT_DETACH_TTL",
    "DEFAULT_FS_HELPER_TIMEOUT",
    "DEFAULT_LISTEN",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "DEFAULT_OUTPUT_CAP",
    "SandboxBackendName",
    "ServerConfig",
    "WsAuthMode",
    "WsAuthSettings",
]

#: PROTOCOL.md §14: port 0 lets the OS choose; the bound URL is printed.
DEFAULT_LISTEN: Final = "ws://127.0.0.1:0"
#: PROTOCOL.md §4.4: a detached session survives this long (seconds).
DEFAULT_DETACH_TTL: Final = 10.0
#: PROTOCOL.md §14: a closed process id is kept (and readable) this long (seconds).
DEFAULT_CLOSED_RETENTION: Final = 30.0
#: PROTOCOL.md §8.3: retained output per process (bytes).
DEFAULT_OUTPUT_CAP: Final = 1_048_576
#: Largest inbound message (bytes): a 512 MiB ``fs/writeFile`` (the §14 read limit,
#: mirrored) is 683 MiB of base64 plus envelope; 1 GiB fits it and still bounds memory.
DEFAULT_MAX_MESSAGE_SIZE: Final = 1 << 30
#: Requests of one connection in progress at once. Upstream's is 1 (a ``process/read``
#: long poll holds every later request); ours lets long polls wait side by side while
#: bounding the work one connection can start.
DEFAULT_CONCURRENT_REQUESTS: Final = 64
#: Seconds a sandboxed filesystem helper may run before it is killed.
DEFAULT_FS_HELPER_TIMEOUT: Final = 30.0

SandboxBackendName = Literal["auto", "bwrap", "landlock"]
WsAuthMode = Literal["capability-token", "signed-bearer-token"]


@dataclass(frozen=True, slots=True, kw_only=True)
class WsAuthSettings:
    """The ``--ws-*`` flags as given, validated by ``transport.ws_auth.load_authenticator``."""

    mode: WsAuthMode | None = None
    token_file: str | None = None
    token_sha256: str | None = None
    shared_secret_file: str | None = None
    issuer: str | None = None
    audience: str | None = None
    max_clock_skew: int | None = None

    @property
    def any_flag(self) -> bool:
        """Whether any flag besides ``--ws-auth`` itself was given."""
        return any(getattr(self, f.name) is not None for f in fields(self) if f.name != "mode")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    """Everything the server needs to know, fixed at start-up (most are ``serve`` flags:
    their help says what each means)."""

    listen: str = DEFAULT_LISTEN
    detach_ttl: float = DEFAULT_DETACH_TTL
    closed_retention: float = DEFAULT_CLOSED_RETENTION
    output_cap: int = DEFAULT_OUTPUT_CAP
    lossless_output: bool = False
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    allow_unsandboxed: bool = False
    sandbox_backend: SandboxBackendName = "auto"
    fs_helper_timeout: float = DEFAULT_FS_HELPER_TIMEOUT
    launch_zygote: bool = True
    ws_auth: WsAuthSettings = field(default_factory=WsAuthSettings)
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    allow_unauthenticated_network: bool = False
    concurrent_requests: int = DEFAULT_CONCURRENT_REQUESTS

    def __post_init__(self) -> None:
        for name, valid, rule in (
            ("detach_ttl", self.detach_ttl >= 0, ">= 0"),
            ("closed_retention", self.closed_retention >= 0, ">= 0"),
            ("output_cap", self.output_cap > 0, "> 0"),
            ("max_message_size", self.max_message_size > 0, "> 0"),
            ("fs_helper_timeout", self.fs_helper_timeout > 0, "> 0"),
            ("concurrent_requests", self.concurrent_requests >= 1, ">= 1"),
        ):
            if not valid:
                raise ValueError(f"{name} must be {rule}")
        if self.sandbox_backend not in ("auto", "bwrap", "landlock"):
            raise ValueError(f"unknown sandbox backend {self.sandbox_backend!r}")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("`--tls-cert-file` and `--tls-key-file` must be given together")
