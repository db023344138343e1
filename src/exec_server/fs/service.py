"""Route one filesystem call (PROTOCOL.md §9.1): directly in a worker thread, or confined.

Shared by the server's ``fs/*`` handlers and the client's ``LocalFileSystem``. Without
a confined service, confined calls fail closed (``-32600``, PROTOCOL.md §10.7). A
direct call is one worker job: the event loop never touches the filesystem.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, TypeVar

from exec_server.fs import direct as ops
from exec_server.fs.direct import DirEntry, Metadata
from exec_server.fs.errors import FsFailedError, FsRefusedError, translate_os_errors
from exec_server.fs.handles import Install, Mode, open_into
from exec_server.fs.helper import ops as helper_ops
from exec_server.fs.pool import WorkerPool, shared_pool
from exec_server.fs.walk import WalkOptions, WalkOutcome, limits_error, walk

if TYPE_CHECKING:
    from exec_server.fs.confined import SandboxedFileSystem

__all__ = [
    "DIRECT", "NO_RUNTIME_PATHS", "FileSystemService", "FsOperation", "FsRoute", "NoFollowCall",
    "NoFollowResult", "Route",
]

T = TypeVar("T")

NO_RUNTIME_PATHS = "sandboxed filesystem operations require configured runtime paths"


@dataclass(frozen=True, slots=True)
class FsRoute:
    """Where one call runs: confined or not, with the decoded sandbox context the
    confined service is handed untouched (``None`` for direct calls)."""

    confined: bool
    context: object = None


DIRECT = FsRoute(confined=False)
Route = FsRoute


@dataclass(frozen=True, slots=True)
class FsOperation:
    """One filesystem call, decoded: method, absolute paths, payload, flags."""

    method: str
    path: str
    destination: str | None = None
    data: ops.Payload = b""
    recursive: bool = True
    force: bool = True
    walk: WalkOptions | None = None
    #: ``followSymlinks: false``: run on ``path`` as spelled, refusing any link in it
    no_follow: bool = False
    #: ``fs/open``'s mode (``read`` or ``replace``)
    mode: str = "read"

    @property
    def writes(self) -> bool:
        if self.method == "fs/open":
            return self.mode == "replace"
        return self.method in helper_ops.WRITE_OPS


class FileSystemService:
    """Typed async filesystem API; every method takes the call's :class:`FsRoute`.
    Without ``confined``, confined calls fail closed; ``pool`` runs the direct ones."""

    def __init__(
        self, confined: SandboxedFileSystem | None = None, *, pool: WorkerPool | None = None
    ) -> None:
        self._confined = confined
        self._pool = pool or shared_pool()

    @property
    def pool(self) -> WorkerPool:
        return self._pool

    def _confined_or_refuse(self) -> SandboxedFileSystem:
        if self._confined is None:
            raise FsRefusedError(NO_RUNTIME_PATHS)
        return self._confined

    async def read_file(
        self, path: str, route: Route = DIRECT, *, regular_only: bool = False
    ) -> bytes:
        """Whole file contents (cap :data:`~exec_server.fs.direct.READ_LIMIT`)."""
        if route.confined:
            confined = self._confined_or_refuse()
            if not confined.reads_directly(route.context):
                _, data = await confined.run(FsOperation("fs/readFile", path), route.context)
                return data
            regular_only = confined.reads_regular_only(route.context)
        return await self._pool.run(ops.read_file, path, regular_only=regular_only)

    async def _run_confined(self, route: Route, op: FsOperation) -> None:
        await self._confined_or_refuse().run(op, route.context)

    def _confined_read(self, route: Route) -> SandboxedFileSystem | None:
        """The confined service for a read on a confined ``route``; None when the policies
        provably read everything: it runs here, as upstream's does."""
        confined = self._confined_or_refuse()
        return None if confined.reads_directly(route.context) else confined

    async def read_file_mapped(
        self,
        path: str,
        map_large: Callable[[bytes], T],
        large_over: int,
        route: Route = DIRECT,
        *,
        regular_only: bool = False,
        map_pieces: Callable[[Iterable[memoryview], int], T] | None = None,
    ) -> bytes | T:
        """Like :meth:`read_file`, but contents over ``large_over`` bytes come back as
        ``map_large(data)``, computed in the worker that read them (one hand-off, not two);
        ``map_pieces(pieces, size)`` maps a regular file of :data:`PIECES_MIN` bytes or more
        :data:`READ_PIECE` bytes at a time, never held whole (``map_large`` if resized)."""
        if route.confined:
            confined = self._confined_or_refuse()
            if not confined.reads_directly(route.context):
                _, data = await confined.run(FsOperation("fs/readFile", path), route.context)
                if len(data) > large_over:
                    return await self._pool.run(map_large, data)
                return data
            # As the confined service would read it itself, with this route's rule.
            regular_only = confined.reads_regular_only(route.context)
        return await self._pool.run(
            _read_direct, path, regular_only, map_large, large_over, map_pieces
        )

    async def write_file_from(
        self, path: str, produce: Callable[[], ops.Payload], route: Route = DIRECT
    ) -> None:
        """Like :meth:`write_file` with the data made by ``produce()`` in the writing
        worker (big base64 payloads are decoded a slice at a time: ``ops.Pieces``)."""
        if route.confined:
            # Pieces are decoded as they go to the confined helper.
            payload = await self._pool.run(produce)
            return await self._run_confined(route, FsOperation("fs/writeFile", path, data=payload))
        await self._pool.run(lambda: ops.write_file(path, produce()))

    async def write_file(
        self, path: str, data: bytes | bytearray | memoryview, route: Route = DIRECT
    ) -> None:
        """Create or atomically replace ``path``."""
        if route.confined:
            return await self._run_confined(route, FsOperation("fs/writeFile", path, data=data))
        await self._pool.run(ops.write_file, path, data)

    async def create_directory(
        self, path: str, route: Route = DIRECT, *, recursive: bool = True
    ) -> None:
        if route.confined:
            op = FsOperation("fs/createDirectory", path, recursive=recursive)
            return await self._run_confined(route, op)
        await self._pool.run(ops.create_directory, path, recursive=recursive)

    async def get_metadata(self, path: str, route: Route = DIRECT) -> Metadata:
        if route.confined and (confined := self._confined_read(route)) is not None:
            return await confined.get_metadata(route.context, path)
        return await self._pool.run(ops.get_metadata, path)

    async def read_directory(self, path: str, route: Route = DIRECT) -> list[DirEntry]:
        if route.confined and (confined := self._confined_read(route)) is not None:
            result, _ = await confined.run(FsOperation("fs/readDirectory", path), route.context)
            return _entries_reply(result)
        return await self._pool.run(ops.read_directory, path)

    async def remove(
        self, path: str, route: Route = DIRECT, *, recursive: bool = True, force: bool = True
    ) -> None:
        if route.confined:
            op = FsOperation("fs/remove", path, recursive=recursive, force=force)
            return await self._run_confined(route, op)
        await self._pool.run(ops.remove, path, recursive=recursive, force=force)

    async def copy(
        self, source: str, destination: str, route: Route = DIRECT, *, recursive: bool
    ) -> None:
        if route.confined:
            op = FsOperation("fs/copy", source, destination=destination, recursive=recursive)
            return await self._run_confined(route, op)
        await self._pool.run(ops.copy, source, destination, recursive=recursive)

    async def walk(self, path: str, options: WalkOptions, route: Route = DIRECT) -> WalkOutcome:
        """A bounded breadth-first walk; limits are checked before the path is looked at."""
        refused = limits_error(options)
        if refused is not None:
            raise FsRefusedError(refused)
        if route.confined and (confined := self._confined_read(route)) is not None:
            # What the context does not let the caller read is absent (PROTOCOL_CURRENT §6.3).
            op = FsOperation("fs/walk", path, walk=options)
            result, _ = await confined.run(op, route.context)
            return _walk_reply(result)
        return await self._pool.run(_walk_here, path, options)

    async def open_handle(
        self, path: str, mode: Mode, install: Install, route: Route = DIRECT
    ) -> None:
        """Open ``fs/open``'s descriptor and hand it to ``install`` in the worker that
        opened it (a cancelled caller cannot leak it)."""
        if route.confined and (mode != "read" or self._confined_read(route) is not None):
            return await self._confined_or_refuse().open_handle(route.context, path, mode, install)
        await self._pool.run(open_into, install, path, mode)

    async def no_follow(self, call: NoFollowCall, route: Route = DIRECT) -> NoFollowResult:
        """A ``followSymlinks: false`` call (:mod:`exec_server.fs.nofollow`); confined, the
        policy is checked on the path as spelled and as resolved, and the child runs
        :func:`run_no_follow`'s code."""
        if route.confined and (
            call.method in helper_ops.WRITE_OPS or self._confined_read(route) is not None
        ):
            confined = self._confined_or_refuse()
            data = b"" if call.produce is None else await self._pool.run(call.produce)
            op = FsOperation(call.method, call.path, data=data, recursive=call.recursive,
                             force=call.force, no_follow=True)
            return no_follow_result(call.method, *await confined.run(op, route.context))
        return await self._pool.run(run_no_follow, call)

    async def get_metadata_no_follow(self, path: str, route: Route = DIRECT) -> Metadata:
        meta = await self.no_follow(NoFollowCall("fs/getMetadata", path), route)
        assert isinstance(meta, Metadata)
        return meta

    async def read_file_no_follow(self, path: str, route: Route = DIRECT) -> bytes:
        data = await self.no_follow(NoFollowCall("fs/readFile", path), route)
        assert isinstance(data, bytes)
        return data

    async def canonicalize(self, path: str, route: Route = DIRECT) -> str:
        if route.confined and (confined := self._confined_read(route)) is not None:
            result, _ = await confined.run(FsOperation("fs/canonicalize", path), route.context)
            return _path_reply(result)
        return await self._pool.run(ops.canonicalize, path)


