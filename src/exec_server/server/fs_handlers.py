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
import os
import re
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Final

import msgspec

from exec_server.exceptions import InvalidParamsError, InvalidRequestError
from exec_server.fs import ops
from exec_server.fs.context import route_for
from exec_server.fs.ops import lossy_name
from exec_server.fs.service import (
    FileSystemService,
    NoFollowCall,
    Route,
)
from exec_server.fs.walk import WalkOptions, WalkOutcome
from exec_server.protocol import fs_types as t
from exec_server.protocol import native_base64
from exec_server.protocol.codec import (
    EncodedReply,
    ReplyToFill,
    encode_reply,
    encode_reply_filled,
    register_deferred_string,
)
from exec_server.protocol.json_span import StringSpan
from exec_server.protocol.messages import RequestId
from exec_server.protocol.paths import PathForm, WirePath, normalize_lexical, render_path
from exec_server.protocol.paths import parse_wire_path as _parse_wire_path_full
from exec_server.protocol.sandbox_types import decode_fs_sandbox
from exec_server.server.router import RequestContext, Router

__all__ = [
    "decode_data_base64",
    "filesystem_service",
    "parse_wire_path",
    "register",
    "sandbox_route",
]

#: Payloads up to this size are (de)coded on the event loop; bigger ones in a
#: worker thread, so a 64 MiB transfer never stalls other connections.
INLINE_CODEC_LIMIT: Final = 256 * 1024

_bytes_decoder: Final = msgspec.json.Decoder(bytes)


#: Characters that make a ``file:///`` URI need the full parser (escapes, query,
#: fragment, characters the URL standard drops or reads as ``/``, NUL).
_URI_SLOW_CHARS = frozenset("%?#\t\r\n\x00\\")


def parse_wire_path(value: str) -> WirePath:
    """:func:`exec_server.protocol.paths.parse_wire_path` with a fast path for the
    common ``file:///plain/path`` (what Codex sends): no ``urlsplit``/``unquote``,
    ~1 µs instead of ~4.5 µs; same result (tested against the full parser)."""
    if (
        value.startswith("file:///")
        and value[-1] > " "
        and _URI_SLOW_CHARS.isdisjoint(value)
        and "//" not in value[7:]  # an empty segment counts for a URL's `..`
    ):
        return WirePath(normalize_lexical(value[7:]), PathForm.URI)
    return _parse_wire_path_full(value)


def _service(ctx: RequestContext) -> FileSystemService:
    """The server's filesystem service (made on first use, then kept on the services)."""
    services = ctx.services
    service = services.fs_service
    if service is None:
        service = services.fs_service = FileSystemService(services.fs_sandbox)
    return service


async def _route(ctx: RequestContext, raw: t.SandboxField) -> Route:
    return await route_for(decode_fs_sandbox(t.sandbox_raw(raw)), _service(ctx).pool)


#: for the other fs handler modules (file handles)
filesystem_service = _service
sandbox_route = _route

