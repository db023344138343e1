"""The client-side filesystem: one protocol (:class:`ExecutorFileSystem`), implemented
locally with the server's exact semantics and remotely over ``fs/*``: the same wire
errors, and sandboxed contexts are never run unconfined (locally they fail closed)."""

from __future__ import annotations

import contextlib
import functools
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar

import msgspec

from exec_server.client._opening import AsyncClosing, Opening
from exec_server.config import ServerConfig
from exec_server.exceptions import InternalError, InvalidParamsError, wire_error
from exec_server.fs.context import route_for
from exec_server.fs.direct import DirEntry, Metadata
from exec_server.fs.handles import MAX_BLOCK, FileHandles
from exec_server.fs.service import FileSystemService, NoFollowCall, Route
from exec_server.fs.walk import MAX_DEPTH, MAX_DIRECTORIES, MAX_ENTRIES, WalkOptions
from exec_server.protocol.paths import PathForm, WirePath, parse_wire_path, render_path
from exec_server.protocol.types import fs as t
from exec_server.protocol.types.sandbox import decode_fs_sandbox, encode_client_context

if TYPE_CHECKING:
    from exec_server.fs.confined import SandboxedFileSystem

__all__ = [
    "DirEntry",
    "ExecutorFileSystem",
    "FileStream",
    "FsSandbox",
    "LocalFileSystem",
    "Metadata",
    "OpenMode",
    "RemoteFileSystem",
    "RpcCaller",
    "WalkEntry",
    "WalkError",
    "WalkResult",
    "read_text",
]

#: A sandbox context as callers may hand it over; ``None`` means none.
FsSandbox = msgspec.Raw | msgspec.Struct | Mapping[str, object] | None
#: A path: text, or bytes for a name that is not UTF-8 (``os.fsdecode`` rules).
PathArg = str | bytes | os.PathLike[str] | os.PathLike[bytes]

T = TypeVar("T")

OpenMode = Literal["read", "replace"]


class WalkEntry(msgspec.Struct, frozen=True, gc=False):
    """One ``fs/walk`` entry: its path (under the walked root as spelled) and kind."""

    path: str
    is_directory: bool


class WalkError(msgspec.Struct, frozen=True, gc=False):
    path: str
    message: str


class WalkResult(msgspec.Struct, frozen=True):
    entries: list[WalkEntry]
    errors: list[WalkError]
    truncated: bool


class FileStream(AsyncClosing):
    """An open file (``fs/open``): ``async with fs.open(path) as f``, or await and
    :meth:`aclose`. Reads return at most ``length`` bytes (1 B to 1 MiB) and ``eof``."""

    def __init__(self, mode: OpenMode) -> None:
        self.mode: OpenMode = mode
        self._closed = False

    async def read_block(self, offset: int, length: int = MAX_BLOCK) -> tuple[bytes, bool]:
        raise NotImplementedError

    async def write_block(self, offset: int, data: bytes) -> None:
        raise NotImplementedError

    async def _close(self) -> None:
        raise NotImplementedError

    async def chunks(self, block: int = MAX_BLOCK) -> AsyncIterator[bytes]:
        offset = 0
        while True:
            chunk, eof = await self.read_block(offset, block)
            if chunk:
                yield chunk
            offset += len(chunk)
            if eof:
                return

    async def read_all(self, block: int = MAX_BLOCK) -> bytes:
        return b"".join([chunk async for chunk in self.chunks(block)])

    async def write_all(self, data: bytes, block: int = MAX_BLOCK) -> None:
        view = memoryview(data)
        for offset in range(0, len(view), block):
            await self.write_block(offset, bytes(view[offset : offset + block]))

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self._close()


@contextlib.contextmanager
def _naming(path: PathArg | None) -> Iterator[None]:
    """Errors name ``path`` (the wire texts do not); fs errors become the server's."""
    try:
        yield
    except Exception as exc:
        err = wire_error(exc)
        if err is None:
            raise
        if err.path is None and path is not None:
            err.path = os.fsdecode(path)
        if err is exc:
            raise
        raise err from exc


