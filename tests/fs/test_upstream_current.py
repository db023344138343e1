"""Side by side with upstream 0.163: ``fs/walk``, ``followSymlinks: false`` and file handles.

As ``test_upstream_fs.py``: each case runs against both servers in its own fresh
directory with the same layout; a case is a sequence of requests whose answers
(the directory written as ``<T>``, times masked) and the tree left behind must
be equal. Skipped when upstream's binary is not installed.

Masked on purpose (docs/compat.md): ``createdAtMs`` (ours reports 0 on Linux,
upstream's no-follow ``getMetadata`` the birth time).
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from exec_server.client.sandbox_contexts import to_wire, workspace_write

pytestmark = pytest.mark.upstream


def walk_tree(root: Path) -> None:
    """The spec's §6.2 example tree, under ``root/w``, plus ``root/outside``."""
    w = root / "w"
    (w / ".hid").mkdir(parents=True)
    (w / "a" / "deep").mkdir(parents=True)
    (w / "empty").mkdir()
    (root / "outside").mkdir()
    for name in (".hf", ".hid/h.txt", "a/a1.txt", "a/deep/d.txt", "b.txt"):
        (w / name).write_text(name)
    (root / "outside" / "o.txt").write_text("o")
    (w / "ldir").symlink_to("a")
    (w / "lfile").symlink_to("b.txt")
    (w / "lout").symlink_to("../outside")
    (w / "dangling").symlink_to("missing")
    os.mkfifo(w / "fifo")
    (w / "a" / "deep" / "up").symlink_to("../..")
    (w / "a" / "loop").symlink_to("loop")


def link_tree(root: Path) -> None:
    """``root/{real/{f.txt, sub/}, lreal→real, real/lf→f.txt, real/lsub→sub,
    dangling→nowhere, file.txt}``."""
    (root / "real" / "sub").mkdir(parents=True)
    (root / "real" / "f.txt").write_text("contents")
    (root / "file.txt").write_text("plain")
    (root / "lreal").symlink_to("real")
    (root / "real" / "lf").symlink_to("f.txt")
    (root / "real" / "lsub").symlink_to("sub")
    (root / "dangling").symlink_to("nowhere")


def handle_tree(root: Path) -> None:
    (root / "f").write_bytes(b"0123456789")
    (root / "d").mkdir()
    os.mkfifo(root / "fifo")
    (root / "l").symlink_to("f")


def sandbox_tree(root: Path) -> None:
    """A workspace ``root/ws`` (with ``.git``) and ``root/outside``; a 0444 file."""
    (root / "ws").mkdir()
    handle_tree(root / "ws")
    (root / "ws" / ".git").mkdir()
    (root / "ws" / "ro").write_bytes(b"read-only")
    (root / "ws" / "ro").chmod(0o444)
    (root / "ws" / "sub" / "deeper").mkdir(parents=True)
    (root / "ws" / "sub" / "deeper" / "x.txt").write_text("x")
    (root / "outside").mkdir()
    (root / "outside" / "o.txt").write_text("o")
    (root / "ws" / "sub" / "lout").symlink_to("../../outside")
    (root / "ws" / "sub" / "lin").symlink_to("deeper")


def options(**kw: Any) -> dict[str, Any]:
    base = {
        "maxDepth": 10,
        "maxDirectories": 100,
        "maxEntries": 100,
        "followDirectorySymlinks": False,
        "pruneHiddenDirectories": False,
    }
    base.update(kw)
    return base


def walk(path: str, **kw: Any) -> tuple[str, dict[str, Any]]:
    return ("fs/walk", {"path": path, "options": options(**kw)})


def nf(method: str, path: str, **kw: Any) -> tuple[str, dict[str, Any]]:
    return (method, {"path": path, "followSymlinks": False, **kw})


B64 = base64.b64encode(b"changed").decode()
#: replaced by a workspace-write context for ``{U}/ws`` that reads only the workspace
#: and the system's minimal set, so both servers run these calls in their helpers
S = "{S}"

