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
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc

__all__ = ["settle_startup_heap"]


def settle_startup_heap() -> None:
    """Collect start-up garbage, freeze what survives, return freed memory to the OS."""
    gc.collect()
    gc.freeze()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass
