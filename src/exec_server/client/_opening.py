"""Results that are awaited or used directly in ``async with`` (``connect()``, ``open()``)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Generic, ParamSpec, Self, TypeVar

__all__ = ["AsyncClosing", "Opening", "opening"]


class AsyncClosing:
    """A base for what ``async with obj:`` closes at the end."""

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


T = TypeVar("T", bound=AsyncClosing)
P = ParamSpec("P")


class Opening(Generic[T]):
    """Await it for the object, or use it as ``async with ... as obj`` (closed at the end);
    the coroutine is made only when awaited or entered, so an unused one warns of nothing."""

    def __init__(self, start: Callable[[], Coroutine[Any, Any, T]]) -> None:
        self._start = start
        self._value: T | None = None

    def __await__(self) -> Generator[Any, None, T]:
        return self._start().__await__()

    async def __aenter__(self) -> T:
        self._value = await self._start()
        return self._value

    async def __aexit__(self, *exc: object) -> None:
        if self._value is not None:
            await self._value.aclose()


def opening(fn: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Opening[T]]:
    """Make an ``async def`` factory return an :class:`Opening`."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Opening[T]:
        return Opening(functools.partial(fn, *args, **kwargs))

    return wrapper