def _entries_reply(result: dict[str, object]) -> list[DirEntry]:
    entries = result.get("entries")
    if not isinstance(entries, list):
        raise FsFailedError("unexpected fs sandbox helper response: no entries")
    return [
        DirEntry(
            file_name=str(e.get("fileName", "")),
            is_directory=bool(e.get("isDirectory")),
            is_file=bool(e.get("isFile")),
        )
        for e in entries
        if isinstance(e, dict)
    ]


def _walk_reply(result: dict[str, object]) -> WalkOutcome:
    entries = result.get("entries")
    errors = result.get("errors")
    if not isinstance(entries, list) or not isinstance(errors, list):
        raise FsFailedError("unexpected fs sandbox helper response: no walk outcome")
    try:
        return WalkOutcome(
            entries=[(str(d), str(n), bool(k)) for d, n, k in entries],
            errors=[(str(d), str(n), str(m)) for d, n, m in errors],
            truncated=bool(result.get("truncated")),
        )
    except (TypeError, ValueError) as exc:
        raise FsFailedError(f"unexpected fs sandbox helper response: {exc}") from None


def _path_reply(result: dict[str, object]) -> str:
    out = result.get("path")
    if not isinstance(out, str):
        raise FsFailedError("unexpected fs sandbox helper response: no path")
    return out


