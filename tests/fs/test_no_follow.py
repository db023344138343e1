"""``followSymlinks: false`` (PROTOCOL_CURRENT §8): a symlink in any position of the
path is refused, with upstream's codes and texts, and nothing behind it is touched.

The tree is ``t/d/e/f.txt`` with ``t/d/e/sub/``; for each position of the path
``t/d/e/<name>`` one component is replaced by a symlink to where it was moved
(``d`` → ``d.real``), so the same path resolves to the same file when links are
followed, and must fail when they are not.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from exec_server.client import sandbox_contexts as sc
from exec_server.client.fs import ExecutorFileSystem
from exec_server.exceptions import ExecServerError, InvalidRequestError, NotFoundError

LOOP = r"(?:^|: )Symbolic link loop \(os error 40\)$"
NOT_DIR = r"(?:^|: )Not a directory \(os error 20\)$"
CONTAINS = r"(?:^|: )path contains a symbolic link$"


def make_tree(base: Path, link_at: str | None) -> Path:
    """``base/t/d/e/{f.txt, sub/}``; ``link_at`` ("t", "d", "e", "f.txt" or "sub"):
    that component becomes a symlink to its real self, renamed ``<name>.real``."""
    e = base / "t" / "d" / "e"
    (e / "sub").mkdir(parents=True)
    (e / "f.txt").write_bytes(b"contents")
    if link_at is not None:
        where = {"t": base / "t", "d": base / "t" / "d", "e": e, "f.txt": e / "f.txt",
                 "sub": e / "sub"}[link_at]  # fmt: skip
        real = where.with_name(where.name + ".real")
        where.rename(real)
        where.symlink_to(real.name)
    return base / "t" / "d" / "e"


INTERMEDIATE = ["t", "d", "e"]


def snapshot(base: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(base):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            out[str(p.relative_to(base))] = (
                os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else "dir"
            )
    return out


async def test_without_links_everything_works(fs: ExecutorFileSystem, tdir: Path) -> None:
    e = make_tree(tdir, None)
    meta = await fs.get_metadata(e / "f.txt", follow_symlinks=False)
    assert meta.is_file and meta.is_symlink is False and meta.size == 8
    assert await fs.read_file(e / "f.txt", follow_symlinks=False) == b"contents"
    await fs.write_file(e / "f.txt", b"new", follow_symlinks=False)
    assert (e / "f.txt").read_bytes() == b"new"
    await fs.write_file(e / "g.txt", b"g", follow_symlinks=False)
    assert (e / "g.txt").read_bytes() == b"g"
    await fs.create_directory(e / "x" / "y" / "z", follow_symlinks=False)
    assert (e / "x" / "y" / "z").is_dir()
    await fs.create_directory(e / "x", recursive=True, follow_symlinks=False)  # exists: fine
    await fs.remove(e / "g.txt", recursive=False, follow_symlinks=False)
    assert not (e / "g.txt").exists()
    await fs.remove(e / "x" / "y" / "z", recursive=False, follow_symlinks=False)
    assert not (e / "x" / "y" / "z").exists()
    await fs.remove(e / "missing", recursive=False, follow_symlinks=False)  # force
    with pytest.raises(NotFoundError):
        await fs.remove(e / "missing", recursive=False, force=False, follow_symlinks=False)
    with pytest.raises(InvalidRequestError, match=r"(?:^|: )path is not a regular file$"):
        await fs.read_file(e / "sub", follow_symlinks=False)


@pytest.mark.parametrize("link_at", INTERMEDIATE)
async def test_an_intermediate_link_is_not_a_directory(
    fs: ExecutorFileSystem, tdir: Path, link_at: str
) -> None:
    e = make_tree(tdir, link_at)
    # Followed, the path works: the link is what makes the difference.
    assert await fs.read_file(e / "f.txt") == b"contents"
    before = snapshot(tdir)
    calls = [
        fs.get_metadata(e / "f.txt", follow_symlinks=False),
        fs.read_file(e / "f.txt", follow_symlinks=False),
        fs.write_file(e / "f.txt", b"changed", follow_symlinks=False),
        fs.write_file(e / "new.txt", b"created", follow_symlinks=False),
        fs.create_directory(e / "newdir", follow_symlinks=False),
        fs.create_directory(e / "sub", recursive=False, follow_symlinks=False),
        fs.remove(e / "f.txt", recursive=False, follow_symlinks=False),
        fs.remove(e / "sub", recursive=False, follow_symlinks=False),
    ]
    for call in calls:
        with pytest.raises(ExecServerError, match=NOT_DIR) as info:
            await call
        assert info.value.code == -32603
    assert snapshot(tdir) == before


async def test_a_final_link_to_a_file(fs: ExecutorFileSystem, tdir: Path) -> None:
    e = make_tree(tdir, "f.txt")
    before = snapshot(tdir)
    with pytest.raises(InvalidRequestError, match=CONTAINS):
        await fs.get_metadata(e / "f.txt", follow_symlinks=False)
    with pytest.raises(ExecServerError, match=LOOP):
        await fs.read_file(e / "f.txt", follow_symlinks=False)
    with pytest.raises(ExecServerError, match=LOOP):
        await fs.write_file(e / "f.txt", b"changed", follow_symlinks=False)
    with pytest.raises(ExecServerError, match=NOT_DIR):
        await fs.create_directory(e / "f.txt", follow_symlinks=False)
    with pytest.raises(InvalidRequestError, match=CONTAINS):
        await fs.remove(e / "f.txt", recursive=False, follow_symlinks=False)
    assert snapshot(tdir) == before  # the link and its target are untouched


async def test_a_final_link_to_a_directory(fs: ExecutorFileSystem, tdir: Path) -> None:
    e = make_tree(tdir, "sub")
    before = snapshot(tdir)
    with pytest.raises(InvalidRequestError, match=CONTAINS):
        await fs.get_metadata(e / "sub", follow_symlinks=False)
    with pytest.raises(ExecServerError, match=NOT_DIR):
        await fs.create_directory(e / "sub", follow_symlinks=False)
    with pytest.raises(ExecServerError, match=r"(?:^|: )File exists \(os error 17\)$"):
        await fs.create_directory(e / "sub", recursive=False, follow_symlinks=False)
    with pytest.raises(ExecServerError, match=NOT_DIR):
        await fs.create_directory(e / "sub" / "x", follow_symlinks=False)
    with pytest.raises(InvalidRequestError, match=CONTAINS):
        await fs.remove(e / "sub", recursive=False, follow_symlinks=False)
    assert snapshot(tdir) == before


async def test_a_dangling_final_link(fs: ExecutorFileSystem, tdir: Path) -> None:
    (tdir / "dangling").symlink_to("nowhere")
    with pytest.raises(ExecServerError, match=LOOP):
        await fs.read_file(tdir / "dangling", follow_symlinks=False)
    with pytest.raises(ExecServerError, match=LOOP):
        await fs.write_file(tdir / "dangling", b"x", follow_symlinks=False)
    assert not (tdir / "nowhere").exists()


async def test_recursive_no_follow_removal_is_unsupported(
    fs: ExecutorFileSystem, tdir: Path
) -> None:
    e = make_tree(tdir, None)
    unsupported = r"(?:^|: )recursive no-follow removal is unsupported$"
    with pytest.raises(ExecServerError, match=unsupported):
        await fs.remove(e / "sub", recursive=True, follow_symlinks=False)
    assert (e / "sub").is_dir()


async def test_follow_symlinks_must_be_a_boolean(wire: Any, tdir: Path) -> None:
    (tdir / "f").write_bytes(b"x")
    reply = await wire.raw("fs/getMetadata", {"path": f"file://{tdir}/f", "followSymlinks": "no"})
    assert reply["error"]["code"] == -32602
    reply = await wire.raw("fs/getMetadata", {"path": f"file://{tdir}/f", "followSymlinks": True})
    assert reply["result"]["isFile"] is True


async def test_absent_recursive_on_the_wire_is_unsupported(wire: Any, tdir: Path) -> None:
    (tdir / "f").write_bytes(b"x")
    reply = await wire.raw("fs/remove", {"path": f"file://{tdir}/f", "followSymlinks": False})
    assert reply["error"] == {
        "code": -32603,
        "message": "recursive no-follow removal is unsupported",
    }
    assert (tdir / "f").exists()


# -- sandboxed


async def test_sandboxed_no_follow_checks_the_policy(
    sandboxed_fs: ExecutorFileSystem, tdir: Path
) -> None:
    ws = tdir / "ws"
    ws.mkdir()
    (tdir / "outside").write_bytes(b"keep")
    sandbox = sc.workspace_write(ws, tmp=False)
    await sandboxed_fs.write_file(ws / "in", b"ok", sandbox=sandbox, follow_symlinks=False)
    assert (ws / "in").read_bytes() == b"ok"
    assert await sandboxed_fs.read_file(ws / "in", sandbox, follow_symlinks=False) == b"ok"
    with pytest.raises(InvalidRequestError, match="is not permitted by filesystem sandbox"):
        await sandboxed_fs.write_file(
            tdir / "outside", b"changed", sandbox=sandbox, follow_symlinks=False
        )
    with pytest.raises(InvalidRequestError, match="is not permitted by filesystem sandbox"):
        await sandboxed_fs.remove(
            tdir / "outside", recursive=False, sandbox=sandbox, follow_symlinks=False
        )
    assert (tdir / "outside").read_bytes() == b"keep"
    restricted = sc.read_only(ws, full_read=False)
    with pytest.raises(InvalidRequestError, match="is not permitted by filesystem sandbox"):
        await sandboxed_fs.read_file(tdir / "outside", restricted, follow_symlinks=False)
    # A link inside the workspace to a file outside: refused either way, target kept.
    (ws / "link").symlink_to(tdir / "outside")
    with pytest.raises(ExecServerError):
        await sandboxed_fs.write_file(ws / "link", b"x", sandbox=sandbox, follow_symlinks=False)
    assert (tdir / "outside").read_bytes() == b"keep"


async def test_a_big_no_follow_write(fs: ExecutorFileSystem, tdir: Path) -> None:
    """Over 256 KiB the server decodes the payload in the writing worker (one-pass and
    deferred decoding): the member must survive those paths too."""
    data = os.urandom(3 * 1024 * 1024 + 1)
    (tdir / "real").mkdir()
    (tdir / "lreal").symlink_to("real")
    await fs.write_file(tdir / "real" / "big", data, follow_symlinks=False)
    assert (tdir / "real" / "big").read_bytes() == data
    with pytest.raises(ExecServerError, match=NOT_DIR):
        await fs.write_file(tdir / "lreal" / "big2", data, follow_symlinks=False)
    assert not (tdir / "real" / "big2").exists()
    assert await fs.read_file(tdir / "real" / "big", follow_symlinks=False) == data


async def test_sandboxed_no_follow_runs_in_the_confined_helper(
    sandboxed_fs: ExecutorFileSystem, tdir: Path
) -> None:
    """Under a confining context the helper runs the no-follow call: links are refused
    there as here, and it writes without the server's capabilities (a file without
    write bits is refused, as upstream's helper refuses it; root would not be)."""
    ws = tdir / "ws"
    e = make_tree(ws, "d")
    sandbox = sc.workspace_write(ws, tmp=False)
    with pytest.raises(ExecServerError, match=NOT_DIR):
        await sandboxed_fs.write_file(e / "f.txt", b"x", sandbox=sandbox, follow_symlinks=False)
    with pytest.raises(ExecServerError, match=NOT_DIR):
        await sandboxed_fs.get_metadata(e / "f.txt", sc.read_only(ws, full_read=False),
                                        follow_symlinks=False)  # fmt: skip
    real = ws / "t" / "d.real" / "e"
    (real / "ro").write_bytes(b"keep")
    (real / "ro").chmod(0o444)
    with pytest.raises(InvalidRequestError, match=r"(?:^|: )Permission denied \(os error 13\)$"):
        await sandboxed_fs.write_file(real / "ro", b"x", sandbox=sandbox, follow_symlinks=False)
    assert (real / "ro").read_bytes() == b"keep"
    await sandboxed_fs.write_file(real / "f.txt", b"new", sandbox=sandbox, follow_symlinks=False)
    assert (real / "f.txt").read_bytes() == b"new"
    meta = await sandboxed_fs.get_metadata(
        real / "f.txt", sc.read_only(ws, full_read=False), follow_symlinks=False
    )
    assert meta.is_file and meta.size == 3
    (ws / ".git").mkdir()
    with pytest.raises(InvalidRequestError, match="x is not permitted by filesystem sandbox"):
        await sandboxed_fs.create_directory(ws / ".git" / "x", sandbox=sandbox,
                                            follow_symlinks=False)  # fmt: skip
    assert not (ws / ".git" / "x").exists()
