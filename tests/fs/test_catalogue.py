"""PROTOCOL.md §15.6 filesystem behaviours (direct route), against both backends."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from exec_server.client.fs import ExecutorFileSystem, read_text
from exec_server.exceptions import InternalError, InvalidRequestError, NotFoundError


def _write_raw(path: bytes, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def _read_raw(path: bytes) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _lexists(path: Path) -> bool:
    return path.is_symlink() or path.exists()


async def test_get_metadata_returns_expected_fields(fs: ExecutorFileSystem, tdir: Path) -> None:
    # §15.6 #20
    (tdir / "note.txt").write_text("hello")
    meta = await fs.get_metadata(tdir / "note.txt")
    assert meta.is_directory is False
    assert meta.is_file is True
    assert meta.modified_at_ms > 0
    assert meta.is_symlink is False
    assert meta.size == 5


async def test_methods_cover_surface_area(fs: ExecutorFileSystem, tdir: Path) -> None:
    # §15.6 #21
    await fs.create_directory(tdir / "source" / "nested", recursive=True)
    await fs.write_file(tdir / "source" / "nested" / "note.txt", b"hello from nested")
    await fs.write_file(tdir / "source" / "root.txt", b"hello from root")
    assert await fs.read_file(tdir / "source" / "nested" / "note.txt") == b"hello from nested"
    assert await read_text(fs, tdir / "source" / "root.txt") == "hello from root"

    await fs.copy(tdir / "source" / "root.txt", tdir / "copy.txt", recursive=False)
    assert (tdir / "copy.txt").read_bytes() == b"hello from root"

    await fs.copy(tdir / "source", tdir / "copied", recursive=True)
    assert (tdir / "copied" / "nested" / "note.txt").read_bytes() == b"hello from nested"

    entries = sorted(await fs.read_directory(tdir / "source"), key=lambda e: e.file_name)
    assert [(e.file_name, e.is_directory, e.is_file) for e in entries] == [
        ("nested", True, False),
        ("root.txt", False, True),
    ]

    await fs.remove(tdir / "copied", recursive=True, force=True)
    assert not (tdir / "copied").exists()


async def test_copy_rejects_directory_without_recursive(fs: ExecutorFileSystem, tdir: Path) -> None:
    # §15.6 #22
    (tdir / "source").mkdir()
    with pytest.raises(InvalidRequestError) as exc:
        await fs.copy(tdir / "source", tdir / "x", recursive=False)
    assert exc.value.message == "fs/copy requires recursive: true when sourcePath is a directory"
    assert not (tdir / "x").exists()


async def test_remove_removes_symlink_not_target(fs: ExecutorFileSystem, tdir: Path) -> None:
    # §15.6 #32 (direct route)
    (tdir / "outside").mkdir()
    (tdir / "outside" / "keep.txt").write_text("outside")
    (tdir / "link").symlink_to(tdir / "outside" / "keep.txt")
    await fs.remove(tdir / "link", recursive=False, force=False)
    assert not _lexists(tdir / "link")
    assert (tdir / "outside" / "keep.txt").read_text() == "outside"


async def test_remove_of_directory_symlink_keeps_target_tree(
    fs: ExecutorFileSystem, tdir: Path
) -> None:
    (tdir / "tree").mkdir()
    (tdir / "tree" / "f").write_text("x")
    (tdir / "link").symlink_to(tdir / "tree")
    await fs.remove(tdir / "link", recursive=True, force=True)
    assert not _lexists(tdir / "link")
    assert (tdir / "tree" / "f").read_text() == "x"


async def test_copy_preserves_symlink_source(fs: ExecutorFileSystem, tdir: Path) -> None:
    # §15.6 #33 (direct route)
    (tdir / "outside.txt").write_text("outside")
    (tdir / "link").symlink_to(tdir / "outside.txt")
    await fs.copy(tdir / "link", tdir / "copied-link", recursive=False)
    assert (tdir / "copied-link").is_symlink()
    assert os.readlink(tdir / "copied-link") == os.readlink(tdir / "link")


async def test_copy_rejects_copying_directory_into_descendant(
    fs: ExecutorFileSystem, tdir: Path
) -> None:
    # §15.6 #36
    (tdir / "source" / "nested").mkdir(parents=True)
    with pytest.raises(InvalidRequestError) as exc:
        await fs.copy(tdir / "source", tdir / "source" / "nested" / "copy", recursive=True)
    assert exc.value.message == (
        "fs/copy cannot copy a directory to itself or one of its descendants"
    )
    with pytest.raises(InvalidRequestError):
        await fs.copy(tdir / "source", tdir / "source", recursive=True)
    assert not (tdir / "source" / "nested" / "copy").exists()


async def test_copy_into_descendant_through_symlinked_destination(
    fs: ExecutorFileSystem, tdir: Path
) -> None:
    (tdir / "source" / "nested").mkdir(parents=True)
    (tdir / "alias").symlink_to(tdir / "source" / "nested")
    with pytest.raises(InvalidRequestError):
        await fs.copy(tdir / "source", tdir / "alias" / "copy", recursive=True)


async def test_copy_preserves_symlinks_in_recursive_copy(
    fs: ExecutorFileSystem, tdir: Path
) -> None:
    # §15.6 #37
    (tdir / "source" / "nested").mkdir(parents=True)
    (tdir / "source" / "nested-link").symlink_to("nested")
    await fs.copy(tdir / "source", tdir / "copied", recursive=True)
    assert (tdir / "copied" / "nested-link").is_symlink()
    assert os.readlink(tdir / "copied" / "nested-link") == "nested"


async def test_copy_ignores_unknown_special_files_in_recursive_copy(
    fs: ExecutorFileSystem, tdir: Path
) -> None:
    # §15.6 #38
    (tdir / "source").mkdir()
    (tdir / "source" / "note.txt").write_text("note")
    os.mkfifo(tdir / "source" / "named-pipe")
    await fs.copy(tdir / "source", tdir / "copied", recursive=True)
    assert (tdir / "copied" / "note.txt").read_text() == "note"
    assert not _lexists(tdir / "copied" / "named-pipe")


async def test_copy_rejects_standalone_fifo_source(fs: ExecutorFileSystem, tdir: Path) -> None:
    # §15.6 #39
    os.mkfifo(tdir / "named-pipe")
    with pytest.raises(InvalidRequestError) as exc:
        await fs.copy(tdir / "named-pipe", tdir / "copied", recursive=False)
    assert exc.value.message == "fs/copy only supports regular files, directories, and symlinks"


async def test_copy_merges_into_existing_directory(fs: ExecutorFileSystem, tdir: Path) -> None:
    (tdir / "source" / "sub").mkdir(parents=True)
    (tdir / "source" / "sub" / "a.txt").write_text("new")
    (tdir / "dest" / "sub").mkdir(parents=True)
    (tdir / "dest" / "sub" / "a.txt").write_text("old")
    (tdir / "dest" / "keep.txt").write_text("keep")
    await fs.copy(tdir / "source", tdir / "dest", recursive=True)
    assert (tdir / "dest" / "sub" / "a.txt").read_text() == "new"
    assert (tdir / "dest" / "keep.txt").read_text() == "keep"


async def test_copy_file_copies_permission_bits(fs: ExecutorFileSystem, tdir: Path) -> None:
    (tdir / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(tdir / "run.sh", 0o751)
    await fs.copy(tdir / "run.sh", tdir / "run2.sh", recursive=False)
    assert (tdir / "run2.sh").stat().st_mode & 0o7777 == 0o751


async def test_copy_symlink_onto_existing_destination_fails(
    fs: ExecutorFileSystem, tdir: Path
) -> None:
    (tdir / "link").symlink_to("target")
    (tdir / "taken").write_text("x")
    with pytest.raises(InternalError) as exc:
        await fs.copy(tdir / "link", tdir / "taken", recursive=False)
    assert "File exists (os error 17)" in exc.value.message


async def test_copy_missing_source_is_not_found(fs: ExecutorFileSystem, tdir: Path) -> None:
    with pytest.raises(NotFoundError):
        await fs.copy(tdir / "missing", tdir / "dest", recursive=True)


async def test_metadata_reports_symlink(fs: ExecutorFileSystem, tdir: Path) -> None:
    # Later upstream: isSymlink metadata (stat follows, isSymlink from lstat).
    (tdir / "file.txt").write_text("abc")
    (tdir / "link").symlink_to("file.txt")
    meta = await fs.get_metadata(tdir / "link")
    assert (meta.is_file, meta.is_symlink, meta.size) == (True, True, 3)
    (tdir / "dangling").symlink_to("missing")
    with pytest.raises(NotFoundError) as exc:
        await fs.get_metadata(tdir / "dangling")
    assert exc.value.message == "No such file or directory (os error 2)"


async def test_metadata_of_directory_and_fifo(fs: ExecutorFileSystem, tdir: Path) -> None:
    meta = await fs.get_metadata(tdir)
    assert (meta.is_directory, meta.is_file) == (True, False)
    os.mkfifo(tdir / "pipe")
    meta = await fs.get_metadata(tdir / "pipe")
    assert (meta.is_directory, meta.is_file, meta.size) == (False, False, 0)


async def test_write_with_missing_parent_is_not_found(fs: ExecutorFileSystem, tdir: Path) -> None:
    # Later upstream test; the current client's apply_patch depends on -32004.
    with pytest.raises(NotFoundError) as exc:
        await fs.write_file(tdir / "sub" / "dir" / "added.txt", b"x")
    assert exc.value.code == -32004
    assert exc.value.message == "No such file or directory (os error 2)"
    assert not (tdir / "sub").exists()


async def test_create_directory_modes(fs: ExecutorFileSystem, tdir: Path) -> None:
    await fs.create_directory(tdir / "a" / "b" / "c")  # recursive by default
    assert (tdir / "a" / "b" / "c").is_dir()
    await fs.create_directory(tdir / "a" / "b" / "c", recursive=True)  # exists: fine
    with pytest.raises(InternalError) as exc:
        await fs.create_directory(tdir / "a", recursive=False)
    assert exc.value.message == "File exists (os error 17)"
    with pytest.raises(NotFoundError):
        await fs.create_directory(tdir / "x" / "y", recursive=False)
    (tdir / "file").write_text("")
    with pytest.raises(InternalError) as exc:
        await fs.create_directory(tdir / "file", recursive=True)
    assert exc.value.message == "File exists (os error 17)"
    # An ancestor that exists as something else (a file, a dangling symlink) is
    # "File exists", as upstream's create_dir_all says, not "not found"; nothing made.
    (tdir / "dangling").symlink_to(tdir / "nowhere")
    for blocked, message in (
        (tdir / "file" / "x" / "y", "Not a directory (os error 20)"),
        (tdir / "dangling" / "x", "File exists (os error 17)"),
    ):
        with pytest.raises(InternalError) as exc:
            await fs.create_directory(blocked, recursive=True)
        assert exc.value.message == message
    assert not (tdir / "nowhere").exists()
    deep = tdir.joinpath(*["d"] * 1200)  # deeper than Python's recursion limit
    try:
        await fs.create_directory(deep)
        assert deep.is_dir()
    finally:
        while deep != tdir:  # bottom up: recursive removers hit the same limit
            with contextlib.suppress(FileNotFoundError):
                deep.rmdir()
            deep = deep.parent


async def test_remove_defaults_and_flags(fs: ExecutorFileSystem, tdir: Path) -> None:
    await fs.remove(tdir / "missing")  # force defaults to true
    with pytest.raises(NotFoundError):
        await fs.remove(tdir / "missing", force=False)
    (tdir / "tree" / "sub").mkdir(parents=True)
    (tdir / "tree" / "sub" / "f").write_text("x")
    with pytest.raises(InternalError) as exc:
        await fs.remove(tdir / "tree", recursive=False)
    assert exc.value.message == "Directory not empty (os error 39)"
    await fs.remove(tdir / "tree")  # recursive defaults to true
    assert not (tdir / "tree").exists()
    (tdir / "empty").mkdir()
    await fs.remove(tdir / "empty", recursive=False)
    assert not (tdir / "empty").exists()


async def test_read_directory_follows_symlinks_and_skips_dangling(
    fs: ExecutorFileSystem, tdir: Path
) -> None:
    (tdir / "d").mkdir()
    (tdir / "f").write_text("")
    (tdir / "to-d").symlink_to("d")
    (tdir / "to-f").symlink_to("f")
    (tdir / "dangling").symlink_to("missing")
    os.mkfifo(tdir / "pipe")
    entries = {e.file_name: (e.is_directory, e.is_file) for e in await fs.read_directory(tdir)}
    assert entries == {
        "d": (True, False),
        "f": (False, True),
        "to-d": (True, False),
        "to-f": (False, True),
        "pipe": (False, False),
    }


async def test_canonicalize(fs: ExecutorFileSystem, tdir: Path) -> None:
    (tdir / "real").mkdir()
    (tdir / "real" / "f").write_text("")
    (tdir / "alias").symlink_to("real")
    assert await fs.canonicalize(f"{tdir}/alias/f") == str(tdir / "real" / "f")
    with pytest.raises(NotFoundError):
        await fs.canonicalize(tdir / "missing")


async def test_read_follows_symlink_and_lexical_dotdot(fs: ExecutorFileSystem, tdir: Path) -> None:
    # `..` is applied lexically before any symlink is looked at (§5.2).
    (tdir / "a").mkdir()
    (tdir / "secret.txt").write_text("top")
    (tdir / "other" / "deep").mkdir(parents=True)
    (tdir / "a" / "link").symlink_to(tdir / "other" / "deep")
    # Physically a/link/.. is other/, lexically it is a/: a/secret.txt does not exist.
    with pytest.raises(NotFoundError):
        await fs.read_file(f"{tdir}/a/link/../secret.txt")
    assert await fs.read_file(f"{tdir}/a/../secret.txt") == b"top"


async def test_read_of_directory_is_not_a_file(fs: ExecutorFileSystem, tdir: Path) -> None:
    with pytest.raises(InvalidRequestError) as exc:
        await fs.read_file(tdir)
    assert exc.value.message == f"path `{tdir}` is not a file"


async def test_write_to_directory_is_internal_error(fs: ExecutorFileSystem, tdir: Path) -> None:
    with pytest.raises(InternalError) as exc:
        await fs.write_file(tdir, b"x")
    assert exc.value.message == "Is a directory (os error 21)"


async def test_file_used_as_directory(fs: ExecutorFileSystem, tdir: Path) -> None:
    (tdir / "f").write_text("")
    with pytest.raises(InternalError) as exc:
        await fs.read_file(tdir / "f" / "x")
    assert exc.value.message == "Not a directory (os error 20)"


async def test_a_symlink_loop_is_reported_in_upstreams_words(
    fs: ExecutorFileSystem, tdir: Path
) -> None:
    (tdir / "loop").symlink_to(tdir / "loop")
    for call in (fs.read_file, fs.get_metadata, fs.read_directory):
        with pytest.raises(InternalError) as exc:
            await call(tdir / "loop")
        assert exc.value.message == "Symbolic link loop (os error 40)"  # musl's text


async def test_read_of_a_fifo_or_device_is_not_a_file(fs: ExecutorFileSystem, tdir: Path) -> None:
    # Upstream 0.163.0's answer for anything but a regular file; the FIFO (no
    # writer) is refused without hanging.
    os.mkfifo(tdir / "pipe")
    for path in (tdir / "pipe", Path("/dev/null")):
        with pytest.raises(InvalidRequestError) as exc:
            await fs.read_file(path)
        assert exc.value.message == f"path `{path}` is not a file"


async def test_relative_path_is_invalid_params(fs: ExecutorFileSystem) -> None:
    from exec_server.exceptions import InvalidParamsError

    with pytest.raises(InvalidParamsError):
        await fs.read_file("relative/path.txt")
    with pytest.raises(InvalidParamsError):
        await fs.get_metadata("~/x")


async def test_non_utf8_names(fs: ExecutorFileSystem, tdir: Path) -> None:
    odd = os.fsencode(tdir) + b"/caf\xe9.txt"
    _write_raw(odd, b"latin-1 name")
    entries = [e.file_name for e in await fs.read_directory(tdir)]
    assert entries == ["caf\ufffd.txt"]
    # Reachable through a percent-encoded URI carrying the raw byte.
    uri = "file://" + str(tdir) + "/caf%E9.txt"
    assert await fs.read_file(uri) == b"latin-1 name"
    await fs.write_file(uri, b"rewritten")
    assert _read_raw(odd) == b"rewritten"


async def test_large_round_trip(fs: ExecutorFileSystem, tdir: Path) -> None:
    data = os.urandom(1 << 20) * 24  # 24 MiB
    await fs.write_file(tdir / "big.bin", data)
    assert (tdir / "big.bin").stat().st_size == len(data)
    assert await fs.read_file(tdir / "big.bin") == data
