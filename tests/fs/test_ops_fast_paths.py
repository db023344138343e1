"""Tree copies and removals (:mod:`exec_server.fs.fdops`, by way of :mod:`exec_server.fs.direct`).

The results match ``std::fs::copy`` (contents, exact permission bits whatever
the umask or default ACL), a merge overwrites carefully, kernel-side copies
that come up short or are refused still copy everything, and removal never
follows links out of the tree, at any depth.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exec_server.fs import direct as ops
from exec_server.fs import fdops
from exec_server.fs.errors import FsFailedError, FsRefusedError


@pytest.fixture
def tdir(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


MODES = (0o644, 0o666, 0o600, 0o755, 0o777, 0o000, 0o4755, 0o2750, 0o1777)
SIZES = (0, 1, 4096, 64 * 1024 + 1, 1024 * 1024 + 3)


def _make_source(src: Path) -> dict[str, bytes]:
    """A tree with every mode and size above; returns relative path -> contents."""
    contents: dict[str, bytes] = {}
    (src / "sub" / "deeper").mkdir(parents=True)
    for i, mode in enumerate(MODES):
        rel = f"sub/m{mode:o}"
        data = os.urandom(i * 7)
        (src / rel).write_bytes(data)
        os.chmod(src / rel, mode)
        contents[rel] = data
    for size in SIZES:
        rel = f"sub/deeper/s{size}"
        data = os.urandom(size)
        (src / rel).write_bytes(data)
        contents[rel] = data
    return contents


def _assert_same_tree(src: Path, dst: Path, contents: dict[str, bytes]) -> None:
    for rel, data in contents.items():
        assert (dst / rel).read_bytes() == data, rel
        assert _mode(dst / rel) == _mode(src / rel), rel


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o000])
def test_fresh_tree_copy_keeps_contents_and_exact_modes(tdir: Path, umask: int) -> None:
    src = tdir / "src"
    contents = _make_source(src)
    old = os.umask(umask)
    try:
        ops.copy(str(src), str(tdir / "new" / "missing" / "dst"), recursive=True)
    finally:
        os.umask(old)
    _assert_same_tree(src, tdir / "new" / "missing" / "dst", contents)


def _restrictive_default_acl() -> bytes:
    """``u::rwx,g::---,o::---`` in the kernel's ``posix_acl_xattr`` layout."""
    undefined = 0xFFFFFFFF
    entries = [(0x01, 7, undefined), (0x04, 0, undefined), (0x20, 0, undefined)]
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


def test_default_acl_is_not_mistaken_for_the_umask(tdir: Path, umask_022: None) -> None:
    """A default ACL, not the umask, shapes new files: modes are still copied exactly."""
    parent = tdir / "acl"
    parent.mkdir()
    try:
        os.setxattr(parent, "system.posix_acl_default", _restrictive_default_acl())
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.ENOTSUP):
            pytest.skip("filesystem without POSIX ACLs")
        raise
    probe = parent / "probe"
    probe.touch()
    assert _mode(probe) == 0o600  # the ACL really is in force here
    src = tdir / "src"
    contents = _make_source(src)
    ops.copy(str(src), str(parent / "dst"), recursive=True)
    _assert_same_tree(src, parent / "dst", contents)


def test_fresh_tree_copy_keeps_links_and_skips_special_files(tdir: Path) -> None:
    src = tdir / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f").write_text("data")
    (src / "d" / "rel").symlink_to("f")
    (src / "abs").symlink_to(tdir / "outside")
    (src / "dangling").symlink_to("nowhere")
    (src / "dirlink").symlink_to("d")
    os.mkfifo(src / "fifo")
    os.mkfifo(src / "d" / "fifo")
    dst = tdir / "dst"
    ops.copy(str(src), str(dst), recursive=True)
    assert (dst / "d" / "f").read_text() == "data"
    assert os.readlink(dst / "d" / "rel") == "f"
    assert os.readlink(dst / "abs") == str(tdir / "outside")
    assert os.readlink(dst / "dangling") == "nowhere"
    assert os.readlink(dst / "dirlink") == "d"
    assert sorted(os.listdir(dst)) == ["abs", "d", "dangling", "dirlink"]
    assert sorted(os.listdir(dst / "d")) == ["f", "rel"]


