"""Settle the interpreter's heap once the server is up, before it serves anyone.

Why freeze: the imports leave ~27k long-lived objects in the garbage
collector's oldest generation, and every full collection walks them all. In
a ``bench_fs.py`` run the server made three full collections that stalled
the event loop for up to 9.9 ms each (27.7 ms in all); with those objects
moved to the permanent generation (``gc.freeze``) the same three took at
most 0.99 ms (1.9 ms in all). What the server allocates later is collected
as before.

Why trim: import-time temporaries are freed by then; ``malloc_trim`` hands
their pages back to the OS, so the server idles at a smaller RSS (glibc
only, best effort).

Later, :func:`release_freed_memory` trims again after each big transfer
(a message or reply of tens of MiB). glibc sometimes serves a big block a
worker thread asks for from that thread's own heap, not a mapping of its
own, and once freed it stays resident for as long as something allocated
above it lives: 42 MiB after one 32 MiB ``readFile`` in about one run in
ten. ``malloc_trim`` returns the free pages of every heap.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from collections.abc import Callable
from typing import Final, cast

__all__ = ["release_freed_memory", "settle_startup_heap"]


def _load_malloc_trim() -> Callable[[int], int] | None:
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    fn.argtypes = (ctypes.c_size_t,)
    fn.restype = ctypes.c_int
    return cast("Callable[[int], int]", fn)


_malloc_trim: Final = _load_malloc_trim()


def release_freed_memory() -> None:
    """Hand the free pages of every malloc heap back to the OS (glibc; else nothing)."""
    if _malloc_trim is not None:
        _malloc_trim(0)


def settle_startup_heap() -> None:
    """Collect start-up garbage, freeze what survives, return freed memory to the OS."""
    gc.collect()
    gc.freeze()
    release_freed_memory()