Step = tuple[str, dict[str, Any]]
CASES: list[tuple[str, Callable[[Path], None], list[Step]]] = [
    ("walk no follow", walk_tree, [walk("{U}/w")]),
    ("walk follow", walk_tree, [walk("{U}/w", followDirectorySymlinks=True)]),
    ("walk prune", walk_tree, [walk("{U}/w", pruneHiddenDirectories=True)]),
    ("walk entries", walk_tree, [walk("{U}/w", maxEntries=3), walk("{U}/w", maxEntries=9),
                                 walk("{U}/w", maxEntries=10)]),
    ("walk directories", walk_tree, [walk("{U}/w", maxDirectories=1),
                                     walk("{U}/w", maxDirectories=2)]),
    ("walk depth", walk_tree, [walk("{U}/w", maxDepth=0), walk("{U}/w", maxDepth=1)]),
    ("walk roots", walk_tree, [walk("{U}/w/b.txt"), walk("{U}/w/ldir"), walk("{U}/missing"),
                               walk("{U}/w/ldir", followDirectorySymlinks=True),
                               walk("{U}/w/dangling")]),
    ("walk limits", walk_tree, [walk("{U}/missing", maxDirectories=0),
                                walk("{U}/missing", maxEntries=0),
                                walk("{U}/missing", maxDepth=65),
                                walk("{U}/w", maxDepth=64, maxDirectories=10000,
                                     maxEntries=50000)]),
    ("no-follow metadata", link_tree, [
        nf("fs/getMetadata", "{U}/real/f.txt"), nf("fs/getMetadata", "{U}/real/lf"),
        nf("fs/getMetadata", "{U}/lreal/f.txt"), nf("fs/getMetadata", "{U}/dangling"),
        nf("fs/getMetadata", "{U}/real/sub"), nf("fs/getMetadata", "{U}/missing")]),
    ("no-follow read", link_tree, [
        nf("fs/readFile", "{U}/real/f.txt"), nf("fs/readFile", "{U}/real/lf"),
        nf("fs/readFile", "{U}/lreal/f.txt"), nf("fs/readFile", "{U}/dangling"),
        nf("fs/readFile", "{U}/real/sub"), nf("fs/readFile", "{U}/missing")]),
    ("no-follow write", link_tree, [
        nf("fs/writeFile", "{U}/real/lf", dataBase64=B64),
        nf("fs/writeFile", "{U}/lreal/f.txt", dataBase64=B64),
        nf("fs/writeFile", "{U}/lreal/new.txt", dataBase64=B64),
        nf("fs/writeFile", "{U}/dangling", dataBase64=B64),
        nf("fs/writeFile", "{U}/real/new.txt", dataBase64=B64),
        nf("fs/writeFile", "{U}/file.txt", dataBase64=B64)]),
    ("no-follow mkdir", link_tree, [
        nf("fs/createDirectory", "{U}/real/lsub"),
        nf("fs/createDirectory", "{U}/real/lsub", recursive=False),
        nf("fs/createDirectory", "{U}/lreal/x/y"),
        nf("fs/createDirectory", "{U}/real/x/y"),
        nf("fs/createDirectory", "{U}/real/sub", recursive=False),
        nf("fs/createDirectory", "{U}/real/z", recursive=False)]),
    ("no-follow remove", link_tree, [
        nf("fs/remove", "{U}/real/lf", recursive=False),
        nf("fs/remove", "{U}/lreal/f.txt", recursive=False),
        nf("fs/remove", "{U}/real/sub"),
        nf("fs/remove", "{U}/real/sub", recursive=True),
        nf("fs/remove", "{U}/missing", recursive=False, force=False),
        nf("fs/remove", "{U}/missing", recursive=False),
        nf("fs/remove", "{U}/real/f.txt", recursive=False),
        nf("fs/remove", "{U}/real/sub", recursive=False)]),
    ("handles read", handle_tree, [
        ("fs/open", {"handleId": "h", "path": "{U}/f"}),
        ("fs/readBlock", {"handleId": "h", "offset": 0, "len": 4}),
        ("fs/readBlock", {"handleId": "h", "offset": 6, "len": 4}),
        ("fs/readBlock", {"handleId": "h", "offset": 10, "len": 4}),
        ("fs/readBlock", {"handleId": "h", "offset": 99, "len": 4}),
        ("fs/readBlock", {"handleId": "h", "offset": 0, "len": 0}),
        ("fs/readBlock", {"handleId": "h", "offset": 0, "len": 1048577}),
        ("fs/writeBlock", {"handleId": "h", "offset": 0, "chunk": "eA=="}),
        ("fs/readBlock", {"handleId": "h", "offset": 0, "len": 1048576}),
        ("fs/open", {"handleId": "h", "path": "{U}/f"}),
        ("fs/readBlock", {"handleId": "h", "offset": 18446744073709551615, "len": 1}),
        ("fs/readBlock", {"handleId": "h", "offset": 0, "len": 1}),
        ("fs/close", {"handleId": "h"}),
        ("fs/close", {"handleId": "h"})]),
    ("handles open errors", handle_tree, [
        ("fs/open", {"handleId": "a", "path": "{U}/missing"}),
        ("fs/open", {"handleId": "a", "path": "{U}/d"}),
        ("fs/open", {"handleId": "a", "path": "{U}/fifo"}),
        ("fs/open", {"handleId": "a", "path": "{U}/d", "mode": "replace"}),
        ("fs/open", {"handleId": "a", "path": "{U}/no/x", "mode": "replace"}),
        ("fs/open", {"handleId": "0123456789abcdef0123456789abcdefX", "path": "{U}/f"}),
        ("fs/open", {"handleId": "", "path": "{U}/l"}),
        ("fs/open", {"handleId": "", "path": "{U}/f"}),
        ("fs/readBlock", {"handleId": "", "offset": 0, "len": 3}),
        ("fs/readBlock", {"handleId": "zz", "offset": 0, "len": 3})]),
    # Under ws/sub: the workspace itself lists differently under upstream's helper
    # (its bwrap mounts the missing .agents, .codex, .aws; docs/compat.md).
    ("sandboxed walk", sandbox_tree, [
        ("fs/walk", {"path": "{U}/ws/sub", "options": options(), "sandbox": S}),
        ("fs/walk", {"path": "{U}/ws/sub", "options": options(followDirectorySymlinks=True),
                     "sandbox": S}),
        ("fs/walk", {"path": "{U}/ws/sub/lin", "options": options(followDirectorySymlinks=True),
                     "sandbox": S})]),
    ("sandboxed handles", sandbox_tree, [
        ("fs/open", {"handleId": "r", "path": "{U}/ws/f", "sandbox": S}),
        ("fs/readBlock", {"handleId": "r", "offset": 2, "len": 3}),
        ("fs/open", {"handleId": "w", "path": "{U}/ws/new", "mode": "replace", "sandbox": S}),
        ("fs/writeBlock", {"handleId": "w", "offset": 0, "chunk": "bmV3"}),
        ("fs/close", {"handleId": "w"}),
        ("fs/open", {"handleId": "d", "path": "{U}/ws/d", "sandbox": S}),
        ("fs/open", {"handleId": "x", "path": "{U}/ws/ro", "mode": "replace", "sandbox": S}),
        ("fs/open", {"handleId": "x", "path": "{U}/ws/missing", "sandbox": S})]),
    ("sandboxed no-follow", sandbox_tree, [
        nf("fs/writeFile", "{U}/ws/f", dataBase64=B64, sandbox=S),
        nf("fs/writeFile", "{U}/ws/ro", dataBase64=B64, sandbox=S),
        nf("fs/readFile", "{U}/ws/f", sandbox=S),
        nf("fs/getMetadata", "{U}/ws/l", sandbox=S),
        nf("fs/createDirectory", "{U}/ws/sub/deeper/n", sandbox=S),
        nf("fs/remove", "{U}/ws/sub/deeper/x.txt", recursive=False, sandbox=S)]),
    ("handles write", handle_tree, [
        ("fs/open", {"handleId": "w", "path": "{U}/l", "mode": "replace"}),
        ("fs/writeBlock", {"handleId": "w", "offset": 3, "chunk": "eHk="}),
        ("fs/writeBlock", {"handleId": "w", "offset": 0, "chunk": ""}),
        ("fs/writeBlock", {"handleId": "w", "offset": 9223372036854775807, "chunk": "eA=="}),
        ("fs/readBlock", {"handleId": "w", "offset": 0, "len": 1}),
        ("fs/writeBlock", {"handleId": "w", "offset": 0, "chunk": "eA=="}),
        ("fs/open", {"handleId": "n", "path": "{U}/new", "mode": "replace"}),
        ("fs/writeBlock", {"handleId": "n", "offset": 0, "chunk": "bmV3"}),
        ("fs/close", {"handleId": "w"}),
        ("fs/close", {"handleId": "n"})]),
]  # fmt: skip


def _fill(value: Any, root: Path) -> Any:
    if value == S:
        return to_wire(workspace_write(root / "ws", tmp=False, full_read=False))
    if isinstance(value, str):
        return value.replace("{U}", f"file://{root}")
    if isinstance(value, dict):
        return {k: _fill(v, root) for k, v in value.items()}
    return value


def _mask(answer: Any) -> None:
    if isinstance(answer, dict):
        for key in ("modifiedAtMs", "createdAtMs"):
            if key in answer:
                answer[key] = "masked"


async def test_current_fs_answers_match_upstream(upstream_diff: Any) -> None:
    differences = await upstream_diff.differences(CASES, fill=_fill, mask=_mask)
    assert not differences, "\n".join(differences)
