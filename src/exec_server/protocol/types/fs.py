"""Wire structs of the ``fs/*`` methods, both generations (PROTOCOL.md §9.2, CLIENT_COMPAT.md §6).

Paths are plain ``str`` for :func:`~exec_server.protocol.paths.parse_wire_path`;
``sandbox`` stays raw JSON (:func:`sandbox_raw`)."""

from __future__ import annotations

from typing import Annotated, Literal, TypeAlias

import msgspec
from msgspec import UNSET, UnsetType

from exec_server.protocol.types.sandbox import SandboxField, sandbox_raw

__all__ = [
    "METHOD_CANONICALIZE",
    "METHOD_CLOSE",
    "METHOD_COPY",
    "METHOD_CREATE_DIRECTORY",
    "METHOD_GET_METADATA",
    "METHOD_OPEN",
    "METHOD_READ_BLOCK",
    "METHOD_READ_DIRECTORY",
    "METHOD_READ_FILE",
    "METHOD_REMOVE",
    "METHOD_WALK",
    "METHOD_WRITE_BLOCK",
    "METHOD_WRITE_FILE",
    "CanonicalizeParams",
    "CanonicalizeResult",
    "CloseParams",
    "CopyParams",
    "CreateDirectoryParams",
    "DirectoryEntry",
    "EmptyResult",
    "GetMetadataParams",
    "GetMetadataResult",
    "OpenParams",
    "OpenResult",
    "ReadBlockParams",
    "ReadBlockResult",
    "ReadDirectoryParams",
    "ReadDirectoryResult",
    "ReadFileParams",
    "ReadFileResult",
    "ReadFileText",
    "RemoveParams",
    "SandboxField",
    "WalkEntry",
    "WalkError",
    "WalkOptionsParams",
    "WalkParams",
    "WalkResult",
    "WriteBlockParams",
    "WriteFileParams",
    "WriteFileRequest",
    "sandbox_raw",
]

METHOD_READ_FILE = "fs/readFile"
METHOD_WRITE_FILE = "fs/writeFile"
METHOD_CREATE_DIRECTORY = "fs/createDirectory"
METHOD_GET_METADATA = "fs/getMetadata"
METHOD_READ_DIRECTORY = "fs/readDirectory"
METHOD_REMOVE = "fs/remove"
METHOD_COPY = "fs/copy"
METHOD_CANONICALIZE = "fs/canonicalize"
METHOD_WALK = "fs/walk"
METHOD_OPEN = "fs/open"
METHOD_READ_BLOCK = "fs/readBlock"
METHOD_WRITE_BLOCK = "fs/writeBlock"
METHOD_CLOSE = "fs/close"


#: The config every fs struct shares (camelCase leaves one-word names as they are).
_FS = {"frozen": True, "kw_only": True, "rename": "camel", "omit_defaults": True}


class EmptyResult(msgspec.Struct, **_FS):
    """``{}``: the result of writeFile, createDirectory, remove and copy."""


class ReadFileParams(msgspec.Struct, **_FS):
    path: str
    sandbox: SandboxField = UNSET
    follow_symlinks: bool | None = None


class ReadFileResult(msgspec.Struct, **_FS):
    data_base64: bytes


class ReadFileText(msgspec.Struct, **_FS):
    """A big ``fs/readFile`` result: ``data_base64`` is the JSON string (quotes
    included), encoded in a worker a slice at a time, not in one GIL-holding call."""

    data_base64: msgspec.Raw


class WriteFileParams(msgspec.Struct, **_FS):
    """Server-side decode shape: ``data_base64`` is the raw JSON token, so bad base64 gets
    upstream's -32600 text (a big one is not decoded here: ``codec.decode_message``)."""

    path: str
    data_base64: msgspec.Raw
    sandbox: SandboxField = UNSET
    follow_symlinks: bool | None = None


class WriteFileRequest(msgspec.Struct, **_FS):
    """Client-side encode shape of ``fs/writeFile``: bytes become base64 in C."""

    path: str
    data_base64: bytes
    sandbox: SandboxField = UNSET
    follow_symlinks: bool | None = None


class CreateDirectoryParams(msgspec.Struct, **_FS):
    path: str
    recursive: bool | None = None
    sandbox: SandboxField = UNSET
    follow_symlinks: bool | None = None


GetMetadataParams: TypeAlias = ReadFileParams


class GetMetadataResult(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Members in upstream's order; ``isSymlink`` and ``size`` are current-only."""

    is_directory: bool
    is_file: bool
    is_symlink: bool | UnsetType = UNSET
    size: int | UnsetType = UNSET
    created_at_ms: int
    modified_at_ms: int


class ReadDirectoryParams(msgspec.Struct, **_FS):
    path: str
    sandbox: SandboxField = UNSET


class DirectoryEntry(msgspec.Struct, **_FS):
    file_name: str
    is_directory: bool
    is_file: bool


class ReadDirectoryResult(msgspec.Struct, **_FS):
    entries: list[DirectoryEntry]


class RemoveParams(msgspec.Struct, **_FS):
    path: str
    recursive: bool | None = None
    force: bool | None = None
    sandbox: SandboxField = UNSET
    follow_symlinks: bool | None = None


class CopyParams(msgspec.Struct, **_FS):
    source_path: str
    destination_path: str
    recursive: bool
    sandbox: SandboxField = UNSET


CanonicalizeParams: TypeAlias = ReadDirectoryParams


class CanonicalizeResult(msgspec.Struct, **_FS):
    path: str


# -- fs/walk (PROTOCOL_CURRENT §6)

#: A count or a file offset (upstream: ``usize``, ``u64``).
NonNegative = Annotated[int, msgspec.Meta(ge=0)]


class WalkOptionsParams(msgspec.Struct, **_FS):
    """All five members are required, as upstream's deserializer wants them."""

    max_depth: NonNegative
    max_directories: NonNegative
    max_entries: NonNegative
    follow_directory_symlinks: bool
    prune_hidden_directories: bool


class WalkParams(msgspec.Struct, **_FS):
    path: str
    options: WalkOptionsParams
    sandbox: SandboxField = UNSET


class WalkEntry(msgspec.Struct, gc=False, **_FS):
    path: str
    kind: Literal["file", "directory"]


class WalkError(msgspec.Struct, gc=False, **_FS):
    path: str
    message: str


class WalkResult(msgspec.Struct, **_FS):
    entries: list[WalkEntry]
    errors: list[WalkError]
    truncated: bool


# -- file handles (PROTOCOL_CURRENT §4, §5)


class OpenParams(msgspec.Struct, **_FS):
    """``mode`` may be omitted (``read``), not ``null`` (upstream refuses that too)."""

    handle_id: str
    path: str
    mode: Literal["read", "replace"] = "read"
    sandbox: SandboxField = UNSET


class OpenResult(msgspec.Struct, **_FS):
    handle_id: str


class ReadBlockParams(msgspec.Struct, **_FS):
    handle_id: str
    offset: NonNegative
    length: NonNegative = msgspec.field(name="len")


class ReadBlockResult(msgspec.Struct, **_FS):
    chunk: bytes
    eof: bool


class WriteBlockParams(msgspec.Struct, **_FS):
    handle_id: str
    offset: NonNegative
    chunk: bytes


class CloseParams(msgspec.Struct, **_FS):
    handle_id: str