def test_merge_creates_new_subdirectories_with_the_fast_path(tdir: Path, umask_022: None) -> None:
    """A new subdirectory inside a merged destination is filled like a fresh tree."""
    src = tdir / "src"
    contents = _make_source(src)
    (src / "top").write_text("new")
    dst = tdir / "dst"
    dst.mkdir()
    (dst / "top").write_text("a much longer old text")
    (dst / "keep").write_text("kept")
    ops.copy(str(src), str(dst), recursive=True)
    _assert_same_tree(src, dst, contents)
    assert (dst / "top").read_text() == "new"
    assert (dst / "keep").read_text() == "kept"


def test_existing_names_in_the_destination_are_overwritten_carefully(tdir: Path) -> None:
    """Entries already in a merged destination are overwritten carefully: a longer
    file is truncated, a hard link of the source is refused."""
    src = tdir / "src"
    src.mkdir()
    (src / "short").write_text("new")
    (src / "same").write_text("must survive")
    os.chmod(src / "short", 0o640)
    dst = tdir / "dst"
    dst.mkdir()
    (dst / "short").write_text("old and much longer")
    os.chmod(dst / "short", 0o666)
    os.link(src / "same", dst / "same")
    with pytest.raises(FsRefusedError):
        ops.copy(str(src), str(dst), recursive=True)
    assert (src / "same").read_text() == "must survive"
    os.unlink(dst / "same")
    ops.copy(str(src), str(dst), recursive=True)
    assert (dst / "short").read_text() == "new"
    assert _mode(dst / "short") == 0o640
    assert (dst / "same").read_text() == "must survive"


def test_tree_root_that_is_a_file_is_refused(tdir: Path) -> None:
    (tdir / "src").mkdir()
    (tdir / "file").write_text("x")
    with pytest.raises(FsFailedError):
        ops.copy(str(tdir / "src"), str(tdir / "file"), recursive=True)
    assert (tdir / "file").read_text() == "x"
    with pytest.raises(FsFailedError):
        ops.copy(str(tdir / "src"), str(tdir / "file" / "below"), recursive=True)


def test_tree_root_through_a_symlinked_directory_is_merged(tdir: Path) -> None:
    (tdir / "src").mkdir()
    (tdir / "src" / "f").write_text("x")
    (tdir / "real").mkdir()
    (tdir / "alias").symlink_to("real")
    ops.copy(str(tdir / "src"), str(tdir / "alias"), recursive=True)
    assert (tdir / "real" / "f").read_text() == "x"


@pytest.mark.parametrize("size", SIZES)
def test_single_file_copy_contents_and_mode(tdir: Path, size: int) -> None:
    data = os.urandom(size)
    (tdir / "src").write_bytes(data)
    os.chmod(tdir / "src", 0o751)
    (tdir / "longer").write_bytes(b"z" * (size + 100))
    for dst in ("new", "longer"):
        ops.copy(str(tdir / "src"), str(tdir / dst), recursive=False)
        assert (tdir / dst).read_bytes() == data
        assert _mode(tdir / dst) == 0o751


def test_copy_of_a_file_whose_size_is_zero_reads_to_eof(tdir: Path) -> None:
    """``/proc`` files report ``st_size`` 0 yet have contents."""
    ops.copy("/proc/self/status", str(tdir / "status"), recursive=False)
    assert b"Umask:" in (tdir / "status").read_bytes()


