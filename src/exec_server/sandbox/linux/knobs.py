"""Global kernel knobs (``/proc/sys`` & co., read-only under Docker too) a sandboxed command
must never write: their check is the file mode against the global root uid, so (mapped)
root without capabilities still writes them. Stdlib only: the launcher imports it."""

import os

__all__ = ["KERNEL_KNOBS", "PROC_KNOBS", "first_missing_component", "is_inside", "placeholder_for",
           "read_only_knobs"]

#: knobs inside ``/proc`` (a freshly mounted ``/proc`` has them writable).
PROC_KNOBS = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs")
KERNEL_KNOBS = (*PROC_KNOBS, "/sys")


def is_inside(path: str, root: str) -> bool:
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


def first_missing_component(path: str) -> "str | None":
    """The shallowest missing path on the way to ``path``; None if it exists."""
    if os.path.lexists(path):
        return None
    missing = path
    parent = os.path.dirname(path)
    while parent != missing and not os.path.lexists(parent):
        missing = parent
        parent = os.path.dirname(parent)
    return missing


def placeholder_for(path: str, writable_roots: "list[str] | tuple[str, ...]") -> "str | None":
    """Where a missing protected ``path`` gets its read-only placeholder mount: its first
    missing component, if strictly inside a writable root (elsewhere nothing can create it)."""
    missing = first_missing_component(path)
    if missing is not None and any(is_inside(missing, r) and missing != r for r in writable_roots):
        return missing
    return None


def read_only_knobs(*, full_write: bool, writable_roots: "list[str] | tuple[str, ...]",
                    fresh_proc: bool = False) -> "list[str]":
    """Existing paths to bind read-only, shallowest first: a knob under a writable root whole,
    a writable root inside a knob itself; ``fresh_proc``: every ``/proc`` knob too."""
    roots = ["/"] if full_write else list(writable_roots)
    found: list[str] = []
    for knob in KERNEL_KNOBS:
        if (fresh_proc and knob in PROC_KNOBS) or any(is_inside(knob, r) for r in roots):
            found.append(knob)
            continue
        found += [r for r in roots if is_inside(r, knob)]
    out = []
    for path in dict.fromkeys(found):
        if os.path.lexists(path) and not any(is_inside(path, p) and path != p for p in found):
            out.append(path)
    return sorted(out, key=lambda p: p.count("/"))
