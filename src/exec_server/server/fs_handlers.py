"""``fs/*`` request handlers: wire structs <-> :class:`FileSystemService` calls.

Each handler parses its path members (plain absolute path or ``file://`` URI,
lexically normalised; PROTOCOL.md §5.2, CLIENT_COMPAT.md §1.3), turns the raw
``sandbox`` member into a route, and calls the shared service. Answers follow
the generation of the request's primary path (CLIENT_COMPAT.md §1.2): a URI
request gets ``isSymlink``/``size`` in ``fs/getMetadata`` and ``-32600 path
`/x` is not a file`` for ``fs/readFile`` of a directory; paths in results use
the request's form.
"""

from __future__ import annotations

import binascii
import functools
from collections.abc import Callable
from typing import Final, cast

import msgspec

from exec_server.exceptions import InvalidParamsError, InvalidRequestError
from exec_server.fs import ops
from exec_server.fs.context import cached_route_from_wire, route_from_wire
from exec_server.fs.ops import lossy_name
from exec_server.fs.service import DIRECT, FileSystemService, Route, writes_inline
from exec_server.protocol import fs_types as t
from exec_server.protocol import native_base64
from exec_server.protocol.codec import register_deferred_string, register_one_pass
from exec_server.protocol.json_span import StringSpan
from exec_server.protocol.paths import PathForm, WirePath, normalize_lexical
from exec_server.protocol.paths import parse_wire_path as _parse_wire_path_full
from exec_server.server.router import Done, NotNow, RequestContext, Router

__all__ = ["decode_data_base64", "register"]

#: Payloads up to this size are (de)coded on the event loop; bigger ones in a
#: worker thread, so a 64 MiB transfer never stalls other connections.
INLINE_CODEC_LIMIT: Final = 256 * 1024

_bytes_decoder: Final = msgspec.json.Decoder(bytes)
_encoder: Final = msgspec.json.Encoder()

_B64_ALPHABET = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")


#: Characters that make a ``file:///`` URI need the full parser (escapes, query,
#: fragment, characters ``urlsplit`` drops, NUL).
_URI_SLOW_CHARS = frozenset("%?#\t\r\n\x00")


def parse_wire_path(value: str) -> WirePath:
    """:func:`exec_server.protocol.paths.parse_wire_path` with a fast path for the
    common ``file:///plain/path`` (what Codex sends): no ``urlsplit``/``unquote``,
    ~1 µs instead of ~4.5 µs; same result (tested against the full parser)."""
    if value.startswith("file:///") and _URI_SLOW_CHARS.isdisjoint(value):
        return WirePath(normalize_lexical(value[7:]), PathForm.URI)
    return _parse_wire_path_full(value)


def _service(ctx: RequestContext) -> FileSystemService:
    """The server's filesystem service (made on first use, then kept on the services)."""
    services = ctx.services
    service = services.fs_service
    if service is None:
        service = services.fs_service = FileSystemService(services.fs_sandbox)
    return service


def _route(raw: t.SandboxField) -> Route:
    sandbox = t.sandbox_raw(raw)
    return route_from_wire(None if sandbox is None else bytes(sandbox))


def _base64_error_text(data: bytes) -> str:
    """Upstream's (Rust ``base64`` crate) wording for the first defect in ``data``."""
    end = len(data)
    while end and data[end - 1] == ord("="):
        end -= 1
    for offset, byte in enumerate(data):
        if byte not in _B64_ALPHABET and not (byte == ord("=") and offset >= end):
            return f"Invalid symbol {byte}, offset {offset}."
    if end % 4 == 1:
        return "Invalid input length."
    if len(data) % 4 != 0 or len(data) - end > 2:
        return "Invalid padding"
    return f"Invalid last symbol {data[end - 1]}, offset {end - 1}."


def _not_json_text(exc: msgspec.DecodeError) -> InvalidRequestError:
    """Only a deferred span (:func:`decode_data_span`) reaches the decoder unchecked
    (the rest of its message was valid JSON): it is bad base64 all the same."""
    return InvalidRequestError(f"fs/writeFile requires valid base64 dataBase64: {exc}")