class ExecutorFileSystem(Protocol):
    """Async filesystem of an execution environment (paths must be absolute);
    ``follow_symlinks=False`` refuses a symlink anywhere in the path."""

    async def read_file(
        self, path: PathArg, sandbox: FsSandbox = None, *, follow_symlinks: bool = True
    ) -> bytes: ...

    async def write_file(
        self, path: PathArg, data: bytes, sandbox: FsSandbox = None, *, follow_symlinks: bool = True
    ) -> None: ...

    async def create_directory(
        self,
        path: PathArg,
        *,
        recursive: bool = True,
        sandbox: FsSandbox = None,
        follow_symlinks: bool = True,
    ) -> None: ...

    async def get_metadata(
        self, path: PathArg, sandbox: FsSandbox = None, *, follow_symlinks: bool = True
    ) -> Metadata: ...

    async def read_directory(self, path: PathArg, sandbox: FsSandbox = None) -> list[DirEntry]: ...

    async def remove(
        self,
        path: PathArg,
        *,
        recursive: bool = True,
        force: bool = True,
        sandbox: FsSandbox = None,
        follow_symlinks: bool = True,
    ) -> None: ...

    async def copy(
        self, source: PathArg, destination: PathArg, *, recursive: bool, sandbox: FsSandbox = None
    ) -> None: ...

    async def canonicalize(self, path: PathArg, sandbox: FsSandbox = None) -> str: ...

    async def walk(
        self,
        path: PathArg,
        *,
        max_depth: int = MAX_DEPTH,
        max_directories: int = MAX_DIRECTORIES,
        max_entries: int = MAX_ENTRIES,
        follow_directory_symlinks: bool = False,
        prune_hidden_directories: bool = False,
        sandbox: FsSandbox = None,
    ) -> WalkResult: ...

    def open(
        self, path: PathArg, mode: OpenMode = "read", *, sandbox: FsSandbox = None
    ) -> Opening[FileStream]: ...


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
    """The context as JSON text, None when absent. ``Raw`` text that is not JSON is refused
    (-32602): sent, it would make the request unreadable and the call wait forever."""
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
    """Validated like the server does; bytes decode with surrogate escapes (sent as
    ``%XX``), so a name that is not UTF-8 reaches the same file on both backends."""
    return parse_wire_path(os.fsdecode(path))


