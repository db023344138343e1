"""Library-level checks of fs/ops and fs/errors: atomic writes, error mapping, off-loop work."""

from __future__ import annotations

import asyncio
import errno
import os
import struct
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from exec_server.errno_text import os_error_text
from exec_server.exceptions import (
    InternalError,
    InvalidRequestError,
    NotFoundError,
    from_domain_error,
)
from exec_server.fs import direct as ops
from exec_server.fs.errors import (
    FsFailedError,
    FsNotFoundError,
    FsRefusedError,
    fs_error_from_os,
)
from exec_server.fs.service import FileSystemService

#: the fs package's error for each wire error (the mapper turns one into the other)
_DOMAIN = {
    NotFoundError: FsNotFoundError,
    InvalidRequestError: FsRefusedError,
    InternalError: FsFailedError,
}


@pytest.mark.parametrize(
    ("code", "cls", "wire"),
    [
        (errno.ENOENT, NotFoundError, -32004),
        (errno.EACCES, InvalidRequestError, -32600),
        (errno.EPERM, InvalidRequestError, -32600),
        (errno.EINVAL, InvalidRequestError, -32600),
        (errno.EROFS, InternalError, -32603),
        (errno.EISDIR, InternalError, -32603),
        (errno.ENOTDIR, InternalError, -32603),
        (errno.EEXIST, InternalError, -32603),
        (errno.ENOTEMPTY, InternalError, -32603),
        (errno.EIO, InternalError, -32603),
    ],
)
def test_error_mapping(code: int, cls: type[Exception], wire: int) -> None:
    err = fs_error_from_os(OSError(code, os.strerror(code), "/some/path"))
    assert type(err) is _DOMAIN[cls]
    mapped = from_domain_error(err)
    assert type(mapped) is cls and mapped.code == wire and mapped.message == err.message
    assert err.message == os_error_text(code)
    if code == errno.EIO:
        assert err.message == "I/O error (os error 5)"  # musl's text, as CLIENT_COMPAT §6.5


def test_permission_denied_message_texts() -> None:
    assert fs_error_from_os(PermissionError(13, "x")).message == "Permission denied (os error 13)"
    assert fs_error_from_os(PermissionError(1, "x")).message == (
        "Operation not permitted (os error 1)"
    )