def decode_data_base64(raw: msgspec.Raw) -> bytes:
    """Decode ``dataBase64`` straight from its raw JSON token (no intermediate ``str``).

    Raises:
        InvalidParamsError: the member is not a JSON string (-32602).
        InvalidRequestError: the string is not padded standard base64 (-32600,
            ``fs/writeFile requires valid base64 dataBase64: <error>``).
    """
    try:
        return _bytes_decoder.decode(raw)
    except msgspec.ValidationError as exc:
        refused = exc
    except msgspec.DecodeError as exc:
        raise _not_json_text(exc) from exc
    try:
        text = msgspec.json.decode(raw, type=str)
    except msgspec.ValidationError:
        raise InvalidParamsError(f"{refused} - at `$.dataBase64`") from refused
    except msgspec.DecodeError as exc:
        raise _not_json_text(exc) from exc
    data = text.encode("utf-8", "surrogatepass")
    try:
        # msgspec is lenient about the bits of a final partial group; be strict.
        return binascii.a2b_base64(data, strict_mode=True)
    except binascii.Error as exc:
        raise InvalidRequestError(
            f"fs/writeFile requires valid base64 dataBase64: {_base64_error_text(data)}"
        ) from exc


def decode_data_span(span: StringSpan) -> bytes | memoryview:
    """Decode a big request's ``dataBase64`` where it lies in the message: natively
    (no GIL) when it is plain padded base64, else as :func:`decode_data_base64`."""
    data = native_base64.decode_strict(span.data, span.start, span.end)
    if data is not None:
        return data
    return decode_data_base64(msgspec.Raw(span.token()))


def encode_data_base64(data: bytes) -> msgspec.Raw:
    """``data`` as a ready JSON base64 string token (done in a worker for big files)."""
    return msgspec.Raw(_encoder.encode(data))


async def read_file(
    ctx: RequestContext, params: t.ReadFileParams
) -> t.ReadFileResult | t.ReadFileEncoded:
    path = parse_wire_path(params.path)
    result = await _service(ctx).read_file_mapped(
        path.path,
        encode_data_base64,
        INLINE_CODEC_LIMIT,
        _route(params.sandbox),
        directory_is_invalid=path.form is PathForm.URI,
    )
    if isinstance(result, bytes):
        return t.ReadFileResult(data_base64=result)
    return t.ReadFileEncoded(data_base64=result)


def _now_route(raw: t.SandboxField) -> Route:
    """The route, if known without decoding (no context, or one decoded before), else
    :class:`NotNow`: a new context is decoded once, on the async path."""
    sandbox = t.sandbox_raw(raw)
    if sandbox is None:
        return DIRECT
    route = cached_route_from_wire(bytes(sandbox))
    if route is None:
        raise NotNow
    return route


def read_file_now(ctx: RequestContext, params: t.ReadFileParams) -> t.ReadFileResult:
    """:func:`read_file` for a small regular file read in the server (else :class:`NotNow`)."""
    route = _now_route(params.sandbox)
    path = parse_wire_path(params.path)
    data = _service(ctx).read_file_now(
        path.path, route, directory_is_invalid=path.form is PathForm.URI
    )
    if data is None:
        raise NotNow
    return t.ReadFileResult(data_base64=data)


async def write_file(
    ctx: RequestContext,
    params: t.WriteFileParams | t.WriteFileParamsDecoded | t.WriteFileParamsSpan,
) -> t.EmptyResult:
    path = parse_wire_path(params.path)
    route = _route(params.sandbox)
    service = _service(ctx)
    raw = params.data_base64
    if isinstance(raw, StringSpan):
        await service.write_file_from(path.path, functools.partial(decode_data_span, raw), route)
    elif isinstance(raw, bytes):
        await service.write_file(path.path, raw, route)  # decoded with the message
    elif len(raw) <= INLINE_CODEC_LIMIT:
        await service.write_file(path.path, decode_data_base64(raw), route)
    else:
        # Decoded in the worker that writes: one thread hand-off, not two.
        await service.write_file_from(path.path, functools.partial(decode_data_base64, raw), route)
    return t.EmptyResult()