class LocalFileSystem(AsyncClosing):
    """In-process filesystem with the server's semantics; contexts that need confinement
    fail closed (-32600) without ``confined`` (:meth:`with_sandbox` makes one it owns)."""

    def __init__(self, *, confined: SandboxedFileSystem | None = None) -> None:
        self._service = FileSystemService(confined)
        self._handles = FileHandles()
        self._close_owned: Callable[[], Awaitable[None]] | None = None

    @classmethod
    def with_sandbox(cls, config: ServerConfig | None = None) -> LocalFileSystem:
        """A filesystem that confines sandboxed contexts like the server (close it)."""
        from exec_server.fs.confined import SandboxedFileSystem
        from exec_server.sandbox.manager import SandboxManager

        cfg = config or ServerConfig()
        confined = SandboxedFileSystem(cfg, SandboxManager(cfg))
        fs = cls(confined=confined)
        fs._close_owned = confined.aclose
        return fs

    async def aclose(self) -> None:
        """Close open files, and the sandboxed-filesystem service if this object made it."""
        await self._service.pool.run(self._handles.close_all)
        self._handles = FileHandles()
        close_owned, self._close_owned = self._close_owned, None
        if close_owned is not None:
            await close_owned()

    async def _prepare(self, path: PathArg, sandbox: FsSandbox) -> tuple[str, Route]:
        """The native path and the sandbox context's route, checked as the server checks."""
        route = await route_for(decode_fs_sandbox(_sandbox_json(sandbox)), self._service.pool)
        return _wire_path(path).path, route

    async def read_file(
        self, path: PathArg, sandbox: FsSandbox = None, *, follow_symlinks: bool = True
    ) -> bytes:
        with _naming(path):
            native, route = await self._prepare(path, sandbox)
            if not follow_symlinks:
                return await self._service.read_file_no_follow(native, route)
            return await self._service.read_file(native, route, regular_only=True)

    async def write_file(
        self, path: PathArg, data: bytes, sandbox: FsSandbox = None, *, follow_symlinks: bool = True
    ) -> None:
        with _naming(path):
            native, route = await self._prepare(path, sandbox)
            if follow_symlinks:
                await self._service.write_file(native, data, route)
            else:
                call = NoFollowCall("fs/writeFile", native, produce=lambda: data)
                await self._service.no_follow(call, route)

    async def create_directory(
        self,
        path: PathArg,
        *,
        recursive: bool = True,
        sandbox: FsSandbox = None,
        follow_symlinks: bool = True,
    ) -> None:
        with _naming(path):
            native, route = await self._prepare(path, sandbox)
            if follow_symlinks:
                await self._service.create_directory(native, route, recursive=recursive)
            else:
                call = NoFollowCall("fs/createDirectory", native, recursive=recursive)
                await self._service.no_follow(call, route)

    async def get_metadata(
        self, path: PathArg, sandbox: FsSandbox = None, *, follow_symlinks: bool = True
    ) -> Metadata:
        with _naming(path):
            native, route = await self._prepare(path, sandbox)
            if not follow_symlinks:
                return await self._service.get_metadata_no_follow(native, route)
            return await self._service.get_metadata(native, route)

    async def read_directory(self, path: PathArg, sandbox: FsSandbox = None) -> list[DirEntry]:
        with _naming(path):
            return await self._service.read_directory(*await self._prepare(path, sandbox))

    async def remove(
        self,
        path: PathArg,
        *,
        recursive: bool = True,
        force: bool = True,
        sandbox: FsSandbox = None,
        follow_symlinks: bool = True,
    ) -> None:
        with _naming(path):
            native, route = await self._prepare(path, sandbox)
            if follow_symlinks:
                await self._service.remove(native, route, recursive=recursive, force=force)
            else:
                call = NoFollowCall("fs/remove", native, recursive=recursive, force=force)
                await self._service.no_follow(call, route)

    async def copy(
        self, source: PathArg, destination: PathArg, *, recursive: bool, sandbox: FsSandbox = None
    ) -> None:
        with _naming(source):
            native, route = await self._prepare(source, sandbox)
            target = _wire_path(destination).path
            await self._service.copy(native, target, route, recursive=recursive)

    async def canonicalize(self, path: PathArg, sandbox: FsSandbox = None) -> str:
        with _naming(path):
            return await self._service.canonicalize(*await self._prepare(path, sandbox))

    async def walk(
        self,
        path: PathArg,
        *,
        max_depth: int = MAX_DEPTH,
        max_directories: int = MAX_DIRECTORIES,
        max_entries: int = MAX_ENTRIES,
        follow_directory_symlinks: bool = False,
        prune_hidden_directories: bool = False,
        sandbox: FsSandbox = None,
    ) -> WalkResult:
        options = WalkOptions(max_depth, max_directories, max_entries,
                              follow_directory_symlinks, prune_hidden_directories)
        with _naming(path):
            native, route = await self._prepare(path, sandbox)
            outcome = await self._service.walk(native, options, route)
        return WalkResult(
            entries=[WalkEntry(os.path.join(d, n), is_dir) for d, n, is_dir in outcome.entries],
            errors=[WalkError(os.path.join(d, n) if n else d, m) for d, n, m in outcome.errors],
            truncated=outcome.truncated,
        )

    def open(
        self, path: PathArg, mode: OpenMode = "read", *, sandbox: FsSandbox = None
    ) -> Opening[FileStream]:
        """A file handle on ``path`` (``read``, or ``replace``: created or truncated)."""
        return Opening(lambda: self._open(path, mode, sandbox))

    async def _open(self, path: PathArg, mode: OpenMode, sandbox: FsSandbox) -> FileStream:
        handle_id = uuid.uuid4().hex
        with _naming(None):
            handle = self._handles.reserve(handle_id)
        try:
            with _naming(None):
                native, route = await self._prepare(path, sandbox)
                install = functools.partial(self._handles.install, handle)
                await self._service.open_handle(native, mode, install, route)
        except BaseException:
            self._handles.release(handle_id, handle)
            raise
        return _LocalStream(self._service, self._handles, handle_id, mode)


