"""``fs/*`` request handlers: wire structs <-> :class:`FileSystemService` calls.

Answers follow the generation of the request's primary path (CLIENT_COMPAT.md
§1.2): a ``file://`` request gets ``isSymlink``/``size`` in ``fs/getMetadata`` and
``-32600`` for ``fs/readFile`` of a directory; result paths use the request's form.
"""

from __future__ import annotations

import binascii
import functools
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Final

import msgspec

from exec_server.exceptions import InvalidParamsError, InvalidRequestError
from exec_server.fs import direct as ops
from exec_server.fs.context import route_for
from exec_server.fs.direct import lossy_name
from exec_server.fs.service import NoFollowCall, Route
from exec_server.fs.walk import WalkOptions, WalkOutcome
from exec_server.protocol.base64_text import (
    Undecodable,
    decode_slices,
    decoded_size,
    encode_pieces_quoted,
    encode_quoted,
    error_text,
    stray_bits,
)
from exec_server.protocol.json_span import StringSpan
from exec_server.protocol.paths import PathForm, parse_wire_path, render_path, uri_quote
from exec_server.protocol.types import fs as t
from exec_server.protocol.types.sandbox import decode_fs_sandbox
from exec_server.server.router import RequestContext, Router

__all__ = ["decode_data_base64", "register", "sandbox_route"]

#: Payloads up to this size are (de)coded on the event loop; bigger ones in a worker.
INLINE_CODEC_LIMIT: Final = 256 * 1024

_bytes_decoder: Final = msgspec.json.Decoder(bytes)


async def sandbox_route(ctx: RequestContext, raw: t.SandboxField) -> Route:
    return await route_for(decode_fs_sandbox(t.sandbox_raw(raw)), ctx.services.fs_service.pool)


_BACKSLASH: Final = re.compile(rb"\\")


def _invalid_base64(error: object) -> InvalidRequestError:
    return InvalidRequestError(f"fs/writeFile requires valid base64 dataBase64: {error}")


def decode_data_base64(raw: msgspec.Raw) -> bytes:
    """Decode ``dataBase64`` straight from its raw JSON token (no intermediate ``str``);
    -32602 for a non-string, upstream's -32600 for non-canonical base64."""
    refused: msgspec.ValidationError | None = None
    try:
        decoded = _bytes_decoder.decode(raw)
    except msgspec.ValidationError as exc:
        # Without its traceback, which holds this frame (the text and its
        # decoding): a cycle only the collector would free.
        refused = exc.with_traceback(None)
    except msgspec.DecodeError as exc:  # not UTF-8 text: bad base64 all the same
        raise _invalid_base64(exc) from exc
    else:
        token = memoryview(raw)
        if _BACKSLASH.search(token) is None and not stray_bits(token, 1, len(token) - 1):
            return decoded
        # An escape hides the last characters, or stray bits: judge the text itself.
    try:
        text = msgspec.json.decode(raw, type=str)
    except msgspec.ValidationError:
        raise InvalidParamsError(f"{refused} - at `$.dataBase64`") from refused
    except msgspec.DecodeError as exc:  # not UTF-8 text: bad base64 all the same
        raise _invalid_base64(exc) from exc
    data = text.encode("utf-8", "surrogatepass")
    error = error_text(data)
    if error is not None:
        raise _invalid_base64(error)
    if refused is None:
        return decoded
    return binascii.a2b_base64(data, strict_mode=True)  # valid by upstream's rules


def span_payload(span: StringSpan) -> ops.Payload:
    """A big ``dataBase64`` decoded a slice at a time as the worker writes it: the
    GIL goes back to the loop between slices and the file is never held whole."""
    text, start, end = span.data, span.start, span.end
    if stray_bits(text, start, end):
        raise _invalid_base64(error_text(memoryview(text)[start:end]))

    def produce() -> Iterator[bytes]:
        try:
            yield from decode_slices(text, start, end)
        except Undecodable as exc:
            error = error_text(memoryview(text)[start:end])
            raise _invalid_base64(exc if error is None else error) from None

    return ops.Pieces(decoded_size(text, start, end), produce)


