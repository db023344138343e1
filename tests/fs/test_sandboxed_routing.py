"""PROTOCOL.md §15.6 #23-#35: sandboxed contexts are confined, on both backends.

The confinement itself is the sandboxed-filesystem area's (``fs/confined.py``);
these tests check that ``LocalFileSystem`` and the server route read-only and
workspace-write contexts there, never to the direct implementation.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from exec_server.client.fs import ExecutorFileSystem
from exec_server.exceptions import ExecServerError, NotFoundError

DENIAL_TEXTS = ("is not permitted", "Operation not permitted", "Permission denied")


def assert_denied(exc: ExecServerError) -> None:
    assert exc.code == -32600, (exc.code, exc.message)
    assert any(t in exc.message for t in DENIAL_TEXTS), exc.message


@pytest.fixture
def layout(tdir: Path) -> Path:
    (tdir / "allowed").mkdir()
    (tdir / "outside").mkdir()
    (tdir / "outside" / "secret.txt").write_text("secret")
    (tdir / "allowed" / "link").symlink_to(tdir / "outside")
    return tdir


@pytest.fixture
def ro(read_only_context: Any, layout: Path) -> dict[str, Any]:
    """§15.6 RO(T/allowed)."""
    return read_only_context(layout / "allowed")  # type: ignore[no-any-return]


@pytest.fixture
def ww(legacy_workspace_write_context: Any, layout: Path) -> dict[str, Any]:
    """§15.6 WW(T/allowed)."""
    return legacy_workspace_write_context(layout / "allowed")  # type: ignore[no-any-return]


async def test_read_allows_readable_root(
    sandboxed_fs: ExecutorFileSystem, layout: Path, ro: dict[str, Any]
) -> None:
    (layout / "allowed" / "note.txt").write_text("sandboxed hello")  # 23
    data = await sandboxed_fs.read_file(layout / "allowed" / "note.txt", ro)
    assert data == b"sandboxed hello"


async def test_write_rejects_unwritable_path(
    sandboxed_fs: ExecutorFileSystem, layout: Path, ro: dict[str, Any]
) -> None:
    with pytest.raises(ExecServerError) as exc:  # 24
        await sandboxed_fs.write_file(layout / "blocked.txt", b"x", ro)
    assert_denied(exc.value)
    assert not (layout / "blocked.txt").exists()


async def test_read_rejects_symlink_escape(
    sandboxed_fs: ExecutorFileSystem, layout: Path, ro: dict[str, Any]
) -> None:
    with pytest.raises(ExecServerError) as exc:  # 25
        await sandboxed_fs.read_file(layout / "allowed" / "link" / "secret.txt", ro)
    assert_denied(exc.value)


async def test_read_rejects_symlink_parent_dotdot_escape(
    sandboxed_fs: ExecutorFileSystem, layout: Path, ro: dict[str, Any]
) -> None:
    (layout / "secret.txt").write_text("top secret")  # 26
    with pytest.raises(ExecServerError) as exc:
        await sandboxed_fs.read_file(f"{layout}/allowed/link/../secret.txt", ro)
    if isinstance(exc.value, NotFoundError):
        assert "No such file or directory" in exc.value.message
    else:
        assert_denied(exc.value)


async def test_write_rejects_symlink_escape(
    sandboxed_fs: ExecutorFileSystem, layout: Path, ww: dict[str, Any]
) -> None:
    with pytest.raises(ExecServerError) as exc:  # 27
        await sandboxed_fs.write_file(layout / "allowed" / "link" / "blocked.txt", b"x", ww)
    assert_denied(exc.value)
    assert not (layout / "outside" / "blocked.txt").exists()


async def test_create_directory_rejects_symlink_escape(
    sandboxed_fs: ExecutorFileSystem, layout: Path, ww: dict[str, Any]
) -> None:
    with pytest.raises(ExecServerError) as exc:  # 28
        await sandboxed_fs.create_directory(
            layout / "allowed" / "link" / "created", recursive=False, sandbox=ww
        )
    assert_denied(exc.value)
    assert not (layout / "outside" / "created").exists()


async def test_metadata_and_listing_reject_symlink_escape(
    sandboxed_fs: ExecutorFileSystem, layout: Path, ro: dict[str, Any]
) -> None:
    with pytest.raises(ExecServerError) as exc:  # 29
        await sandboxed_fs.get_metadata(layout / "allowed" / "link" / "secret.txt", ro)
    assert_denied(exc.value)
    with pytest.raises(ExecServerError) as exc:  # 30
        await sandboxed_fs.read_directory(layout / "allowed" / "link", ro)
    assert_denied(exc.value)


async def test_copy_rejects_symlink_escapes(
    sandboxed_fs: ExecutorFileSystem, layout: Path, ww: dict[str, Any]
) -> None:
    (layout / "allowed" / "source.txt").write_text("src")
    with pytest.raises(ExecServerError) as exc:  # 31
        await sandboxed_fs.copy(
            layout / "allowed" / "source.txt",
            layout / "allowed" / "link" / "copied.txt",
            recursive=False,
            sandbox=ww,
        )
    assert_denied(exc.value)
    assert not (layout / "outside" / "copied.txt").exists()
    with pytest.raises(ExecServerError) as exc:  # 35
        await sandboxed_fs.copy(
            layout / "allowed" / "link" / "secret.txt",
            layout / "allowed" / "copied.txt",
            recursive=False,
            sandbox=ww,
        )
    assert_denied(exc.value)
    assert not (layout / "allowed" / "copied.txt").exists()


async def test_remove_symlink_not_target_and_rejects_escape(
    sandboxed_fs: ExecutorFileSystem, layout: Path, ww: dict[str, Any]
) -> None:
    (layout / "outside" / "keep.txt").write_text("outside")
    (layout / "allowed" / "file-link").symlink_to(layout / "outside" / "keep.txt")
    await sandboxed_fs.remove(  # 32
        layout / "allowed" / "file-link",
        recursive=False,
        force=False,
        sandbox=ww,
    )
    assert not (layout / "allowed" / "file-link").is_symlink()
    assert (layout / "outside" / "keep.txt").read_text() == "outside"
    with pytest.raises(ExecServerError) as exc:  # 34
        await sandboxed_fs.remove(layout / "allowed" / "link" / "secret.txt", sandbox=ww)
    assert_denied(exc.value)
    assert (layout / "outside" / "secret.txt").read_text() == "secret"


async def test_copy_preserves_symlink_source(
    sandboxed_fs: ExecutorFileSystem, layout: Path, ww: dict[str, Any]
) -> None:
    (layout / "outside" / "outside.txt").write_text("o")  # 33
    (layout / "allowed" / "o-link").symlink_to(layout / "outside" / "outside.txt")
    await sandboxed_fs.copy(
        layout / "allowed" / "o-link",
        layout / "allowed" / "copied-link",
        recursive=False,
        sandbox=ww,
    )
    assert (layout / "allowed" / "copied-link").is_symlink()
    assert os.readlink(layout / "allowed" / "copied-link") == str(
        layout / "outside" / "outside.txt"
    )