class _LocalStream(FileStream):
    def __init__(
        self, service: FileSystemService, handles: FileHandles, handle_id: str, mode: OpenMode
    ) -> None:
        super().__init__(mode)
        self._service = service
        self._handles = handles
        self._id = handle_id

    async def read_block(self, offset: int, length: int = MAX_BLOCK) -> tuple[bytes, bool]:
        with _naming(None):
            return await self._service.pool.run(
                self._handles.read_block, self._id, offset, length
            )

    async def write_block(self, offset: int, data: bytes) -> None:
        with _naming(None):
            await self._service.pool.run(self._handles.write_block, self._id, offset, data)

    async def _close(self) -> None:
        with _naming(None):
            await self._service.pool.run(self._handles.close, self._id)


class RpcCaller(Protocol):
    async def call(self, method: str, params: msgspec.Struct | None, result_type: type[T]) -> T: ...


class RemoteFileSystem:
    """``fs/*`` requests over an ``ExecServerClient`` (paths sent as ``file://`` URIs)."""

    def __init__(self, client: RpcCaller) -> None:
        self._client = client

    async def read_file(
        self, path: PathArg, sandbox: FsSandbox = None, *, follow_symlinks: bool = True
    ) -> bytes:
        with _naming(path):
            params = t.ReadFileParams(
                path=_uri(path),
                sandbox=_sandbox_field(sandbox),
                follow_symlinks=_no_follow(follow_symlinks),
            )
            result = await self._client.call(t.METHOD_READ_FILE, params, t.ReadFileResult)
            return result.data_base64

    async def write_file(
        self, path: PathArg, data: bytes, sandbox: FsSandbox = None, *, follow_symlinks: bool = True
    ) -> None:
        with _naming(path):
            params = t.WriteFileRequest(
                path=_uri(path),
                data_base64=data,
                sandbox=_sandbox_field(sandbox),
                follow_symlinks=_no_follow(follow_symlinks),
            )
            await self._client.call(t.METHOD_WRITE_FILE, params, t.EmptyResult)

    async def create_directory(
        self,
        path: PathArg,
        *,
        recursive: bool = True,
        sandbox: FsSandbox = None,
        follow_symlinks: bool = True,
    ) -> None:
        with _naming(path):
            params = t.CreateDirectoryParams(
                path=_uri(path),
                recursive=recursive,
                sandbox=_sandbox_field(sandbox),
                follow_symlinks=_no_follow(follow_symlinks),
            )
            await self._client.call(t.METHOD_CREATE_DIRECTORY, params, t.EmptyResult)

    async def get_metadata(
        self, path: PathArg, sandbox: FsSandbox = None, *, follow_symlinks: bool = True
    ) -> Metadata:
        with _naming(path):
            params = t.GetMetadataParams(
                path=_uri(path),
                sandbox=_sandbox_field(sandbox),
                follow_symlinks=_no_follow(follow_symlinks),
            )
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
            params = t.ReadDirectoryParams(path=_uri(path), sandbox=_sandbox_field(sandbox))
            r = await self._client.call(t.METHOD_READ_DIRECTORY, params, t.ReadDirectoryResult)
        return [DirEntry(e.file_name, e.is_directory, e.is_file) for e in r.entries]

    async def remove(
        self,
        path: PathArg,
        *,
        recursive: bool = True,
        force: bool = True,
        sandbox: FsSandbox = None,
        follow_symlinks: bool = True,
    ) -> None:
        with _naming(path):
            params = t.RemoveParams(
                path=_uri(path),
                recursive=recursive,
                force=force,
                sandbox=_sandbox_field(sandbox),
                follow_symlinks=_no_follow(follow_symlinks),
            )
            await self._client.call(t.METHOD_REMOVE, params, t.EmptyResult)

    async def copy(
        self, source: PathArg, destination: PathArg, *, recursive: bool, sandbox: FsSandbox = None
    ) -> None:
        with _naming(source):
            params = t.CopyParams(
                source_path=_uri(source),
                destination_path=_uri(destination),
                recursive=recursive,
                sandbox=_sandbox_field(sandbox),
            )
            await self._client.call(t.METHOD_COPY, params, t.EmptyResult)

    async def canonicalize(self, path: PathArg, sandbox: FsSandbox = None) -> str:
        with _naming(path):
            params = t.CanonicalizeParams(path=_uri(path), sandbox=_sandbox_field(sandbox))
            r = await self._client.call(t.METHOD_CANONICALIZE, params, t.CanonicalizeResult)
            return parse_wire_path(r.path).path

    async def walk(
        self,
        path: PathArg,
        *,
        max_depth: int = MAX_DEPTH,
        max_directories: int = MAX_DIRECTORIES,
        max_entries: int = MAX_ENTRIES,
        follow_directory_symlinks: bool = False,
        prune_hidden_directories: bool = False,
        sandbox: FsSandbox = None,
    ) -> WalkResult:
        options = t.WalkOptionsParams(
            max_depth=max_depth,
            max_directories=max_directories,
            max_entries=max_entries,
            follow_directory_symlinks=follow_directory_symlinks,
            prune_hidden_directories=prune_hidden_directories,
        )
        with _naming(path):
            params = t.WalkParams(path=_uri(path), options=options, sandbox=_sandbox_field(sandbox))
            r = await self._client.call(t.METHOD_WALK, params, t.WalkResult)
            return WalkResult(
                entries=[
                    WalkEntry(parse_wire_path(e.path).path, e.kind == "directory")
                    for e in r.entries
                ],
                errors=[WalkError(parse_wire_path(e.path).path, e.message) for e in r.errors],
                truncated=r.truncated,
            )

    def open(
        self, path: PathArg, mode: OpenMode = "read", *, sandbox: FsSandbox = None
    ) -> Opening[FileStream]:
        """A file handle on ``path`` (``fs/open``; ``replace``: created or truncated)."""
        return Opening(lambda: self._open(path, mode, sandbox))

    async def _open(self, path: PathArg, mode: OpenMode, sandbox: FsSandbox) -> FileStream:
        handle_id = uuid.uuid4().hex  # as the Codex client: 32 hex digits
        params = t.OpenParams(
            handle_id=handle_id, path=_uri(path), mode=mode, sandbox=_sandbox_field(sandbox)
        )
        await self._client.call(t.METHOD_OPEN, params, t.OpenResult)
        return _RemoteStream(self._client, handle_id, mode)


