"""The client-side filesystem interface: one protocol, a local and a remote implementation.

:class:`ExecutorFileSystem` is what tools (apply_patch, view_image) program
against; :class:`LocalFileSystem` runs the operations in this process with the
server's exact semantics (same :mod:`exec_server.fs.ops`, same routing of
sandbox contexts), :class:`RemoteFileSystem` sends ``fs/*`` requests over an
``ExecServerClient``. Both raise the same typed errors
(:mod:`exec_server.exceptions`): ``NotFoundError`` (-32004),
``InvalidRequestError`` (-32600), ``InvalidParamsError`` (-32602),
``InternalError`` (-32603).

Both follow the current generation's rules: the remote one sends ``file://``
URIs (so it works against upstream 0.163 servers too and gets ``isSymlink``/
``size``), and reading a directory is ``-32600 path `/x` is not a file``.

Every method takes an optional ``sandbox`` context: a legacy
``FileSystemSandboxContext`` or a current permission context, as a
``msgspec.Struct``, a mapping, or pre-encoded ``msgspec.Raw`` JSON. Contexts
that need confinement are never run unconfined: locally they go to the
sandboxed-filesystem service passed in, or fail closed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Protocol, TypeVar

import msgspec

from exec_server.config import ServerConfig
from exec_server.exceptions import ExecServerError, InvalidParamsError
from exec_server.fs.context import route_for
from exec_server.fs.ops import DirEntry, Metadata
from exec_server.fs.service import ConfinedFileSystem, FileSystemService, Route
from exec_server.protocol import fs_types as t
from exec_server.protocol.paths import PathForm, WirePath, parse_wire_path, render_path
from exec_server.protocol.sandbox_types import encode_client_context

__all__ = [
    "DirEntry",
    "ExecutorFileSystem",
    "FsSandbox",
    "LocalFileSystem",
    "Metadata",
    "RemoteFileSystem",
    "RpcCaller",
    "read_text",
]

#: A sandbox context as callers may hand it over; ``None`` means none.
FsSandbox = msgspec.Raw | msgspec.Struct | Mapping[str, object] | None
#: A path: text, or bytes for a name that is not UTF-8 (``os.fsdecode`` rules).
PathArg = str | bytes | os.PathLike[str] | os.PathLike[bytes]

T = TypeVar("T")


@contextlib.contextmanager
def _naming(path: PathArg) -> Iterator[None]:
    """Errors about ``path`` name it (``NotFoundError``'s wire text does not)."""
    try:
        yield
    except ExecServerError as exc:
        if exc.path is None:
            exc.path = os.fsdecode(path)
        raise


class ExecutorFileSystem(Protocol):
    """Async filesystem of an execution environment (paths must be absolute)."""

    async def read_file(self, path: PathArg, sandbox: FsSandbox = None) -> bytes: ...

    async def write_file(self, path: PathArg, data: bytes, sandbox: FsSandbox = None) -> None: ...

    async def create_directory(
        self, path: PathArg, *, recursive: bool = True, sandbox: FsSandbox = None
    ) -> None: ...

    async def get_metadata(self, path: PathArg, sandbox: FsSandbox = None) -> Metadata: ...

    async def read_directory(self, path: PathArg, sandbox: FsSandbox = None) -> list[DirEntry]: ...

    async def remove(
        self,
        path: PathArg,
        *,
        recursive: bool = True,
        force: bool = True,
        sandbox: FsSandbox = None,
    ) -> None: ...

    async def copy(
        self,
        source: PathArg,
        destination: PathArg,
        *,
        recursive: bool,
        sandbox: FsSandbox = None,
    ) -> None: ...

    async def canonicalize(self, path: PathArg, sandbox: FsSandbox = None) -> str: ...


async def read_text(
    fs: ExecutorFileSystem,
    path: PathArg,
    sandbox: FsSandbox = None,
    *,
    encoding: str = "utf-8",
    errors: str = "strict",
) -> str:
    """Read a file and decode it (``UnicodeDecodeError`` if it is not ``encoding``)."""
    return (await fs.read_file(path, sandbox)).decode(encoding, errors)


def _sandbox_json(sandbox: FsSandbox) -> bytes | None:
    """The context as JSON text, None when absent (``None``, or empty or ``null`` text).

    Raises:
        InvalidParamsError: ``Raw`` text that is not JSON (-32602, as the server says);
            sent as it was, it made the whole request unreadable and the call
            waited for an answer that never came.
    """
    if sandbox is None:
        return None
    if isinstance(sandbox, msgspec.Raw):
        raw = bytes(sandbox)
        if raw.strip() in (b"", b"null"):
            return None
        try:
            msgspec.json.decode(raw)
        except msgspec.DecodeError as exc:
            raise InvalidParamsError(f"sandbox: {exc}") from None
        return raw
    if isinstance(sandbox, msgspec.Struct):
        return encode_client_context(sandbox)
    return msgspec.json.encode(sandbox)


def _wire_path(path: PathArg) -> WirePath:
    """Validate like the server does (-32602 for relative paths), normalise lexically.

    Bytes are decoded as ``os`` decodes names (surrogate escapes), which the
    remote side sends as ``%XX`` in its URI: a name that is not UTF-8 reaches
    the same file on both backends. (Bytes used to fail deep inside with a
    ``TypeError`` that did not say why.)
    """
    return parse_wire_path(os.fsdecode(path))


class LocalFileSystem:
    """In-process filesystem with the server's semantics.

    Args:
        confined: the sandboxed-filesystem service for contexts that need
            confinement; without one such calls fail closed (-32600). Use
            :meth:`with_sandbox` to get one this object owns.
    """

    def __init__(self, *, confined: ConfinedFileSystem | None = None) -> None:
        self._service = FileSystemService(confined)
        self._owned: _Closable | None = None

    @classmethod
    def with_sandbox(cls, config: ServerConfig | None = None) -> LocalFileSystem:
        """A filesystem that confines sandboxed contexts like the server does.

        It owns a ``SandboxedFileSystem`` (helper zygote, one-shot helpers):
        close it with :meth:`aclose` or ``async with``.
        """
        from exec_server.fs.sandboxed import SandboxedFileSystem
        from exec_server.sandbox.manager import SandboxManager

        cfg = config or ServerConfig()
        confined = SandboxedFileSystem(cfg, SandboxManager(cfg))
        fs = cls(confined=confined)
        fs._owned = confined
        return fs

    async def aclose(self) -> None:
        """Release the sandboxed-filesystem service if this object created it."""
        owned, self._owned = self._owned, None
        if owned is not None:
            await owned.aclose()

    async def __aenter__(self) -> LocalFileSystem:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _route(self, sandbox: FsSandbox) -> Route:
        return await route_for(_sandbox_json(sandbox), self._service.pool)

    async def read_file(self, path: PathArg, sandbox: FsSandbox = None) -> bytes:
        with _naming(path):
            route = await self._route(sandbox)
            return await self._service.read_file(
                _wire_path(path).path, route, regular_only=True
            )

    async def write_file(self, path: PathArg, data: bytes, sandbox: FsSandbox = None) -> None:
        with _naming(path):
            route = await self._route(sandbox)
            await self._service.write_file(_wire_path(path).path, data, route)

    async def create_directory(
        self, path: PathArg, *, recursive: bool = True, sandbox: FsSandbox = None
    ) -> None:
        with _naming(path):
            route = await self._route(sandbox)
            await self._service.create_directory(_wire_path(path).path, route, recursive=recursive)

    async def get_metadata(self, path: PathArg, sandbox: FsSandbox = None) -> Metadata:
        with _naming(path):
            route = await self._route(sandbox)
            return await self._service.get_metadata(_wire_path(path).path, route)

    async def read_directory(self, path: PathArg, sandbox: FsSandbox = None) -> list[DirEntry]:
        with _naming(path):
            route = await self._route(sandbox)
            return await self._service.read_directory(_wire_path(path).path, route)

    async def remove(
        self,
        path: PathArg,
        *,
        recursive: bool = True,
        force: bool = True,
        sandbox: FsSandbox = None,
    ) -> None:
        with _naming(path):
            route = await self._route(sandbox)
            await self._service.remove(
                _wire_path(path).path, route, recursive=recursive, force=force
            )

    async def copy(
        self,
        source: PathArg,
        destination: PathArg,
        *,
        recursive: bool,
        sandbox: FsSandbox = None,
    ) -> None:
        with _naming(source):
            route = await self._route(sandbox)
            await self._service.copy(
                _wire_path(source).path, _wire_path(destination).path, route, recursive=recursive
            )

    async def canonicalize(self, path: PathArg, sandbox: FsSandbox = None) -> str:
        with _naming(path):
            route = await self._route(sandbox)
            return await self._service.canonicalize(_wire_path(path).path, route)


class _Closable(Protocol):
    async def aclose(self) -> None: ...


class RpcCaller(Protocol):
    """The one method of ``ExecServerClient`` this module needs."""

    async def call(self, method: str, params: msgspec.Struct | None, result_type: type[T]) -> T: ...


class RemoteFileSystem:
    """``fs/*`` requests over an ``ExecServerClient`` (paths sent as ``file://`` URIs)."""

    def __init__(self, client: RpcCaller) -> None:
        self._client = client

    @staticmethod
    def _uri(path: PathArg) -> str:
        return render_path(_wire_path(path).path, PathForm.URI)

    @staticmethod
    def _sandbox(sandbox: FsSandbox) -> t.SandboxField:
        raw = _sandbox_json(sandbox)
        return msgspec.UNSET if raw is None else msgspec.Raw(raw)

    async def read_file(self, path: PathArg, sandbox: FsSandbox = None) -> bytes:
        with _naming(path):
            params = t.ReadFileParams(path=self._uri(path), sandbox=self._sandbox(sandbox))
            result = await self._client.call(t.METHOD_READ_FILE, params, t.ReadFileResult)
            return result.data_base64

    async def write_file(self, path: PathArg, data: bytes, sandbox: FsSandbox = None) -> None:
        with _naming(path):
            params = t.WriteFileRequest(
                path=self._uri(path), data_base64=data, sandbox=self._sandbox(sandbox)
            )
            await self._client.call(t.METHOD_WRITE_FILE, params, t.EmptyResult)

    async def create_directory(
        self, path: PathArg, *, recursive: bool = True, sandbox: FsSandbox = None
    ) -> None:
        with _naming(path):
            params = t.CreateDirectoryParams(
                path=self._uri(path), recursive=recursive, sandbox=self._sandbox(sandbox)
            )
            await self._client.call(t.METHOD_CREATE_DIRECTORY, params, t.EmptyResult)

    async def get_metadata(self, path: PathArg, sandbox: FsSandbox = None) -> Metadata:
        with _naming(path):
            params = t.GetMetadataParams(path=self._uri(path), sandbox=self._sandbox(sandbox))
            r = await self._client.call(t.METHOD_GET_METADATA, params, t.GetMetadataResult)
            return Metadata(
                is_directory=r.is_directory,
                is_file=r.is_file,
                created_at_ms=r.created_at_ms,
                modified_at_ms=r.modified_at_ms,
                is_symlink=None if r.is_symlink is msgspec.UNSET else r.is_symlink,
                size=None if r.size is msgspec.UNSET else r.size,
            )

    async def read_directory(self, path: PathArg, sandbox: FsSandbox = None) -> list[DirEntry]:
        with _naming(path):
            params = t.ReadDirectoryParams(path=self._uri(path), sandbox=self._sandbox(sandbox))
            r = await self._client.call(t.METHOD_READ_DIRECTORY, params, t.ReadDirectoryResult)
            return [DirEntry(e.file_name, e.is_directory, e.is_file) for e in r.entries]

    async def remove(
        self,
        path: PathArg,
        *,
        recursive: bool = True,
        force: bool = True,
        sandbox: FsSandbox = None,
    ) -> None:
        with _naming(path):
            params = t.RemoveParams(
                path=self._uri(path),
                recursive=recursive,
                force=force,
                sandbox=self._sandbox(sandbox),
            )
            await self._client.call(t.METHOD_REMOVE, params, t.EmptyResult)

    async def copy(
        self,
        source: PathArg,
        destination: PathArg,
        *,
        recursive: bool,
        sandbox: FsSandbox = None,
    ) -> None:
        with _naming(source):
            params = t.CopyParams(
                source_path=self._uri(source),
                destination_path=self._uri(destination),
                recursive=recursive,
                sandbox=self._sandbox(sandbox),
            )
            await self._client.call(t.METHOD_COPY, params, t.EmptyResult)

    async def canonicalize(self, path: PathArg, sandbox: FsSandbox = None) -> str:
        with _naming(path):
            params = t.CanonicalizeParams(path=self._uri(path), sandbox=self._sandbox(sandbox))
            r = await self._client.call(t.METHOD_CANONICALIZE, params, t.CanonicalizeResult)
            return parse_wire_path(r.path).path