async def create_directory(ctx: RequestContext, params: t.CreateDirectoryParams) -> t.EmptyResult:
    path = parse_wire_path(params.path)
    recursive = True if params.recursive is None else params.recursive
    await _service(ctx).create_directory(path.path, _route(params.sandbox), recursive=recursive)
    return t.EmptyResult()


async def get_metadata(ctx: RequestContext, params: t.GetMetadataParams) -> t.GetMetadataResult:
    path = parse_wire_path(params.path)
    meta = await _service(ctx).get_metadata(path.path, _route(params.sandbox))
    return _metadata_result(path, meta)


def get_metadata_now(ctx: RequestContext, params: t.GetMetadataParams) -> t.GetMetadataResult:
    """:func:`get_metadata` when it runs in the server (else :class:`NotNow`)."""
    route = _now_route(params.sandbox)
    if not _service(ctx).reads_directly(route):
        raise NotNow  # the confined helper answers, on the async path
    path = parse_wire_path(params.path)
    return _metadata_result(path, ops.get_metadata(path.path))


def _metadata_result(path: WirePath, meta: ops.Metadata) -> t.GetMetadataResult:
    if path.form is PathForm.URI:
        return t.GetMetadataResult(
            is_directory=meta.is_directory,
            is_file=meta.is_file,
            is_symlink=bool(meta.is_symlink),
            size=meta.size or 0,
            created_at_ms=meta.created_at_ms,
            modified_at_ms=meta.modified_at_ms,
        )
    return t.GetMetadataResult(
        is_directory=meta.is_directory,
        is_file=meta.is_file,
        created_at_ms=meta.created_at_ms,
        modified_at_ms=meta.modified_at_ms,
    )


async def read_directory(
    ctx: RequestContext, params: t.ReadDirectoryParams
) -> t.ReadDirectoryResult:
    path = parse_wire_path(params.path)
    entries = await _service(ctx).read_directory(path.path, _route(params.sandbox))
    return _directory_result(entries)


def _directory_result(entries: list[ops.DirEntry]) -> t.ReadDirectoryResult:
    return t.ReadDirectoryResult(
        entries=[
            t.DirectoryEntry(
                file_name=lossy_name(e.file_name), is_directory=e.is_directory, is_file=e.is_file
            )
            for e in entries
        ]
    )


async def remove(ctx: RequestContext, params: t.RemoveParams) -> t.EmptyResult:
    path = parse_wire_path(params.path)
    await _service(ctx).remove(
        path.path,
        _route(params.sandbox),
        recursive=True if params.recursive is None else params.recursive,
        force=True if params.force is None else params.force,
    )
    return t.EmptyResult()


async def copy(ctx: RequestContext, params: t.CopyParams) -> t.EmptyResult:
    source = parse_wire_path(params.source_path)
    destination = parse_wire_path(params.destination_path)
    await _service(ctx).copy(
        source.path, destination.path, _route(params.sandbox), recursive=params.recursive
    )
    return t.EmptyResult()


async def canonicalize(ctx: RequestContext, params: t.CanonicalizeParams) -> t.CanonicalizeResult:
    path = parse_wire_path(params.path)
    resolved = await _service(ctx).canonicalize(path.path, _route(params.sandbox))
    if path.form is PathForm.PLAIN:
        resolved = lossy_name(resolved)  # JSON strings cannot carry raw bytes
    return t.CanonicalizeResult(path=path.render(resolved))


# -- start handlers: direct (no sandbox context) calls started in a worker from the
# socket callback (Router.dispatch_start); same operations as the async handlers.

_EMPTY: Final = t.EmptyResult()


def _direct_only(sandbox: t.SandboxField) -> None:
    """Start only calls that run in the server: no context, or a known direct one
    (full access, external, disabled); confined calls and new contexts: :class:`NotNow`."""
    if _now_route(sandbox).confined:
        raise NotNow


def _submit_empty(
    ctx: RequestContext, done: Done, fn: Callable[..., object], *args: object, **kwargs: object
) -> None:
    def offer(result: object, error: BaseException | None) -> bool:
        return done.from_thread(None if error is not None else _EMPTY, error)

    def deliver(result: object, error: BaseException | None) -> None:
        done(None if error is not None else _EMPTY, error)

    _service(ctx).pool.submit_offering(offer, deliver, functools.partial(fn, *args, **kwargs))


