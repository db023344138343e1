"""Validate an outgoing request as upstream does, in its order (PROTOCOL_CURRENT.md §9.1,
§9.4, §9.6): method, URL, scheme, then each header (name, environment variable, value).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from exec_server.http.errors import HttpRequestInvalid

__all__ = ["DENIED_ENV_VARS", "HeaderSpec", "HttpRequest", "build_request"]

#: Credentials of the executor that a header may never carry (case-insensitive):
#: upstream 0.163's list.
DENIED_ENV_VARS: Final = frozenset(
    {
        "CODEX_EXEC_SERVER_NOISE_AUTH_TOKEN",
        "OPENAI_FEDERATION_RULE_ID",
        "OPENAI_IDENTITY_TOKEN_FILE",
        "OPENAI_WORKLOAD_IDENTITY_CONTEXT",
        "OPENAI_API_KEY",
        "CODEX_API_KEY",
        "CODEX_ACCESS_TOKEN",
        "CODEX_CONNECTORS_TOKEN",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AZURE_CLIENT_SECRET",
        "AZURE_FEDERATED_TOKEN_FILE",
        "GOOGLE_APPLICATION_CREDENTIALS",
    }
)

#: RFC 9110 ``token``: what a method and a header name may be made of.
_TOKEN: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_SCHEME: Final = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):")
#: the URL standard's forbidden domain code points (a space, controls...).
_FORBIDDEN_HOST: Final = frozenset(" \t\n\r#/:<>?@[\\]^|\x7f" + "".join(map(chr, range(0x20))))
#: leading/trailing C0 controls and spaces, which the URL standard strips.
_URL_TRIM: Final = "".join(chr(c) for c in range(0x21))


@dataclass(frozen=True, slots=True)
class HeaderSpec:
    """One requested header; ``value_env_var`` appends that executor variable's value."""

    name: str
    value: str
    value_env_var: str | None = None


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """A validated request. ``headers`` keep the caller's order and repeats;
    ``timeout``: total seconds (connect, head and body)."""

    method: str
    url: str
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes | None
    timeout: float | None
    follow_redirects: bool


def _check_url(url: str) -> str:
    text = url.strip(_URL_TRIM)
    match = _SCHEME.match(text)
    if match is None:
        raise HttpRequestInvalid("http/request url is invalid: relative URL without a base")
    scheme = match.group(1).lower()
    if scheme not in ("http", "https"):
        raise HttpRequestInvalid(f"http/request only supports http and https URLs, got {scheme}")
    rest = text[match.end() :].lstrip("/\\")
    authority = re.split(r"[/\\?#]", rest, maxsplit=1)[0]
    host_port = authority.rpartition("@")[2]
    if not host_port or host_port.startswith(":"):
        raise HttpRequestInvalid("http/request url is invalid: empty host")
    host = host_port if host_port.startswith("[") else host_port.rpartition(":")[0] or host_port
    if not host.startswith("[") and any(c in _FORBIDDEN_HOST for c in host):
        raise HttpRequestInvalid("http/request url is invalid: invalid international domain name")
    import httpx  # lazily: a server that never sends HTTP does not pay for it

    try:
        httpx.URL(text)
    except httpx.InvalidURL as exc:
        raise HttpRequestInvalid(f"http/request url is invalid: {exc}") from None
    return text


def _header(spec: HeaderSpec, environ: Mapping[str, str]) -> tuple[bytes, bytes]:
    name = spec.name
    if _TOKEN.fullmatch(name) is None:
        raise HttpRequestInvalid("http/request header name is invalid: invalid HTTP header name")
    value = spec.value
    var = spec.value_env_var
    if var is not None:
        if var.upper() in DENIED_ENV_VARS:
            raise HttpRequestInvalid(
                f"http/request header {name} cannot use executor environment variable {var}"
            )
        found = environ.get(var) if var else None
        if found is None:
            raise HttpRequestInvalid(
                f"http/request header {name} requires executor environment variable {var}"
            )
        if not found:
            raise HttpRequestInvalid(
                f"http/request header {name} requires a non-empty executor environment "
                f"variable {var}"
            )
        value += found
    raw = value.encode("utf-8", "surrogateescape")
    # ``http::HeaderValue``'s rule: visible bytes, space, tab and obs-text
    if not all((b >= 0x20 and b != 0x7F) or b == 0x09 for b in raw):
        raise HttpRequestInvalid(
            f"http/request header value is invalid for {name}: failed to parse header value"
        )
    return name.lower().encode("ascii"), raw


def build_request(
    method: str,
    url: str,
    headers: Sequence[HeaderSpec],
    body: bytes | None,
    timeout_ms: int | None,
    follow_redirects: bool,
    environ: Mapping[str, str],
) -> HttpRequest:
    """HttpRequestInvalid: upstream's text for the first check that fails."""
    if _TOKEN.fullmatch(method) is None:
        raise HttpRequestInvalid("http/request method is invalid: invalid HTTP method")
    checked_url = _check_url(url)
    resolved = tuple(_header(spec, environ) for spec in headers)
    timeout = None if timeout_ms is None else timeout_ms / 1000
    return HttpRequest(method, checked_url, resolved, body, timeout, follow_redirects)