def test_failed_write_keeps_the_complete_file(
    write_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = write_dir / "data.txt"
    target.write_bytes(b"complete old contents")
    real_write = os.write
    calls = 0

    def failing_write(fd: int, data: bytes | memoryview) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            return real_write(fd, bytes(data)[:3])  # a partial write first
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", failing_write)
    with pytest.raises(FsFailedError) as exc:
        ops.write_file(str(target), b"new contents that never fully land")
    monkeypatch.undo()
    assert exc.value.message == "No space left on device (os error 28)"
    assert target.read_bytes() == b"complete old contents"
    assert sorted(p.name for p in write_dir.iterdir()) == ["data.txt"]  # temp file cleaned up


def test_write_preserves_mode_and_replaces_link_target(write_dir: Path) -> None:
    target = write_dir / "script.sh"
    target.write_text("old")
    os.chmod(target, 0o754)
    ops.write_file(str(target), b"new")
    assert target.read_bytes() == b"new"
    assert target.stat().st_mode & 0o7777 == 0o754

    link = write_dir / "link"
    link.symlink_to("script.sh")
    ops.write_file(str(link), b"through link")
    assert link.is_symlink()
    assert target.read_bytes() == b"through link"
    assert target.stat().st_mode & 0o7777 == 0o754

    dangling = write_dir / "dangling"
    dangling.symlink_to("created-by-write")
    ops.write_file(str(dangling), b"made")
    assert dangling.is_symlink()
    assert (write_dir / "created-by-write").read_bytes() == b"made"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand files to other owners")
def test_write_keeps_owner_group_and_special_bits_in_a_setgid_directory(write_dir: Path) -> None:
    # A set-group-ID directory gives the replacement file the directory's group; the
    # old file's group (and its set-user-ID bit, which chown would clear) must survive,
    # as they do for upstream's write in place.
    shared = write_dir / "shared"
    shared.mkdir()
    os.chown(shared, 0, 4242)
    os.chmod(shared, 0o2775)
    for name, (uid, gid, mode) in {"tool": (0, 0, 0o4750), "users": (1234, 5678, 0o644)}.items():
        target = shared / name
        target.write_text("old")
        os.chown(target, uid, gid)
        os.chmod(target, mode)
        ops.write_file(str(target), b"new")
        st = target.stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (uid, gid, mode), name
        assert target.read_bytes() == b"new"


def _acl(*entries: tuple[int, int, int]) -> bytes:
    """A ``system.posix_acl_*`` value: version 2, then (tag, perm, id) entries."""
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


_NO_ID = 0xFFFFFFFF
SetXattr = Callable[[Path, str, bytes], None]
#: user::rw- user:1234:rw- group::r-- mask::rw- other::r--
_ACCESS_ACL = _acl((0x01, 6, _NO_ID), (0x02, 6, 1234), (0x04, 4, _NO_ID), (0x10, 6, _NO_ID),
                   (0x20, 4, _NO_ID))


def test_write_keeps_extended_attributes_and_acl(write_dir: Path, set_xattr: SetXattr) -> None:
    target = write_dir / "shared.txt"
    target.write_text("old")
    set_xattr(target, "user.origin", b"kept")
    set_xattr(target, "system.posix_acl_access", _ACCESS_ACL)
    before = target.stat()
    ops.write_file(str(target), b"new")
    after = target.stat()
    assert after.st_ino != before.st_ino  # replaced, and still the same file to its users
    assert os.getxattr(target, "user.origin") == b"kept"
    assert os.getxattr(target, "system.posix_acl_access") == _ACCESS_ACL
    assert after.st_mode == before.st_mode
    assert target.read_bytes() == b"new"


def test_write_does_not_take_the_directory_default_acl(
    write_dir: Path, set_xattr: SetXattr
) -> None:
    # A new file in a directory with a default ACL gets an access ACL from it; the
    # rewritten file had none and must not gain one (nor its group bits).
    target = write_dir / "plain.txt"
    target.write_text("old")
    os.chmod(target, 0o600)
    set_xattr(write_dir, "system.posix_acl_default", _ACCESS_ACL)
    ops.write_file(str(target), b"new")
    assert "system.posix_acl_access" not in os.listxattr(target)
    assert target.stat().st_mode & 0o7777 == 0o600
    assert target.read_bytes() == b"new"


def _refuse(*args: object, **kwargs: object) -> None:
    raise PermissionError(errno.EPERM, "Operation not permitted")


@pytest.mark.parametrize("what", ["owner", "attribute"])
def test_write_in_place_when_the_new_file_cannot_match_the_old(
    write_dir: Path, monkeypatch: pytest.MonkeyPatch, set_xattr: SetXattr, what: str
) -> None:
    # Without the right to chown (a non-root server, another user's file) or to set
    # one of the file's attributes, a replacement would hand the file to us or drop
    # the attribute: it is written in place instead.
    target = write_dir / "theirs"
    target.write_text("old")
    os.chmod(target, 0o640)
    set_xattr(target, "user.label", b"x")
    before = target.stat()
    if what == "owner":
        real_fstat = os.fstat

        def fstat_as_other_owner(fd: int) -> os.stat_result:
            st = real_fstat(fd)
            if st.st_ino == before.st_ino:
                return st
            fields = list(st)
            fields[4] = st.st_uid + 1  # the new file looks like someone else's
            return os.stat_result(fields)

        monkeypatch.setattr(os, "fstat", fstat_as_other_owner)
        monkeypatch.setattr(os, "fchown", _refuse)
    else:
        monkeypatch.setattr(os, "setxattr", _refuse)
    ops.write_file(str(target), b"new")
    after = target.stat()
    assert after.st_ino == before.st_ino
    assert after.st_mode & 0o7777 == 0o640
    assert os.getxattr(target, "user.label") == b"x"
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in write_dir.iterdir()) == ["theirs"]