def write_file_start(ctx: RequestContext, params: t.WriteFileParams, done: Done) -> None:
    _direct_only(params.sandbox)
    raw = params.data_base64
    if not isinstance(raw, msgspec.Raw) or len(raw) > INLINE_CODEC_LIMIT:
        raise NotNow
    path = parse_wire_path(params.path)
    data = decode_data_base64(raw)
    if writes_inline(path.path, len(data)):
        try:
            ops.write_file(path.path, data)
        except Exception as exc:
            done(None, exc)
        else:
            done(_EMPTY, None)
        return
    _submit_empty(ctx, done, ops.write_file, path.path, data)


def create_directory_start(
    ctx: RequestContext, params: t.CreateDirectoryParams, done: Done
) -> None:
    _direct_only(params.sandbox)
    path = parse_wire_path(params.path)
    recursive = True if params.recursive is None else params.recursive
    _submit_empty(ctx, done, ops.create_directory, path.path, recursive=recursive)


def remove_start(ctx: RequestContext, params: t.RemoveParams, done: Done) -> None:
    _direct_only(params.sandbox)
    path = parse_wire_path(params.path)
    _submit_empty(
        ctx,
        done,
        ops.remove,
        path.path,
        recursive=True if params.recursive is None else params.recursive,
        force=True if params.force is None else params.force,
    )


def copy_start(ctx: RequestContext, params: t.CopyParams, done: Done) -> None:
    _direct_only(params.sandbox)
    source = parse_wire_path(params.source_path)
    destination = parse_wire_path(params.destination_path)
    _submit_empty(ctx, done, ops.copy, source.path, destination.path, recursive=params.recursive)


def read_directory_start(ctx: RequestContext, params: t.ReadDirectoryParams, done: Done) -> None:
    if not _service(ctx).reads_directly(_now_route(params.sandbox)):
        raise NotNow  # the confined helper lists it, on the async path
    path = parse_wire_path(params.path)

    def listing() -> t.ReadDirectoryResult:
        return _directory_result(ops.read_directory(path.path))

    def offer(result: object, error: BaseException | None) -> bool:
        return done.from_thread(cast("t.ReadDirectoryResult | None", result), error)

    def deliver(result: object, error: BaseException | None) -> None:
        done(cast("t.ReadDirectoryResult | None", result), error)

    _service(ctx).pool.submit_offering(offer, deliver, listing)


def register(router: Router) -> None:
    """Add every ``fs/*`` method (family ``filesystem``, PROTOCOL.md §4.3)."""
    # Big writes: base64 decoded natively in the writing worker when it can be,
    # else envelope, params and base64 in one pass over the text.
    if native_base64.available():
        register_deferred_string(
            t.METHOD_WRITE_FILE,
            "dataBase64",
            t.WriteFileParamsHead,
            t.WriteFileParamsSpan.from_head,
        )
    register_one_pass(t.METHOD_WRITE_FILE, t.WriteFileParamsDecoded)
    router.add(t.METHOD_READ_FILE, t.ReadFileParams, read_file, "filesystem", now=read_file_now)
    router.add(
        t.METHOD_WRITE_FILE, t.WriteFileParams, write_file, "filesystem", start=write_file_start
    )
    router.add(
        t.METHOD_CREATE_DIRECTORY,
        t.CreateDirectoryParams,
        create_directory,
        "filesystem",
        start=create_directory_start,
    )
    router.add(
        t.METHOD_GET_METADATA, t.GetMetadataParams, get_metadata, "filesystem", now=get_metadata_now
    )
    router.add(
        t.METHOD_READ_DIRECTORY,
        t.ReadDirectoryParams,
        read_directory,
        "filesystem",
        start=read_directory_start,
    )
    router.add(t.METHOD_REMOVE, t.RemoveParams, remove, "filesystem", start=remove_start)
    router.add(t.METHOD_COPY, t.CopyParams, copy, "filesystem", start=copy_start)
    router.add(t.METHOD_CANONICALIZE, t.CanonicalizeParams, canonicalize, "filesystem")
