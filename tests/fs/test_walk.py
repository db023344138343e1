"""``fs/walk`` (PROTOCOL_CURRENT §6): options, limits, ordering, symlink rules, sandbox.

The tree and the expected listings are the spec's example, measured on
upstream 0.163; every listing is checked on the local, remote (router) and
WebSocket backends.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from exec_server.client import sandbox_contexts as sc
from exec_server.client.fs import ExecutorFileSystem
from exec_server.exceptions import InvalidRequestError, NotFoundError

LIMITS = {"max_depth": 10, "max_directories": 100, "max_entries": 100}


def uri(path: Path | str) -> str:
    return f"file://{os.fspath(path)}"


def make_tree(base: Path) -> Path:
    """``root/{.hf, .hid/h.txt, a/{a1.txt, deep/d.txt}, b.txt, empty/, ldir→a,
    lfile→b.txt, lout→../outside, dangling→missing, loop→loop, fifo}`` and
    ``outside/o.txt``."""
    root = base / "root"
    (root / ".hid").mkdir(parents=True)
    (root / "a" / "deep").mkdir(parents=True)
    (root / "empty").mkdir()
    (base / "outside").mkdir()
    for name in (".hf", ".hid/h.txt", "a/a1.txt", "a/deep/d.txt", "b.txt"):
        (root / name).write_text(name)
    (base / "outside" / "o.txt").write_text("o")
    (root / "ldir").symlink_to("a")
    (root / "lfile").symlink_to("b.txt")
    (root / "lout").symlink_to("../outside")
    (root / "dangling").symlink_to("missing")
    (root / "loop").symlink_to("loop")
    os.mkfifo(root / "fifo")
    return root


def names(root: Path, result: Any) -> list[str]:
    return [os.path.relpath(e.path, root) for e in result.entries]


NO_FOLLOW = [".hf", ".hid", "a", "b.txt", "empty", ".hid/h.txt", "a/a1.txt", "a/deep",
             "a/deep/d.txt"]  # fmt: skip
FOLLOW = [".hf", ".hid", "a", "b.txt", "empty", "ldir", "lout", ".hid/h.txt", "a/a1.txt",
          "a/deep", "lout/o.txt", "a/deep/d.txt"]  # fmt: skip


async def test_no_follow_lists_breadth_first_in_name_order(
    fs: ExecutorFileSystem, tdir: Path
) -> None:
    root = make_tree(tdir)
    result = await fs.walk(root, **LIMITS)
    assert names(root, result) == NO_FOLLOW
    assert result.errors == [] and result.truncated is False
    kinds = dict(zip(names(root, result), [e.is_directory for e in result.entries], strict=True))
    assert kinds["a"] and kinds["a/deep"] and not kinds["b.txt"] and not kinds[".hf"]


async def test_follow_lists_links_to_directories_walks_each_directory_once(
    fs: ExecutorFileSystem, tdir: Path
) -> None:
    root = make_tree(tdir)
    result = await fs.walk(root, follow_directory_symlinks=True, **LIMITS)
    # ldir is listed but not walked (a was visited); lout's children stay under the link.
    assert names(root, result) == FOLLOW
    assert result.truncated is False


async def test_pruning_hidden_lists_hidden_directories_without_descending(
    fs: ExecutorFileSystem, tdir: Path
) -> None:
    root = make_tree(tdir)
    result = await fs.walk(root, prune_hidden_directories=True, **LIMITS)
    assert names(root, result) == [n for n in NO_FOLLOW if n != ".hid/h.txt"]


async def test_max_entries_counts_every_name_and_stops(fs: ExecutorFileSystem, tdir: Path) -> None:
    root = make_tree(tdir)
    result = await fs.walk(root, max_depth=10, max_directories=100, max_entries=3)
    assert names(root, result) == [".hf", ".hid", "a"]
    assert result.truncated is True
    # Skipped names count too (fifo, ldir, lfile, lout; the dangling and looping
    # links are no names, as in fs/readDirectory): the root's 9 names use up 9 entries.
    result = await fs.walk(root, max_depth=10, max_directories=100, max_entries=9)
    assert names(root, result) == [".hf", ".hid", "a", "b.txt", "empty"]
    assert result.truncated is True
    result = await fs.walk(root, max_depth=10, max_directories=100, max_entries=10)
    assert names(root, result) == [".hf", ".hid", "a", "b.txt", "empty", ".hid/h.txt"]
    assert result.truncated is True


async def test_max_directories_keeps_listing_but_queues_no_more(
    fs: ExecutorFileSystem, tdir: Path
) -> None:
    root = make_tree(tdir)
    result = await fs.walk(root, max_depth=10, max_directories=1, max_entries=100)
    assert names(root, result) == [".hf", ".hid", "a", "b.txt", "empty"]
    assert result.truncated is True


@pytest.mark.parametrize(
    ("depth", "expected"),
    [
        (0, [".hf", ".hid", "a", "b.txt", "empty"]),
        (1, [".hf", ".hid", "a", "b.txt", "empty", ".hid/h.txt", "a/a1.txt", "a/deep"]),
        (2, NO_FOLLOW),
    ],
)
async def test_max_depth(
    fs: ExecutorFileSystem, tdir: Path, depth: int, expected: list[str]
) -> None:
    root = make_tree(tdir)
    result = await fs.walk(root, max_depth=depth, max_directories=100, max_entries=100)
    assert names(root, result) == expected
    assert result.truncated is False


async def test_root_that_is_a_file_or_an_unfollowed_link_is_empty(
    fs: ExecutorFileSystem, tdir: Path
) -> None:
    root = make_tree(tdir)
    for path in (root / "b.txt", root / "ldir"):
        result = await fs.walk(path, **LIMITS)
        assert (result.entries, result.errors, result.truncated) == ([], [], False)
    followed = await fs.walk(root / "ldir", follow_directory_symlinks=True, **LIMITS)
    assert names(root / "ldir", followed) == ["a1.txt", "deep", "deep/d.txt"]


async def test_missing_root_is_not_found(fs: ExecutorFileSystem, tdir: Path) -> None:
    with pytest.raises(NotFoundError, match=r"No such file or directory \(os error 2\)"):
        await fs.walk(tdir / "missing", **LIMITS)


async def test_a_symlink_cycle_ends(fs: ExecutorFileSystem, tdir: Path) -> None:
    (tdir / "c" / "d").mkdir(parents=True)
    (tdir / "c" / "d" / "up").symlink_to("../..")
    result = await fs.walk(tdir / "c", follow_directory_symlinks=True, **LIMITS)
    # up leads back to tdir, not yet visited: walked once; its c is c again: listed only.
    assert "d/up" in names(tdir / "c", result)
    assert "d/up/c" in names(tdir / "c", result)
    assert "d/up/c/d" not in names(tdir / "c", result)


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"maxDirectories": 0}, "filesystem walk limits must be greater than zero"),
        ({"maxEntries": 0}, "filesystem walk limits must be greater than zero"),
        ({"maxDepth": 65}, "filesystem walk limits exceed maximums: depth=64, "
                           "directories=10000, entries=50000"),
        ({"maxDirectories": 10001}, "filesystem walk limits exceed maximums"),
        ({"maxEntries": 50001}, "filesystem walk limits exceed maximums"),
    ],
)  # fmt: skip
async def test_limits_are_checked_before_the_path(
    wire: Any, tdir: Path, limits: dict[str, int], message: str
) -> None:
    options = {
        "maxDepth": 1,
        "maxDirectories": 1,
        "maxEntries": 1,
        "followDirectorySymlinks": False,
        "pruneHiddenDirectories": False,
        **limits,
    }
    reply = await wire.raw("fs/walk", {"path": uri(tdir / "missing"), "options": options})
    assert reply["error"]["code"] == -32600
    assert reply["error"]["message"].startswith(message)


async def test_the_maxima_are_accepted(wire: Any, tdir: Path) -> None:
    options = {
        "maxDepth": 64,
        "maxDirectories": 10000,
        "maxEntries": 50000,
        "followDirectorySymlinks": True,
        "pruneHiddenDirectories": True,
    }
    (tdir / "x").write_text("x")
    reply = await wire.raw("fs/walk", {"path": uri(tdir), "options": options})
    assert reply["result"] == {
        "entries": [{"path": uri(tdir / "x"), "kind": "file"}],
        "errors": [],
        "truncated": False,
    }


async def test_missing_options_are_invalid_params(wire: Any, tdir: Path) -> None:
    reply = await wire.raw("fs/walk", {"path": uri(tdir)})
    assert reply["error"]["code"] == -32602
    assert "missing field `options`" in reply["error"]["message"]
    reply = await wire.raw("fs/walk", {"path": uri(tdir), "options": {}})
    assert reply["error"]["code"] == -32602
    assert "missing field `maxDepth`" in reply["error"]["message"]


async def test_names_are_percent_encoded_in_uris(wire: Any, tdir: Path) -> None:
    (tdir / "a b#").write_text("x")
    os.mkdir(os.path.join(os.fsencode(tdir), b"raw\xff"))
    options = {
        "maxDepth": 0,
        "maxDirectories": 1,
        "maxEntries": 10,
        "followDirectorySymlinks": False,
        "pruneHiddenDirectories": False,
    }
    reply = await wire.raw("fs/walk", {"path": uri(tdir), "options": options})
    assert reply["result"]["entries"] == [
        {"path": uri(tdir) + "/a%20b%23", "kind": "file"},
        {"path": uri(tdir) + "/raw%FF", "kind": "directory"},
    ]


# -- sandboxed


async def test_sandboxed_walk_hides_what_the_context_cannot_read(
    sandboxed_fs: ExecutorFileSystem, tdir: Path
) -> None:
    root = make_tree(tdir)
    sandbox = sc.read_only(root, full_read=False)
    result = await sandboxed_fs.walk(
        root, follow_directory_symlinks=True, sandbox=sandbox, **LIMITS
    )
    # lout leads out of the readable roots: absent, not an error.
    assert names(root, result) == [n for n in FOLLOW if not n.startswith("lout")]
    assert result.errors == []


async def test_sandboxed_walk_outside_the_readable_roots_is_refused(
    sandboxed_fs: ExecutorFileSystem, tdir: Path
) -> None:
    root = make_tree(tdir)
    sandbox = sc.read_only(root, full_read=False)
    with pytest.raises((InvalidRequestError, NotFoundError)):
        await sandboxed_fs.walk(tdir / "outside", sandbox=sandbox, **LIMITS)
    with pytest.raises((InvalidRequestError, NotFoundError)):
        await sandboxed_fs.walk(root / "lout", sandbox=sandbox, **LIMITS)


async def test_sandboxed_walk_reading_everything_is_the_plain_walk(
    sandboxed_fs: ExecutorFileSystem, tdir: Path
) -> None:
    root = make_tree(tdir)
    result = await sandboxed_fs.walk(
        root, follow_directory_symlinks=True, sandbox=sc.workspace_write(root), **LIMITS
    )
    assert names(root, result) == FOLLOW


@pytest.mark.parametrize("backend", ["bwrap", "landlock"])
async def test_sandboxed_walk_in_the_one_shot_helper(tdir: Path, backend: str) -> None:
    """The upstream-equivalent helper path (no zygote) walks confined the same way."""
    from exec_server.client.fs import LocalFileSystem
    from exec_server.config import ServerConfig
    from exec_server.fs.confined import SandboxedFileSystem
    from exec_server.sandbox.manager import SandboxManager

    if backend == "bwrap" and not shutil.which("bwrap"):
        pytest.skip("bubblewrap not installed")
    config = ServerConfig(fs_helper_timeout=20, sandbox_backend=backend)  # type: ignore[arg-type]
    service = SandboxedFileSystem(config, SandboxManager(config), mode="helper")
    try:
        fs = LocalFileSystem(confined=service)
        root = make_tree(tdir)
        sandbox = sc.read_only(root, full_read=False)
        result = await fs.walk(root, follow_directory_symlinks=True, sandbox=sandbox, **LIMITS)
        assert names(root, result) == [n for n in FOLLOW if not n.startswith("lout")]
        assert service.zygote.pid is None  # no zygote: the one-shot helper answered
    finally:
        await service.aclose()


async def test_sandboxed_walk_of_a_writable_root_with_restricted_reads(
    sandboxed_fs: ExecutorFileSystem, tdir: Path
) -> None:
    """The workspace is a writable root, not a readable one: readable all the same."""
    root = make_tree(tdir)
    sandbox = sc.workspace_write(root, full_read=False, tmp=False)
    result = await sandboxed_fs.walk(root, sandbox=sandbox, **LIMITS)
    assert names(root, result) == NO_FOLLOW
    result = await sandboxed_fs.walk(root / "b.txt", sandbox=sandbox, **LIMITS)
    assert (result.entries, result.errors, result.truncated) == ([], [], False)


async def test_sandboxed_walk_of_a_link_root_keeps_its_name(
    sandboxed_fs: ExecutorFileSystem, tdir: Path
) -> None:
    root = make_tree(tdir)
    sandbox = sc.read_only(root, full_read=False)
    result = await sandboxed_fs.walk(root / "ldir", sandbox=sandbox, **LIMITS)
    assert (result.entries, result.errors, result.truncated) == ([], [], False)
    result = await sandboxed_fs.walk(
        root / "ldir", follow_directory_symlinks=True, sandbox=sandbox, **LIMITS
    )
    assert names(root, result) == ["ldir/a1.txt", "ldir/deep", "ldir/deep/d.txt"]