def test_write_skips_chmod_when_the_new_file_has_the_mode(
    write_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = write_dir / "plain"
    target.write_text("old")
    old_umask = os.umask(0o022)
    try:
        os.chmod(target, 0o644)
        calls: list[int] = []
        real_fchmod = os.fchmod

        def fchmod(fd: int, mode: int) -> None:
            calls.append(mode)
            real_fchmod(fd, mode)

        monkeypatch.setattr(os, "fchmod", fchmod)
        ops.write_file(str(target), b"same mode")
        assert calls == []  # 0o666 & ~0o022 is already the old mode
        os.chmod(target, 0o600)
        ops.write_file(str(target), b"other mode")
        assert calls == [0o600]
    finally:
        os.umask(old_umask)
    assert target.stat().st_mode & 0o7777 == 0o600
    assert target.read_bytes() == b"other mode"


def test_write_new_file_honours_umask(write_dir: Path) -> None:
    old = os.umask(0o027)
    try:
        ops.write_file(str(write_dir / "new"), b"x")
    finally:
        os.umask(old)
    assert (write_dir / "new").stat().st_mode & 0o777 == 0o640


def test_write_to_character_device_is_in_place() -> None:
    ops.write_file("/dev/null", b"discarded")
    assert os.path.exists("/dev/null")
    assert os.path.isdir("/dev/null") is False


def test_read_is_capped_even_without_size(tdir: Path) -> None:
    with pytest.raises(FsRefusedError) as exc:
        ops.read_file("/dev/zero", limit=1024)
    assert exc.value.message == "file is too large to read: limit is 1024 bytes"
    (tdir / "f").write_bytes(b"x" * 2048)
    with pytest.raises(FsRefusedError):
        ops.read_file(str(tdir / "f"), limit=1024)


def test_copy_file_onto_itself_is_refused(tdir: Path) -> None:
    (tdir / "f").write_text("keep me")
    (tdir / "alias").symlink_to("f")
    os.link(tdir / "f", tdir / "hard")
    for onto in ("alias", "hard", "f"):
        with pytest.raises(FsRefusedError):
            ops.copy(str(tdir / "f"), str(tdir / onto), recursive=False)
    assert (tdir / "f").read_text() == "keep me"


def test_copy_onto_fifo_fails_instead_of_hanging(tdir: Path) -> None:
    (tdir / "f").write_text("x")
    os.mkfifo(tdir / "pipe")
    with pytest.raises(FsFailedError) as exc:
        ops.copy(str(tdir / "f"), str(tdir / "pipe"), recursive=False)
    assert exc.value.message == "No such device or address (os error 6)"


def test_copy_overwrites_longer_destination(tdir: Path) -> None:
    (tdir / "short").write_text("new")
    (tdir / "long").write_text("old and much longer")
    ops.copy(str(tdir / "short"), str(tdir / "long"), recursive=False)
    assert (tdir / "long").read_text() == "new"


def test_resolve_existing_prefix(tdir: Path) -> None:
    (tdir / "real").mkdir()
    (tdir / "alias").symlink_to("real")
    assert ops.resolve_existing_prefix(f"{tdir}/alias/x/y") == f"{tdir}/real/x/y"
    (tdir / "dangling").symlink_to("nowhere")
    assert ops.resolve_existing_prefix(f"{tdir}/dangling/z") == f"{tdir}/dangling/z"


async def test_blocking_work_runs_off_the_event_loop(
    tdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long copy must not stall other requests: hold one copy inside its worker
    thread and check that other filesystem calls complete meanwhile."""
    (tdir / "src").mkdir()
    (tdir / "src" / "f").write_text("x")
    entered = threading.Event()
    release = threading.Event()
    real_copy_tree = ops._copy_tree

    def slow_copy_tree(source: str, destination: str) -> None:
        entered.set()
        assert release.wait(timeout=30)
        real_copy_tree(source, destination)

    monkeypatch.setattr(ops, "_copy_tree", slow_copy_tree)
    service = FileSystemService()
    copy_task = asyncio.create_task(
        service.copy(str(tdir / "src"), str(tdir / "dst"), recursive=True)
    )
    try:
        assert await asyncio.to_thread(entered.wait, 30)
        # The copy is blocked in its thread; the loop still serves these.
        meta = await asyncio.wait_for(service.get_metadata(str(tdir / "src" / "f")), 30)
        assert meta.is_file
        await asyncio.wait_for(service.write_file(str(tdir / "other"), b"served"), 30)
        assert not copy_task.done()
    finally:
        release.set()
    await asyncio.wait_for(copy_task, 30)
    assert (tdir / "dst" / "f").read_text() == "x"
    assert (tdir / "other").read_bytes() == b"served"


def test_replace_swaps_in_a_new_inode_and_leaves_no_temp(write_dir: Path) -> None:
    target = write_dir / "data.txt"
    target.write_bytes(b"old")
    os.chmod(target, 0o640)
    keeper = write_dir / "hardlink"
    os.link(target, keeper)
    ops.write_file(str(target), b"new contents")
    assert target.read_bytes() == b"new contents"
    assert target.stat().st_mode & 0o7777 == 0o640
    assert keeper.read_bytes() == b"old"  # the old inode lives on under its other name
    assert sorted(p.name for p in write_dir.iterdir()) == ["data.txt", "hardlink"]


@pytest.mark.parametrize("size", [0, 10, 64 * 1024, 64 * 1024 + 1, 3 * 1024 * 1024])
async def test_service_read_inline_and_in_worker_closes_descriptors(
    tdir: Path, size: int
) -> None:
    """Small regular files are read inline, others in a worker: same bytes, no fd left open."""
    target = tdir / "f.bin"
    data = os.urandom(size)
    target.write_bytes(data)
    service = FileSystemService()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        assert await asyncio.wait_for(service.read_file(str(target)), 30) == data
    with pytest.raises(FsFailedError):
        await asyncio.wait_for(service.read_file(str(tdir)), 30)
    assert len(os.listdir("/proc/self/fd")) == before


def test_remove_tree_deletes_nested_entries_without_following_links(tdir: Path) -> None:
    outside = tdir / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    root = tdir / "root"
    deep = root / "a" / "b" / "c"
    deep.mkdir(parents=True)
    (deep / "f").write_text("x")
    (root / "a" / "g").write_text("y")
    (root / "a" / "b" / "link-dir").symlink_to(outside)
    (root / "dangling").symlink_to(tdir / "nowhere")
    os.mkfifo(root / "a" / "fifo")
    ops.remove(str(root), recursive=True, force=False)
    assert not root.exists()
    assert (outside / "keep.txt").read_text() == "keep"
    ops.remove(str(root), recursive=True, force=True)  # already gone: fine with force


def test_copy_tree_merges_keeps_links_and_modes(tdir: Path) -> None:
    src = tdir / "src"
    (src / "sub" / "deeper").mkdir(parents=True)
    (src / "sub" / "deeper" / "x.sh").write_text("run")
    os.chmod(src / "sub" / "deeper" / "x.sh", 0o750)
    (src / "sub" / "link").symlink_to("deeper/x.sh")
    (src / "top.txt").write_text("top")
    os.mkfifo(src / "fifo")
    dst = tdir / "dst"
    (dst / "sub").mkdir(parents=True)
    (dst / "sub" / "existing").write_text("stays")
    (dst / "top.txt").write_text("a longer old text that must be replaced")
    ops.copy(str(src), str(dst), recursive=True)
    assert (dst / "top.txt").read_text() == "top"
    assert (dst / "sub" / "existing").read_text() == "stays"
    assert (dst / "sub" / "deeper" / "x.sh").read_text() == "run"
    assert (dst / "sub" / "deeper" / "x.sh").stat().st_mode & 0o7777 == 0o750
    assert os.readlink(dst / "sub" / "link") == "deeper/x.sh"
    assert not (dst / "fifo").exists()
    (dst / "blocker").write_text("file")
    (src / "blocker").mkdir()
    with pytest.raises(FsFailedError):
        ops.copy(str(src), str(dst), recursive=True)  # a file where a directory goes


@pytest.mark.parametrize("link_to", ["nowhere", "self"])
def test_copy_tree_meeting_a_broken_link_where_a_directory_goes_says_file_exists(
    tdir: Path, link_to: str
) -> None:
    """Upstream's create_dir_all answers "File exists" when the place holds a link
    leading nowhere (or to itself); we used to report the link's own error (-32004,
    or a symbolic link loop). Found by the random differential test."""
    src = tdir / "src"
    (src / "e").mkdir(parents=True)
    (src / "e" / "f").write_text("f")
    dst = tdir / "dst"
    dst.mkdir()
    (dst / "e").symlink_to("e" if link_to == "self" else "nowhere")
    with pytest.raises(FsFailedError) as exc:
        ops.copy(str(src), str(dst), recursive=True)
    assert exc.value.message == "File exists (os error 17)"
    assert os.readlink(dst / "e") == ("e" if link_to == "self" else "nowhere")  # left alone
    # A link to a directory is merged into, as before.
    (tdir / "real").mkdir()
    (dst / "e").unlink()
    (dst / "e").symlink_to(tdir / "real")
    ops.copy(str(src), str(dst), recursive=True)
    assert (tdir / "real" / "f").read_text() == "f"


def test_result_values_are_immutable_comparable_and_hashable(tdir: Path) -> None:
    # Metadata, DirEntry and WirePath are msgspec Structs (cheap to build: they are
    # made per request and per directory entry); they keep the frozen-value contract.
    from exec_server.protocol.paths import PathForm, WirePath

    (tdir / "f").write_bytes(b"abc")
    meta = ops.get_metadata(str(tdir / "f"))
    assert meta == ops.Metadata(
        is_directory=False,
        is_file=True,
        is_symlink=False,
        size=3,
        created_at_ms=meta.created_at_ms,
        modified_at_ms=meta.modified_at_ms,
    )
    entry = ops.read_directory(str(tdir))[0]
    assert entry == ops.DirEntry("f", False, True)
    assert repr(entry) == "DirEntry(file_name='f', is_directory=False, is_file=True)"
    path = WirePath("/a", PathForm.URI)
    assert path.render() == "file:///a"
    assert len({meta, entry, path, WirePath("/a", PathForm.URI)}) == 3
    for value, field in ((meta, "size"), (entry, "is_file"), (path, "path")):
        with pytest.raises(AttributeError):
            setattr(value, field, None)
