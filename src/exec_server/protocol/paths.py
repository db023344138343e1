"""Path fields on the wire: plain absolute strings (legacy) or ``file://`` URIs (current),
accepted in every path field, answered in the request's form (CLIENT_COMPAT.md §1.2-§1.3),
normalised lexically, before symlinks (PROTOCOL.md §5.2)."""

from __future__ import annotations

import encodings.idna
import enum
import re
import sys
import urllib.parse

import msgspec

from exec_server.exceptions import InvalidParamsError, InvalidRequestError

__all__ = [
    "PathForm",
    "WirePath",
    "normalize_lexical",
    "parse_wire_path",
    "render_path",
    "uri_quote",
]

_URI_SAFE = "/:@=,;!$&'()*+[]^|~"


class PathForm(enum.Enum):
    """How a client spelled a path, and so how we answer."""

    PLAIN = "plain"
    URI = "uri"


class WirePath(msgspec.Struct, frozen=True, gc=False):
    """A decoded, normalised absolute path and the form it arrived in (a Struct: one
    is made per request, cheaper than a frozen dataclass)."""

    path: str
    form: PathForm

    def render(self, path: str | None = None) -> str:
        return render_path(self.path if path is None else path, self.form)


def normalize_lexical(path: str) -> str:
    """Drop ``.`` and empty segments, let ``..`` pop the previous one: the project's one
    lexical normaliser (PROTOCOL.md §5.2, APPLY_PATCH.md §6); the result is rooted."""
    if (
        path.startswith("/")
        and "//" not in path
        and "/." not in path
        and (not path.endswith("/") or path == "/")
    ):
        return path  # already normal (the common case): no split and join
    out: list[str] = []
    for part in path.split("/"):
        if part == "..":
            if out:
                out.pop()
        elif part not in ("", "."):
            out.append(part)
    return "/" + "/".join(out)


#: What the URL standard strips from both ends of a URL (C0 controls and space).
_C0_OR_SPACE = "".join(map(chr, range(0x21)))
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def _parse_uri(value: str) -> str:
    """The path of a ``file:`` URL, read as upstream's parser (the URL standard) does:
    tabs and newlines dropped, ``\\`` a ``/``, ``file:a`` and ``file://`` rooted."""
    value = value.replace("\t", "").replace("\n", "").replace("\r", "").replace("\\", "/")
    try:
        parsed = urllib.parse.urlsplit(value)
    except ValueError:  # an unclosed `[`: the only way splitting fails
        raise InvalidParamsError("invalid URI: invalid IPv6 address") from None
    scheme = parsed.scheme.lower()
    if scheme != "file":
        raise InvalidParamsError(f"unsupported path URI scheme `{scheme}`")
    if parsed.query or value.rstrip().endswith("?"):
        raise InvalidParamsError("query parameters are not allowed in path URIs")
    if parsed.fragment or "#" in value:
        raise InvalidParamsError("fragments are not allowed in path URIs")
    host = parsed.netloc
    if "@" in host or (":" in host and not host.startswith("[")):
        # user info or a port: a file URL has neither (the url crate's wording)
        raise InvalidParamsError(_BAD_HOST)
    if host and (domain := _domain(host)) != "localhost":
        # Upstream names the URL as its parser wrote it back: the host's ASCII form.
        shown = f"file://{domain}{parsed.path}"
        raise InvalidRequestError(f"'{shown}' is invalid on '{sys.platform}'")
    raw = parsed.path
    if "//" in raw:
        raw = _resolve_dot_segments(raw)
    path = urllib.parse.unquote(raw, errors="surrogateescape")
    return path if path.startswith("/") else "/" + path


_BAD_HOST = "invalid URI: invalid international domain name"
#: What the URL standard forbids in a domain once it is decoded and mapped.
_FORBIDDEN_IN_DOMAIN = frozenset(_C0_OR_SPACE + "#/:<>?@[\\]^|%\x7f")
_DOUBLE_DOT = frozenset(("..", ".%2e", "%2e.", "%2e%2e"))
_DOTS = _DOUBLE_DOT | {".", "%2e"}


def _domain(host: str) -> str:
    """A file URL's host as the URL standard reads it: percent-decoded, each label
    mapped to ASCII as IDNA does (so ``LOCAL%48OST`` is ``localhost``), empty labels
    kept; an IPv6 literal as written. InvalidParamsError when it is no domain."""
    if host.startswith("["):
        return host
    try:
        decoded = urllib.parse.unquote_to_bytes(host).decode("utf-8")
        labels = [_ascii_label(label) for label in decoded.split(".")]
    except UnicodeError:
        raise InvalidParamsError(_BAD_HOST) from None
    ascii_form = ".".join(labels)
    if not ascii_form or _FORBIDDEN_IN_DOMAIN.intersection(ascii_form):
        raise InvalidParamsError(_BAD_HOST)
    return ascii_form


def _ascii_label(label: str) -> str:
    if label.isascii():
        # no length limit, unlike IDNA 2003's ToASCII
        ascii_label = label.lower()
    else:
        ascii_label = encodings.idna.ToASCII(label).decode("ascii").lower()
    if ascii_label.startswith("xn--"):
        # An encoded label must decode to a label that encodes back to it.
        decoded = ascii_label[4:].encode("ascii").decode("punycode")
        if not decoded or encodings.idna.ToASCII(decoded).decode("ascii").lower() != ascii_label:
            raise UnicodeError("not a valid punycode label")
    return ascii_label


def _resolve_dot_segments(raw: str) -> str:
    """A URL path's ``.``/``..`` segments (also ``%2e``) applied as the URL standard
    does, where an empty segment counts: ``/d//../f`` is ``/d/f``, not ``/f`` (so it is
    called only for paths with an empty segment)."""
    segments = raw.split("/")[1:] if raw.startswith("/") else raw.split("/")
    out: list[str] = []
    last = len(segments) - 1
    for i, segment in enumerate(segments):
        folded = segment.lower()
        if folded in _DOUBLE_DOT and out:
            out.pop()
        if folded not in _DOTS:
            out.append(segment)
        elif i == last:
            out.append("")  # `a/..` and `a/.` end with a slash
    return "/" + "/".join(out)


def parse_wire_path(value: str, *, normalize: bool = True) -> WirePath:
    """Decode one path field (``normalize=False``: keep ``..``, still absolute);
    InvalidParamsError if not absolute or a bad URI, InvalidRequestError for another host."""
    path, form = value, PathForm.PLAIN
    if not value.startswith("/"):
        text = value.strip(_C0_OR_SPACE)
        if text[:5].lower() == "file:":
            path, form = _parse_uri(text), PathForm.URI
        elif scheme := _SCHEME.match(text):
            raise InvalidParamsError(f"unsupported path URI scheme `{scheme[0][:-1].lower()}`")
    if "\x00" in path:
        if form is PathForm.URI:  # upstream's words (a NUL cannot be a file path)
            raise InvalidParamsError(f"'{value}' is invalid on '{sys.platform}'")
        raise InvalidParamsError("path must not contain NUL bytes")
    if not path.startswith("/"):
        raise InvalidParamsError("path must be absolute")
    return WirePath(normalize_lexical(path) if normalize else path, form)


def render_path(path: str, form: PathForm) -> str:
    return path if form is PathForm.PLAIN else "file://" + uri_quote(path)


def uri_quote(path: str) -> str:
    """``path`` (or one name) percent-escaped as it stands in a ``file://`` URI."""
    return urllib.parse.quote(path, safe=_URI_SAFE, errors="surrogateescape")
