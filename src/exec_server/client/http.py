"""``http_request``'s response type and error texts, shared by the local and remote
backends so both answer alike (upstream's texts)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Final, TypeAlias, TypedDict

from exec_server.client._opening import AsyncClosing
from exec_server.exceptions import InternalError
from exec_server.protocol.types.http import RequestHeader

__all__ = ["HeaderArg", "HttpOptions", "HttpResponse", "body_failed", "request_headers"]

#: a header to send: ``(name, value)``, or a :class:`RequestHeader` (``value_env_var``
#: appends that variable of the executor's environment).
HeaderArg: TypeAlias = RequestHeader | tuple[str, str]

_BODY_FAILED: Final = "failed to read http/request response body: "


def body_failed(cause: str) -> InternalError:
    return InternalError(_BODY_FAILED + cause)


def request_headers(headers: Sequence[HeaderArg]) -> list[RequestHeader]:
    return [h if isinstance(h, RequestHeader) else RequestHeader(h[0], h[1]) for h in headers]


class HttpOptions(TypedDict, total=False):
    """``http_request``'s keyword options, as the backends pass them through."""

    headers: Sequence[HeaderArg]
    body: bytes | None
    timeout_ms: int | None
    follow_redirects: bool
    stream: bool


class HttpResponse(AsyncClosing):
    """A response: ``status``; ``headers``, ``(name, value)`` pairs in order, names in
    lower case; ``body`` when buffered (``b""`` when streamed: iterate or :meth:`read`)."""

    def __init__(
        self,
        status: int,
        headers: list[tuple[str, str]],
        body: bytes = b"",
        *,
        chunks: AsyncIterator[bytes] | None = None,
        close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self._chunks = chunks
        self._close = close

    def header_values(self, name: str) -> list[str]:
        """Every value of header ``name`` (case-insensitive), in order."""
        lower = name.lower()
        return [value for key, value in self.headers if key == lower]

    def __aiter__(self) -> AsyncIterator[bytes]:
        """The body's pieces as they arrive; ``InternalError`` if it broke off."""
        return self._buffered() if self._chunks is None else self._chunks

    async def _buffered(self) -> AsyncIterator[bytes]:
        if self.body:
            yield self.body

    async def read(self) -> bytes:
        if self._chunks is None:
            return self.body
        return b"".join([chunk async for chunk in self._chunks])

    async def aclose(self) -> None:
        """Stop reading a streamed body (the rest is dropped)."""
        if self._close is not None:
            await self._close()