def read_text(data: bytes) -> t.ReadFileText:
    """A big ``fs/readFile`` result, encoded in a worker."""
    return t.ReadFileText(data_base64=msgspec.Raw(encode_quoted(data)))


def read_text_pieces(pieces: Iterable[memoryview], size: int) -> t.ReadFileText:
    return t.ReadFileText(data_base64=msgspec.Raw(encode_pieces_quoted(pieces, size)))


async def read_file(
    ctx: RequestContext, params: t.ReadFileParams
) -> t.ReadFileResult | t.ReadFileText:
    path = parse_wire_path(params.path)
    service = ctx.services.fs_service
    route = await sandbox_route(ctx, params.sandbox)
    if params.follow_symlinks is False:
        data = await service.read_file_no_follow(path.path, route)
        if len(data) > INLINE_CODEC_LIMIT:
            return await service.pool.run(read_text, data)
        return t.ReadFileResult(data_base64=data)
    result = await service.read_file_mapped(
        path.path, read_text, INLINE_CODEC_LIMIT, route,
        regular_only=path.form is PathForm.URI, map_pieces=read_text_pieces,
    )
    if isinstance(result, bytes):
        return t.ReadFileResult(data_base64=result)
    return result


async def write_file(ctx: RequestContext, params: t.WriteFileParams) -> t.EmptyResult:
    path = parse_wire_path(params.path)
    route = await sandbox_route(ctx, params.sandbox)
    service = ctx.services.fs_service
    span = ctx.span
    raw = params.data_base64
    following = params.follow_symlinks is not False
    if span is None and len(raw) <= INLINE_CODEC_LIMIT and following:
        await service.write_file(path.path, decode_data_base64(raw), route)
        return t.EmptyResult()
    # Decoded in the worker that writes: one thread hand-off, not two.
    produce: Callable[[], ops.Payload] = (
        functools.partial(span_payload, span)
        if span is not None
        else functools.partial(decode_data_base64, raw)
    )
    if following:
        await service.write_file_from(path.path, produce, route)
    else:
        call = NoFollowCall(t.METHOD_WRITE_FILE, path.path, produce=produce)
        await service.no_follow(call, route)
    return t.EmptyResult()


async def create_directory(ctx: RequestContext, params: t.CreateDirectoryParams) -> t.EmptyResult:
    path = parse_wire_path(params.path).path
    recursive = params.recursive is not False
    route = await sandbox_route(ctx, params.sandbox)
    service = ctx.services.fs_service
    if params.follow_symlinks is False:
        call = NoFollowCall(t.METHOD_CREATE_DIRECTORY, path, recursive=recursive)
        await service.no_follow(call, route)
    else:
        await service.create_directory(path, route, recursive=recursive)
    return t.EmptyResult()


async def get_metadata(ctx: RequestContext, params: t.GetMetadataParams) -> t.GetMetadataResult:
    path = parse_wire_path(params.path)
    route = await sandbox_route(ctx, params.sandbox)
    service = ctx.services.fs_service
    if params.follow_symlinks is False:
        meta = await service.get_metadata_no_follow(path.path, route)
    else:
        meta = await service.get_metadata(path.path, route)
    uri = path.form is PathForm.URI  # only a current client gets isSymlink and size
    return t.GetMetadataResult(
        is_directory=meta.is_directory,
        is_file=meta.is_file,
        is_symlink=bool(meta.is_symlink) if uri else msgspec.UNSET,
        size=(meta.size or 0) if uri else msgspec.UNSET,
        created_at_ms=meta.created_at_ms,
        modified_at_ms=meta.modified_at_ms,
    )


async def read_directory(
    ctx: RequestContext, params: t.ReadDirectoryParams
) -> t.ReadDirectoryResult:
    path = parse_wire_path(params.path)
    route = await sandbox_route(ctx, params.sandbox)
    entries = await ctx.services.fs_service.read_directory(path.path, route)
    return t.ReadDirectoryResult(
        entries=[
            t.DirectoryEntry(
                file_name=lossy_name(e.file_name), is_directory=e.is_directory, is_file=e.is_file
            )
            for e in entries
        ]
    )