def test_copy_contents_falls_back_when_copy_file_range_is_refused(
    tdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused: list[int] = []

    def refuse(src: int, dst: int, count: int) -> int:
        refused.append(count)
        raise OSError(errno.EXDEV, "cross-device")

    monkeypatch.setattr(os, "copy_file_range", refuse)
    data = os.urandom(200_000)
    (tdir / "src").mkdir()
    (tdir / "src" / "f").write_bytes(data)
    ops.copy(str(tdir / "src"), str(tdir / "dst"), recursive=True)
    assert (tdir / "dst" / "f").read_bytes() == data
    assert refused  # the fallback really ran


def test_copy_contents_continues_after_a_short_copy(
    tdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A short ``copy_file_range`` before the known size is not taken for EOF."""
    real = os.copy_file_range
    calls: list[int] = []

    def dribble(src: int, dst: int, count: int) -> int:
        calls.append(count)
        return real(src, dst, min(count, 1000))

    monkeypatch.setattr(os, "copy_file_range", dribble)
    data = os.urandom(4500)
    (tdir / "f").write_bytes(data)
    ops.copy(str(tdir / "f"), str(tdir / "g"), recursive=False)
    assert (tdir / "g").read_bytes() == data
    assert len(calls) >= 5  # 1000 bytes at a time


def test_remove_tree_leaves_link_targets_outside_intact(tdir: Path) -> None:
    outside = tdir / "outside"
    (outside / "inner").mkdir(parents=True)
    (outside / "inner" / "keep").write_text("keep")
    (outside / "file").write_text("file")
    root = tdir / "root"
    (root / "a" / "b").mkdir(parents=True)
    (root / "to-dir").symlink_to(outside)
    (root / "a" / "to-inner").symlink_to(outside / "inner")
    (root / "a" / "b" / "to-file").symlink_to(outside / "file")
    (root / "a" / "b" / "x").write_text("x")
    (root / "a" / "c" / "d").mkdir(parents=True)
    (root / "a" / "c" / "d" / "y").write_text("y")
    os.mkfifo(root / "a" / "fifo")
    before = len(os.listdir("/proc/self/fd"))
    ops.remove(str(root), recursive=True, force=False)
    assert len(os.listdir("/proc/self/fd")) == before
    assert not root.exists()
    assert (outside / "inner" / "keep").read_text() == "keep"
    assert (outside / "file").read_text() == "file"


def test_remove_of_a_link_to_a_directory_removes_only_the_link(tdir: Path) -> None:
    (tdir / "real").mkdir()
    (tdir / "real" / "f").write_text("x")
    (tdir / "link").symlink_to("real")
    ops.remove(str(tdir / "link"), recursive=True, force=False)
    assert not (tdir / "link").is_symlink()
    assert (tdir / "real" / "f").read_text() == "x"


def test_remove_subdirectory_replaced_by_a_link_unlinks_the_link(tdir: Path) -> None:
    """Listed as a directory, swapped for a link before we open it: the link goes,
    its target stays (``O_NOFOLLOW``), at the top and further down."""
    (tdir / "outside").mkdir()
    (tdir / "outside" / "keep").write_text("keep")
    (tdir / "root" / "deeper").mkdir(parents=True)
    (tdir / "root" / "sub").symlink_to(tdir / "outside")
    fd = os.open(tdir / "root", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fdops.remove_tree_at(fd, "sub")
        assert os.listdir(tdir / "root") == ["deeper"]
        # Deeper down: the listing says directory, the open finds a link.
        (tdir / "root" / "deeper" / "sub").symlink_to(tdir / "outside")
        listed = fdops._unlink_files

        def listed_as_directory(dir_fd: int) -> list[str]:
            swapped = os.path.islink(f"/proc/self/fd/{dir_fd}/sub")
            return listed(dir_fd) + (["sub"] if swapped else [])

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(fdops, "_unlink_files", listed_as_directory)
            fdops.remove_tree_at(fd, "deeper")
    finally:
        os.close(fd)
    assert os.listdir(tdir / "root") == []
    assert (tdir / "outside" / "keep").read_text() == "keep"


def test_remove_tree_of_any_depth(tdir: Path) -> None:
    """Deeper than Python's recursion limit (the recursive walk failed at ~500
    levels with RecursionError): removed, links at every level not followed, no
    descriptor left open."""
    (tdir / "outside").mkdir()
    (tdir / "outside" / "keep").write_text("keep")
    root = tdir / "root"
    root.mkdir()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    level = fd
    try:
        for i in range(1200):  # made through descriptors: no PATH_MAX limit
            os.mkdir("d", dir_fd=level)
            os.symlink(tdir / "outside", "link", dir_fd=level)
            os.close(os.open(f"f{i}", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=level))
            below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=level)
            if level != fd:
                os.close(level)
            level = below
    finally:
        if level != fd:
            os.close(level)
        os.close(fd)
    before = len(os.listdir("/proc/self/fd"))
    try:
        ops.remove(str(root), recursive=True, force=False)
    finally:
        if root.exists():  # leave nothing pytest's own (recursive) clean-up cannot remove
            parent = os.open(tdir, os.O_RDONLY | os.O_DIRECTORY)
            try:
                fdops.remove_tree_at(parent, "root")
            finally:
                os.close(parent)
    assert not root.exists()
    assert len(os.listdir("/proc/self/fd")) == before
    assert (tdir / "outside" / "keep").read_text() == "keep"


def test_remove_tree_where_unlinking_a_directory_is_eperm(
    tdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The walk unlinks every name and descends where the kernel refuses a
    directory. Linux says ``EISDIR``; macOS says ``EPERM``, which is also what
    Linux says for a file it protects. Simulated here: directories answer
    ``EPERM`` and are still removed; a file that answers ``EPERM`` stops the
    removal with that error, and stays."""
    root = tdir / "root"
    (root / "a" / "b").mkdir(parents=True)
    for name in ("x", "a/y", "a/b/z", "a/b/protected"):
        (root / name).write_text(name)
    real_unlink = os.unlink
    protect = True

    def unlink(path: str, *, dir_fd: int | None = None) -> None:
        st = os.lstat(path, dir_fd=dir_fd)
        if stat.S_ISDIR(st.st_mode) or (protect and path == "protected"):
            raise PermissionError(errno.EPERM, "Operation not permitted", path)
        real_unlink(path, dir_fd=dir_fd)

    monkeypatch.setattr(os, "unlink", unlink)
    with pytest.raises(FsRefusedError, match="not permitted"):
        ops.remove(str(root), recursive=True, force=False)
    assert (root / "a" / "b" / "protected").read_text() == "a/b/protected"
    protect = False
    ops.remove(str(root), recursive=True, force=False)
    assert not root.exists()


_TREE_ENTRY = st.tuples(
    st.lists(st.sampled_from("abc"), min_size=0, max_size=3),  # parent directories
    st.sampled_from(["file", "dir", "link-out", "link-in", "fifo"]),
)


@settings(max_examples=40, deadline=None)
@given(entries=st.lists(_TREE_ENTRY, max_size=25))
def test_remove_of_any_small_tree_removes_it_all_and_nothing_outside(
    entries: list[tuple[list[str], str]],
) -> None:
    """Files, directories, FIFOs and links (out of the tree, and inside it) at any
    depth: the tree is gone, what the links
    point to outside is intact, no descriptor is left open."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="rmprop-"))
    try:
        (base / "outside").mkdir()
        (base / "outside" / "keep").write_text("keep")
        root = base / "root"
        root.mkdir()
        for i, (parents, kind) in enumerate(entries):
            where = root.joinpath(*parents)
            where.mkdir(parents=True, exist_ok=True)
            name = where / f"e{i}"
            if kind == "file":
                name.write_bytes(b"x" * i)
            elif kind == "dir":
                name.mkdir()
            elif kind == "link-out":
                name.symlink_to(base / "outside")
            elif kind == "link-in":
                name.symlink_to(root)
            else:
                os.mkfifo(name)
        before = len(os.listdir("/proc/self/fd"))
        ops.remove(str(root), recursive=True, force=False)
        assert not root.exists()
        assert len(os.listdir("/proc/self/fd")) == before
        assert (base / "outside" / "keep").read_text() == "keep"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_remove_tree_that_vanishes_meanwhile_is_fine(tdir: Path) -> None:
    (tdir / "root").mkdir()
    fd = os.open(tdir / "root", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fdops.remove_tree_at(fd, "gone")  # already gone: nothing to do
    finally:
        os.close(fd)
    ops.remove(str(tdir / "root"), recursive=True, force=False)
    assert not (tdir / "root").exists()


def test_fresh_tree_copy_continues_after_a_short_first_copy(
    tdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.copy_file_range

    def dribble(src: int, dst: int, count: int) -> int:
        return real(src, dst, min(count, 1000))

    monkeypatch.setattr(os, "copy_file_range", dribble)
    data = os.urandom(4500)
    (tdir / "src").mkdir()
    (tdir / "src" / "f").write_bytes(data)
    ops.copy(str(tdir / "src"), str(tdir / "dst"), recursive=True)
    assert (tdir / "dst" / "f").read_bytes() == data


@pytest.mark.parametrize("recursive", [True, False])
def test_copy_follows_a_file_that_grew_since_its_fstat(
    tdir: Path, monkeypatch: pytest.MonkeyPatch, recursive: bool
) -> None:
    """The size-hinted first call copies ``size + 1`` bytes: that is not EOF."""
    real = os.copy_file_range
    (tdir / "src").mkdir()
    source = tdir / "src" / "f"
    source.write_bytes(b"a" * 100)
    grown: list[bool] = []

    def grow_first(src: int, dst: int, count: int) -> int:
        if not grown:
            grown.append(True)
            with open(source, "ab") as f:
                f.write(b"b" * 5000)
        return real(src, dst, count)

    monkeypatch.setattr(os, "copy_file_range", grow_first)
    if recursive:
        ops.copy(str(tdir / "src"), str(tdir / "dst"), recursive=True)
        copied = tdir / "dst" / "f"
    else:
        copied = tdir / "copy"
        ops.copy(str(source), str(copied), recursive=False)
    assert copied.read_bytes() == b"a" * 100 + b"b" * 5000


# ------------------------------------------------ copy into itself, resolved


def test_copy_into_itself_with_a_name_that_looks_deleted(tdir: Path) -> None:
    # /proc marks an unlinked directory with this suffix: a real name that ends
    # the same way is still resolved.
    (tdir / "x (deleted)").mkdir()
    with pytest.raises(FsRefusedError):
        ops.copy(str(tdir / "x (deleted)"), str(tdir / "x (deleted)" / "in"), recursive=True)
    assert not (tdir / "x (deleted)" / "in").exists()


def test_copy_into_itself_is_found_through_every_spelling(tdir: Path) -> None:
    (tdir / "source" / "nested").mkdir(parents=True)
    (tdir / "alias").symlink_to(tdir / "source")
    (tdir / "into").symlink_to(tdir / "source" / "nested")
    (tdir / "elsewhere").mkdir()
    source = str(tdir / "source")
    refused = [
        source,  # itself
        str(tdir / "source" / "nested"),  # an existing descendant
        str(tdir / "source" / "nested" / "new"),  # a new name inside it
        str(tdir / "into" / "new"),  # through a link to a descendant
        str(tdir / "into"),  # a link to a descendant, merged into
        str(tdir / "source" / "missing" / "deeper"),  # several missing levels
    ]
    for destination in refused:
        assert ops._copies_into_itself(source, destination), destination
        assert ops._copies_into_itself(str(tdir / "alias"), destination), destination
    allowed = [
        str(tdir / "source-copy"),  # a sibling whose name starts the same
        str(tdir / "elsewhere" / "copy"),
        str(tdir / "missing" / "deeper"),
    ]
    for destination in allowed:
        assert not ops._copies_into_itself(source, destination), destination
    with pytest.raises(FsRefusedError):
        ops.copy(source, str(tdir / "into" / "new"), recursive=True)
    assert not (tdir / "source" / "nested" / "new").exists()
    ops.copy(source, str(tdir / "source-copy"), recursive=True)
    assert (tdir / "source-copy" / "nested").is_dir()