_B64_VALUES: Final = {
    c: i for i, c in enumerate(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
}
_PAD: Final = 0x3D
#: byte -> 0 for a base64 symbol, 1 for anything else
_SYMBOL_OR_NOT: Final = bytes(0 if c in _B64_VALUES else 1 for c in range(256))
_SCAN_CHUNK: Final = 1 << 20
_BACKSLASH: Final = re.compile(rb"\\")


def _first_non_symbol(data: bytes | memoryview, end: int) -> int:
    """Offset of the first byte before ``end`` that is no base64 symbol, or -1.

    In C, a chunk at a time (``translate`` then ``find``, ~0.1 s for 100 MiB,
    without a copy of the whole text): a byte at a time in Python took ~10 s
    for a 100 MiB payload whose last group was bad, holding the GIL all along.
    """
    view = memoryview(data)
    for start in range(0, end, _SCAN_CHUNK):
        stop = min(start + _SCAN_CHUNK, end)
        found = bytes(view[start:stop]).translate(_SYMBOL_OR_NOT).find(1)
        if found >= 0:
            return start + found
    return -1


def _base64_error_text(data: bytes | memoryview) -> str | None:
    """Upstream's error for ``data`` (Rust ``base64`` 0.22, standard alphabet,
    canonical padding, no stray bits in the last symbol), or None if it is valid.

    Checked in upstream's order, so the same defect is named: a bad last byte
    when the length leaves one symbol over; then every group but the last, in
    order (``=`` counts as bad there); then the last group (padding place,
    length, padding count, unused bits).
    """
    values = _B64_VALUES
    n = len(data)
    rem = n % 4
    if rem == 1 and data[-1] != _PAD and data[-1] not in values:
        return f"Invalid symbol {data[-1]}, offset {n - 1}."
    body = max(n - rem - (4 if rem == 0 else 0), 0)
    offset = _first_non_symbol(data, body)
    if offset >= 0:
        return f"Invalid symbol {data[offset]}, offset {offset}."
    morsels: list[int] = []
    pads = first_pad = last = 0
    for k in range(body, n):
        byte = data[k]
        if byte == _PAD:
            if k - body < 2:
                return f"Invalid symbol {byte}, offset {k}."
            if not pads:
                first_pad = k
            pads += 1
            continue
        if pads:
            return f"Invalid symbol {_PAD}, offset {first_pad}."
        value = values.get(byte)
        if value is None:
            return f"Invalid symbol {byte}, offset {k}."
        last = byte
        morsels.append(value)
    if n and len(morsels) < 2:
        return f"Invalid input length: {body + len(morsels)}"
    if (pads + len(morsels)) % 4:
        return "Invalid padding"
    bits = 0
    for i, value in enumerate(morsels):
        bits |= value << (18 - 6 * i)
    if bits & (0xFFFFFF >> (len(morsels) * 6 // 8 * 8)):
        return f"Invalid last symbol {last}, offset {body + len(morsels) - 1}."
    return None


def _stray_bits(text: bytes | bytearray | memoryview, start: int, end: int) -> bool:
    """Whether padded base64 ``text[start:end]``, otherwise valid, sets bits its last
    symbol does not carry (``aR==`` for ``aQ==``): upstream refuses it; msgspec,
    ``binascii`` and libcrypto decode it."""
    if end - start < 4 or text[end - 1] != _PAD:
        return False
    if text[end - 2] == _PAD:
        return bool(_B64_VALUES.get(text[end - 3], 0) & 0x0F)
    return bool(_B64_VALUES.get(text[end - 2], 0) & 0x03)


def _invalid_base64(error: object) -> InvalidRequestError:
    """Upstream's -32600 for a ``dataBase64`` it would not decode, naming ``error``."""
    return InvalidRequestError(f"fs/writeFile requires valid base64 dataBase64: {error}")


def _not_json_text(exc: msgspec.DecodeError) -> InvalidRequestError:
    """Only a deferred span (:func:`decode_data_span`) reaches the decoder unchecked
    (the rest of its message was valid JSON): it is bad base64 all the same."""
    return _invalid_base64(exc)


def decode_data_base64(raw: msgspec.Raw) -> bytes:
    """Decode ``dataBase64`` straight from its raw JSON token (no intermediate ``str``).

    Raises:
        InvalidParamsError: the member is not a JSON string (-32602).
        InvalidRequestError: the string is not canonical padded standard base64
            (-32600, ``fs/writeFile requires valid base64 dataBase64: <error>``,
            upstream's wording).
    """
    refused: msgspec.ValidationError | None = None
    try:
        decoded = _bytes_decoder.decode(raw)
    except msgspec.ValidationError as exc:
        # Kept without its traceback, which holds this frame (and so the whole
        # text and its decoding, which this frame holds): a cycle only the
        # collector would free.
        refused = exc.with_traceback(None)
    except msgspec.DecodeError as exc:
        raise _not_json_text(exc) from exc
    else:
        token = memoryview(raw)
        if _BACKSLASH.search(token) is None and not _stray_bits(token, 1, len(token) - 1):
            return decoded
        # An escape hides the text's last characters, or its last symbol has stray
        # bits: judge the text itself.
    try:
        text = msgspec.json.decode(raw, type=str)
    except msgspec.ValidationError:
        raise InvalidParamsError(f"{refused} - at `$.dataBase64`") from refused
    except msgspec.DecodeError as exc:
        raise _not_json_text(exc) from exc
    data = text.encode("utf-8", "surrogatepass")
    error = _base64_error_text(data)
    if error is not None:
        raise _invalid_base64(error)
    if refused is None:
        return decoded
    return binascii.a2b_base64(data, strict_mode=True)  # valid by upstream's rules


def decode_data_span(span: StringSpan) -> bytes | memoryview:
    """Decode a big request's ``dataBase64`` where it lies in the message: natively
    (no GIL) when it is plain padded base64, else as :func:`decode_data_base64`."""
    data = native_base64.decode_strict(span.data, span.start, span.end)
    if data is not None and not _stray_bits(span.data, span.start, span.end):
        return data
    _refuse_plain_span(span)
    return decode_data_base64(msgspec.Raw(span.token()))


def _refuse_plain_span(span: StringSpan) -> None:
    """Raise upstream's error (-32600) for a big ``dataBase64`` libcrypto refused,
    judged where it lies in the message, a chunk at a time; return when the span
    holds a JSON escape or upstream would take it (the caller then judges the
    decoded text whole).

    Why: judging it whole (:func:`decode_data_base64`: copy the token, decode it
    twice, encode it) holds the GIL for a few hundred milliseconds per call on
    100 MiB, and every connection's event loop waits meanwhile: another
    client's ``getMetadata`` waited up to 432-813 ms during such a write, 40-47
    ms during a valid one. Chunked, the GIL is let go between chunks.
    """
    text = span.data
    if text.find(b"\\", span.start, span.end) >= 0:
        return  # an escape: the raw span is not the text
    error = _base64_error_text(memoryview(text)[span.start : span.end])
    if error is not None:
        raise _invalid_base64(error)


def data_span_payload(span: StringSpan) -> ops.Payload:
    """A big request's ``dataBase64`` as the writing worker needs it: decoded a piece
    at a time as it is written (natively, no GIL) when it is plain padded base64,
    so the worker holds the text and one piece rather than the text and all its
    bytes; else whole, as :func:`decode_data_span` decodes it. A piece libcrypto
    refuses sends the write back to :func:`decode_data_base64`, which names the
    error as upstream does (and the temp file written so far is dropped)."""
    pieces = native_base64.decode_pieces(span.data, span.start, span.end, native_base64.PIECE)
    if pieces is None or _stray_bits(span.data, span.start, span.end):
        return decode_data_span(span)

    def decoded(run_pair: ops.RunTasks | None = None) -> Iterator[memoryview]:
        try:
            yield from pieces(run_pair)
        except native_base64.Undecodable:
            _refuse_plain_span(span)
            raise ops.WriteInstead(decode_data_base64(msgspec.Raw(span.token()))) from None

    text = span.data
    pad = (text[span.end - 1] == _PAD) + (text[span.end - 2] == _PAD) if len(span) else 0
    return ops.Pieces(len(span) // 4 * 3 - pad, decoded, decoded)


def encode_read_reply(request_id: RequestId, data: bytes) -> EncodedReply:
    """The whole reply to a big ``fs/readFile``, made in the worker that read the file:
    its base64 text is written once, straight into the reply (see :class:`EncodedReply`),
    by libcrypto without the GIL when it can be (see ``native_base64.encode_into``)."""
    if not native_base64.encoder_available():
        return encode_reply(request_id, t.ReadFileResult(data_base64=data))
    return encode_reply_filled(
        request_id,
        t.ReadFileResult(data_base64=b""),
        native_base64.encoded_length(len(data)),
        functools.partial(native_base64.encode_into, data),
    )


class _Resized(Exception):
    """The file is no longer as long as its ``fstat`` said."""


def read_into_reply(request_id: RequestId, fd: int, size: int) -> EncodedReply:
    """The whole reply to a big ``fs/readFile`` of regular file ``fd`` (``size`` bytes by
    its ``fstat``), made in the worker: the file is read straight into the reply's
    buffer, behind where its text goes, and turned into that text in place
    (``native_base64.encode_tail_in_place``), so the worker holds the reply alone,
    not the file and the reply (a 64 MiB read: 85 MiB, not 149). A file that
    changed size since its ``fstat`` is read again from the start and encoded
    as :func:`encode_read_reply` does. Closes ``fd``."""
    try:
        if native_base64.encoder_available():

            def fill(buffer: bytearray, at: int) -> None:
                tail = at + native_base64.encoded_length(size) - size
                target = memoryview(buffer)[tail : tail + size]
                try:
                    whole = ops.read_exactly(fd, target)
                finally:
                    target.release()  # the buffer is resized afterwards
                if not whole:
                    raise _Resized
                native_base64.encode_tail_in_place(buffer, at, size)

            try:
                return encode_reply_filled(
                    request_id,
                    t.ReadFileResult(data_base64=b""),
                    native_base64.encoded_length(size),
                    fill,
                )
            except _Resized:
                pass
        return encode_read_reply(request_id, ops.read_from_start(fd))
    finally:
        os.close(fd)


def receive_into_reply(
    request_id: RequestId, size: int
) -> tuple[memoryview, Callable[[], EncodedReply]]:
    """The reply to a big confined ``fs/readFile`` of ``size`` bytes, made before they
    arrive: where to receive them (the back of the reply's buffer, behind where
    their text goes) and the function, for a worker, that turns them into that
    text in place. As :func:`read_into_reply` for files the server reads: the
    reply is all there is at the peak, not the file and the reply (a 32 MiB
    read under a restricted read policy: 74 MiB over idle before)."""
    text = native_base64.encoded_length(size)
    reply = ReplyToFill(request_id, t.ReadFileResult(data_base64=b""), text)
    tail = reply.at + reply.length - size
    view = memoryview(reply.buffer)[tail : tail + size]

    def finish() -> EncodedReply:
        view.release()  # the buffer is resized by done()
        native_base64.encode_tail_in_place(reply.buffer, reply.at, size)
        return reply.done()

    return view, finish


async def read_file(
    ctx: RequestContext, params: t.ReadFileParams
) -> t.ReadFileResult | EncodedReply:
    path = parse_wire_path(params.path)
    if params.follow_symlinks is False:
        service = _service(ctx)
        data = await service.read_file_no_follow(path.path, await _route(ctx, params.sandbox))
        if len(data) > INLINE_CODEC_LIMIT:
            return await service.pool.run(encode_read_reply, ctx.request_id, data)
        return t.ReadFileResult(data_base64=data)
    native = native_base64.encoder_available()
    result = await _service(ctx).read_file_mapped(
        path.path,
        functools.partial(encode_read_reply, ctx.request_id),
        INLINE_CODEC_LIMIT,
        await _route(ctx, params.sandbox),
        regular_only=path.form is PathForm.URI,
        read_large=functools.partial(read_into_reply, ctx.request_id),
        receive_large=functools.partial(receive_into_reply, ctx.request_id) if native else None,
    )
    if isinstance(result, bytes):
        return t.ReadFileResult(data_base64=result)
    return result


async def write_file(
    ctx: RequestContext,
    params: t.WriteFileParams | t.WriteFileParamsSpan,
) -> t.EmptyResult:
    path = parse_wire_path(params.path)
    route = await _route(ctx, params.sandbox)
    service = _service(ctx)
    raw = params.data_base64
    if params.follow_symlinks is False:
        produce = (
            functools.partial(data_span_payload, raw)
            if isinstance(raw, StringSpan)
            else functools.partial(decode_data_base64, raw)
        )
        call = NoFollowCall(t.METHOD_WRITE_FILE, path.path, produce=produce)
        await service.no_follow(call, route)
        return t.EmptyResult()
    if isinstance(raw, StringSpan):
        await service.write_file_from(path.path, functools.partial(data_span_payload, raw), route)
    elif len(raw) <= INLINE_CODEC_LIMIT:
        await service.write_file(path.path, decode_data_base64(raw), route)
    else:
        # Decoded in the worker that writes: one thread hand-off, not two.
        await service.write_file_from(path.path, functools.partial(decode_data_base64, raw), route)
    return t.EmptyResult()


async def create_directory(ctx: RequestContext, params: t.CreateDirectoryParams) -> t.EmptyResult:
    path = parse_wire_path(params.path)
    recursive = True if params.recursive is None else params.recursive
    route = await _route(ctx, params.sandbox)
    if params.follow_symlinks is False:
        call = NoFollowCall(t.METHOD_CREATE_DIRECTORY, path.path, recursive=recursive)
        await _service(ctx).no_follow(call, route)
    else:
        await _service(ctx).create_directory(path.path, route, recursive=recursive)
    return t.EmptyResult()


async def get_metadata(ctx: RequestContext, params: t.GetMetadataParams) -> t.GetMetadataResult:
    path = parse_wire_path(params.path)
    route = await _route(ctx, params.sandbox)
    if params.follow_symlinks is False:
        meta = await _service(ctx).get_metadata_no_follow(path.path, route)
    else:
        meta = await _service(ctx).get_metadata(path.path, route)
    return _metadata_result(path, meta)


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
    entries = await _service(ctx).read_directory(path.path, await _route(ctx, params.sandbox))
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
    route = await _route(ctx, params.sandbox)
    recursive = True if params.recursive is None else params.recursive
    force = True if params.force is None else params.force
    if params.follow_symlinks is False:
        call = NoFollowCall(t.METHOD_REMOVE, path.path, recursive=recursive, force=force)
        await _service(ctx).no_follow(call, route)
    else:
        await _service(ctx).remove(path.path, route, recursive=recursive, force=force)
    return t.EmptyResult()


async def copy(ctx: RequestContext, params: t.CopyParams) -> t.EmptyResult:
    source = parse_wire_path(params.source_path)
    destination = parse_wire_path(params.destination_path)
    await _service(ctx).copy(
        source.path, destination.path, await _route(ctx, params.sandbox), recursive=params.recursive
    )
    return t.EmptyResult()


async def canonicalize(ctx: RequestContext, params: t.CanonicalizeParams) -> t.CanonicalizeResult:
    path = parse_wire_path(params.path)
    resolved = await _service(ctx).canonicalize(path.path, await _route(ctx, params.sandbox))
    if path.form is PathForm.PLAIN:
        resolved = lossy_name(resolved)  # JSON strings cannot carry raw bytes
    return t.CanonicalizeResult(path=path.render(resolved))


async def walk(ctx: RequestContext, params: t.WalkParams) -> t.WalkResult:
    path = parse_wire_path(params.path)
    o = params.options
    options = WalkOptions(
        max_depth=o.max_depth,
        max_directories=o.max_directories,
        max_entries=o.max_entries,
        follow_directory_symlinks=o.follow_directory_symlinks,
        prune_hidden_directories=o.prune_hidden_directories,
    )
    service = _service(ctx)
    outcome = await service.walk(path.path, options, await _route(ctx, params.sandbox))
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

    quote = _uri_name if form is PathForm.URI else lossy_name
    entries = [
        t.WalkEntry(path=under(d) + quote(n), kind="directory" if is_dir else "file")
        for d, n, is_dir in outcome.entries
    ]
    errors = [
        t.WalkError(path=under(d) + quote(n) if n else render_path(d, form), message=m)
        for d, n, m in outcome.errors
    ]
    return t.WalkResult(entries=entries, errors=errors, truncated=outcome.truncated)


_URI_PLAIN_NAME: Final = re.compile(r"[A-Za-z0-9._~:@=,;!$&'()*+\[\]^|-]*\Z")


def _uri_name(name: str) -> str:
    """One path component as it appears in a ``file://`` URI (percent-escapes as
    :func:`exec_server.protocol.paths.render_path` writes them)."""
    if _URI_PLAIN_NAME.match(name):
        return name
    return urllib.parse.quote(name, safe=_URI_NAME_SAFE, errors="surrogateescape")


_URI_NAME_SAFE: Final = ":@=,;!$&'()*+[]^|~"


def register(router: Router) -> None:
    """Add every ``fs/*`` method (family ``filesystem``, PROTOCOL.md §4.3)."""
    # Big writes: base64 decoded natively in the writing worker when it can be.
    if native_base64.available():
        register_deferred_string(
            t.METHOD_WRITE_FILE,
            "dataBase64",
            t.WriteFileParamsHead,
            t.WriteFileParamsSpan.from_head,
        )
    router.add(t.METHOD_READ_FILE, t.ReadFileParams, read_file, "filesystem")
    router.add(t.METHOD_WRITE_FILE, t.WriteFileParams, write_file, "filesystem")
    router.add(
        t.METHOD_CREATE_DIRECTORY,
        t.CreateDirectoryParams,
        create_directory,
        "filesystem",
    )
    router.add(t.METHOD_GET_METADATA, t.GetMetadataParams, get_metadata, "filesystem")
    router.add(
        t.METHOD_READ_DIRECTORY,
        t.ReadDirectoryParams,
        read_directory,
        "filesystem",
    )
    router.add(t.METHOD_REMOVE, t.RemoveParams, remove, "filesystem")
    router.add(t.METHOD_COPY, t.CopyParams, copy, "filesystem")
    router.add(t.METHOD_CANONICALIZE, t.CanonicalizeParams, canonicalize, "filesystem")
    router.add(t.METHOD_WALK, t.WalkParams, walk, "filesystem")