def _read_direct(
    path: str,
    regular_only: bool,
    map_large: Callable[[bytes], T],
    large_over: int,
    map_pieces: Callable[[Iterable[memoryview], int], T] | None,
) -> bytes | T:
    fd, size = ops.open_for_read(path, regular_only=regular_only)
    if map_pieces is not None and size is not None and size >= max(PIECES_MIN, large_over + 1):
        try:
            with translate_os_errors():
                return map_pieces(_pieces_of(fd, size), size)
        except _Resized:
            with translate_os_errors():
                os.lseek(fd, 0, os.SEEK_SET)
            fd, closing = -1, fd
            data = ops.read_and_close(closing, None)
        finally:
            if fd >= 0:
                os.close(fd)
    else:
        data = ops.read_and_close(fd, size)
    return map_large(data) if len(data) > large_over else data


#: Bytes of a big file read at a time (a multiple of 3: whole base64 groups).
READ_PIECE: Final = 3 << 18
#: Files from this size on are read a piece at a time when the caller can map pieces.
PIECES_MIN: Final = 3 << 20


class _Resized(Exception):
    """The file is no longer as long as its ``fstat`` said."""


def _pieces_of(fd: int, size: int) -> Iterator[memoryview]:
    """``fd``'s ``size`` bytes in one reused buffer; :class:`_Resized` if that is wrong."""
    buffer = bytearray(min(READ_PIECE, size))
    view = memoryview(buffer)
    done = 0
    while done < size:
        want = min(READ_PIECE, size - done)
        got = 0
        while got < want:
            n = os.readv(fd, [view[got:want]])
            if n == 0:
                raise _Resized
            got += n
        yield view[:want]
        done += want
    if os.read(fd, 1):
        raise _Resized


@dataclass(frozen=True, slots=True)
class NoFollowCall:
    """One ``followSymlinks: false`` call; ``produce`` makes writeFile's data."""

    method: str
    path: str
    recursive: bool = True
    force: bool = True
    produce: Callable[[], ops.Payload] | None = None


#: getMetadata's :class:`Metadata`, readFile's bytes, None for the rest.
NoFollowResult = Metadata | bytes | None


def run_no_follow(call: NoFollowCall) -> NoFollowResult:
    """Run ``call`` in this worker, with the code the confined child runs."""
    data = b"" if call.produce is None else ops.payload_bytes(call.produce())
    fields, payload = helper_ops.no_follow(
        call.method, call.path, data, recursive=call.recursive, force=call.force
    )
    return no_follow_result(call.method, fields, payload)


def no_follow_result(method: str, fields: dict[str, object], payload: bytes) -> NoFollowResult:
    if method == "fs/getMetadata":
        return metadata_from_fields(fields)
    return payload if method == "fs/readFile" else None


def metadata_from_fields(fields: dict[str, object]) -> Metadata:

    def number(key: str) -> int:
        value = fields.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    return Metadata(
        is_directory=bool(fields.get("isDirectory")),
        is_file=bool(fields.get("isFile")),
        created_at_ms=number("createdAtMs"),
        modified_at_ms=number("modifiedAtMs"),
        is_symlink=bool(fields.get("isSymlink", False)),
        size=number("size"),
    )


def _walk_here(path: str, options: WalkOptions) -> WalkOutcome:
    with translate_os_errors():
        return walk(path, options)
