"""Wire structs of the ``fs/*`` methods, both generations (PROTOCOL.md §9.2, CLIENT_COMPAT.md §6).

Every params struct carries ``sandbox`` as raw JSON: the sandbox-policy layer
decodes it (legacy ``FileSystemSandboxContext`` or the current permission
context); absent and ``null`` both mean "no sandbox" (use :func:`sandbox_raw`).
``msgspec.Raw | None`` cannot be used for that member: msgspec then accepts
only ``null``, so the member is ``Raw | UNSET`` like ``process/start``'s.

Path members are plain ``str``: the handler parses them with
:func:`exec_server.protocol.paths.parse_wire_path`, which accepts a plain
absolute path (legacy) or a ``file://`` URI (current) and remembers the form so
answers use the request's form.

``fs/writeFile``'s ``dataBase64`` is decoded from a ``msgspec.Raw`` slice of the
inbound message (no intermediate ``str``) so that invalid base64 can be
reported with upstream's ``-32600`` text instead of a generic decode error;
a big request's ``dataBase64`` is not decoded at all by the codec (see
``codec.decode_message``). The client side encodes from ``bytes``
(:class:`WriteFileRequest`); ``fs/readFile`` results are ``bytes`` fields that
msgspec turns into base64 in C, or for big files :class:`ReadFileText`.

``fs/getMetadata``'s ``isSymlink``/``size`` exist only in the current
generation; they are ``UNSET`` (omitted) for legacy requests (CLIENT_COMPAT
§1.2 rule 6 and §6.1): the server fills them when the request path was a URI.
"""

from __future__ import annotations

from typing import Annotated, Literal

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


class EmptyResult(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """``{}``: the result of writeFile, createDirectory, remove and copy."""


class ReadFileParams(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    path: str
    sandbox: SandboxField = UNSET
    follow_symlinks: bool | None = None


class ReadFileResult(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    data_base64: bytes


class ReadFileText(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Server-side encode shape of a big ``fs/readFile`` result: ``data_base64`` is
    the JSON string (quotes included), made in a worker a slice at a time and
    copied into the reply as it is (msgspec would encode the bytes in one
    GIL-holding call)."""

    data_base64: msgspec.Raw


class WriteFileParams(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True
):
    """Server-side decode shape; ``data_base64`` is the raw JSON token (see module doc)."""

    path: str
    data_base64: msgspec.Raw
    sandbox: SandboxField = UNSET
    follow_symlinks: bool | None = None


class WriteFileRequest(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True
):
    """Client-side encode shape of ``fs/writeFile``: bytes become base64 in C."""

    path: str
    data_base64: bytes
    sandbox: SandboxField = UNSET
    follow_symlinks: bool | None = None


class CreateDirectoryParams(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True
):
    path: str
    recursive: bool | None = None
    sandbox: SandboxField = UNSET
    follow_symlinks: bool | None = None


class GetMetadataParams(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True
):
    path: str
    sandbox: SandboxField = UNSET
    follow_symlinks: bool | None = None


class GetMetadataResult(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Field order as upstream sends it; the two current-only members omitted when unset."""

    is_directory: bool
    is_file: bool
    is_symlink: bool | UnsetType = UNSET
    size: int | UnsetType = UNSET
    created_at_ms: int
    modified_at_ms: int


class ReadDirectoryParams(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True
):
    path: str
    sandbox: SandboxField = UNSET


class DirectoryEntry(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    file_name: str
    is_directory: bool
    is_file: bool


class ReadDirectoryResult(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    entries: list[DirectoryEntry]


class RemoveParams(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    path: str
    recursive: bool | None = None
    force: bool | None = None
    sandbox: SandboxField = UNSET
    follow_symlinks: bool | None = None


class CopyParams(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    source_path: str
    destination_path: str
    recursive: bool
    sandbox: SandboxField = UNSET


class CanonicalizeParams(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True
):
    path: str
    sandbox: SandboxField = UNSET


class CanonicalizeResult(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    path: str


# -- fs/walk (PROTOCOL_CURRENT §6)

#: A non-negative count (upstream: ``usize``).
Count = Annotated[int, msgspec.Meta(ge=0)]
#: A file offset (upstream: ``u64``).
U64 = Annotated[int, msgspec.Meta(ge=0)]


class WalkOptionsParams(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """All five members are required, as upstream's deserializer wants them."""

    max_depth: Count
    max_directories: Count
    max_entries: Count
    follow_directory_symlinks: bool
    prune_hidden_directories: bool


class WalkParams(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    path: str
    options: WalkOptionsParams
    sandbox: SandboxField = UNSET


class WalkEntry(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    path: str
    kind: Literal["file", "directory"]


class WalkError(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    path: str
    message: str


class WalkResult(msgspec.Struct, frozen=True, kw_only=True):
    entries: list[WalkEntry]
    errors: list[WalkError]
    truncated: bool


# -- file handles (PROTOCOL_CURRENT §4, §5)


class OpenParams(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """``mode`` may be omitted (``read``), not ``null`` (upstream refuses that too)."""

    handle_id: str
    path: str
    mode: Literal["read", "replace"] = "read"
    sandbox: SandboxField = UNSET


class OpenResult(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    handle_id: str


class ReadBlockParams(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    handle_id: str
    offset: U64
    length: Count = msgspec.field(name="len")


class ReadBlockResult(msgspec.Struct, frozen=True, kw_only=True):
    chunk: bytes
    eof: bool


class WriteBlockParams(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    handle_id: str
    offset: U64
    chunk: bytes


class CloseParams(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    handle_id: str