async def remove(ctx: RequestContext, params: t.RemoveParams) -> t.EmptyResult:
    path = parse_wire_path(params.path).path
    route = await sandbox_route(ctx, params.sandbox)
    recursive = params.recursive is not False
    force = params.force is not False
    if params.follow_symlinks is False:
        call = NoFollowCall(t.METHOD_REMOVE, path, recursive=recursive, force=force)
        await ctx.services.fs_service.no_follow(call, route)
    else:
        await ctx.services.fs_service.remove(path, route, recursive=recursive, force=force)
    return t.EmptyResult()


async def copy(ctx: RequestContext, params: t.CopyParams) -> t.EmptyResult:
    source = parse_wire_path(params.source_path).path
    destination = parse_wire_path(params.destination_path).path
    route = await sandbox_route(ctx, params.sandbox)
    await ctx.services.fs_service.copy(source, destination, route, recursive=params.recursive)
    return t.EmptyResult()


async def canonicalize(ctx: RequestContext, params: t.CanonicalizeParams) -> t.CanonicalizeResult:
    path = parse_wire_path(params.path)
    route = await sandbox_route(ctx, params.sandbox)
    resolved = await ctx.services.fs_service.canonicalize(path.path, route)
    if path.form is PathForm.PLAIN:
        resolved = lossy_name(resolved)  # JSON strings cannot carry raw bytes
    return t.CanonicalizeResult(path=path.render(resolved))


async def walk(ctx: RequestContext, params: t.WalkParams) -> t.WalkResult:
    path = parse_wire_path(params.path)
    options = WalkOptions(**msgspec.structs.asdict(params.options))  # the same five members
    service = ctx.services.fs_service
    outcome = await service.walk(path.path, options, await sandbox_route(ctx, params.sandbox))
    if len(outcome.entries) > _WALK_INLINE_ENTRIES:
        return await service.pool.run(_walk_result, path.form, outcome)
    return _walk_result(path.form, outcome)


#: Walk results with more entries are rendered in a worker, not on the loop.
_WALK_INLINE_ENTRIES: Final = 2_000


def _walk_result(form: PathForm, outcome: WalkOutcome) -> t.WalkResult:
    """Entry paths as the request spelled its path; each directory rendered once."""
    rendered: dict[str, str] = {}

    def under(directory: str) -> str:
        prefix = rendered.get(directory)
        if prefix is None:
            prefix = render_path(directory, form)
            if not prefix.endswith("/"):
                prefix += "/"
            rendered[directory] = prefix
        return prefix

    quote = uri_quote if form is PathForm.URI else lossy_name
    entries = [
        t.WalkEntry(path=under(d) + quote(n), kind="directory" if is_dir else "file")
        for d, n, is_dir in outcome.entries
    ]
    errors = [
        t.WalkError(path=under(d) + quote(n) if n else render_path(d, form), message=m)
        for d, n, m in outcome.errors
    ]
    return t.WalkResult(entries=entries, errors=errors, truncated=outcome.truncated)


def register(router: Router) -> None:
    router.add(t.METHOD_READ_FILE, t.ReadFileParams, read_file, "filesystem")
    router.add(t.METHOD_WRITE_FILE, t.WriteFileParams, write_file, "filesystem")
    router.add(t.METHOD_CREATE_DIRECTORY, t.CreateDirectoryParams, create_directory, "filesystem")
    router.add(t.METHOD_GET_METADATA, t.GetMetadataParams, get_metadata, "filesystem")
    router.add(t.METHOD_READ_DIRECTORY, t.ReadDirectoryParams, read_directory, "filesystem")
    router.add(t.METHOD_REMOVE, t.RemoveParams, remove, "filesystem")
    router.add(t.METHOD_COPY, t.CopyParams, copy, "filesystem")
    router.add(t.METHOD_CANONICALIZE, t.CanonicalizeParams, canonicalize, "filesystem")
    router.add(t.METHOD_WALK, t.WalkParams, walk, "filesystem")