def _uri(path: PathArg) -> str:
    return render_path(_wire_path(path).path, PathForm.URI)


def _sandbox_field(sandbox: FsSandbox) -> t.SandboxField:
    raw = _sandbox_json(sandbox)
    return msgspec.UNSET if raw is None else msgspec.Raw(raw)


class _RemoteStream(FileStream):
    def __init__(self, client: RpcCaller, handle_id: str, mode: OpenMode) -> None:
        super().__init__(mode)
        self._client = client
        self._id = handle_id

    async def read_block(self, offset: int, length: int = MAX_BLOCK) -> tuple[bytes, bool]:
        params = t.ReadBlockParams(handle_id=self._id, offset=offset, length=length)
        r = await self._client.call(t.METHOD_READ_BLOCK, params, t.ReadBlockResult)
        if len(r.chunk) > length:
            raise InternalError(
                f"fs/readBlock returned {len(r.chunk)} bytes, more than the {length} asked for"
            )
        return r.chunk, r.eof

    async def write_block(self, offset: int, data: bytes) -> None:
        params = t.WriteBlockParams(handle_id=self._id, offset=offset, chunk=data)
        await self._client.call(t.METHOD_WRITE_BLOCK, params, t.EmptyResult)

    async def _close(self) -> None:
        await self._client.call(t.METHOD_CLOSE, t.CloseParams(handle_id=self._id), t.EmptyResult)


def _no_follow(follow_symlinks: bool) -> bool | None:
    """The wire member: sent only as ``false`` (as the Codex client sends it)."""
    return None if follow_symlinks else False
