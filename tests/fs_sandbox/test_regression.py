"""PROTOCOL.md §15.6 sandboxed regression suite (tests 23-35), on every confinement path.

Runs for the zygote on the local and remote client backends and for the
one-shot helper under bwrap and under the Landlock launcher (see conftest).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from exec_server.client.fs import ExecutorFileSystem
from exec_server.exceptions import ExecServerError, InvalidRequestError, NotFoundError

DENIAL_TEXTS = ("is not permitted", "Operation not permitted", "Permission denied")


def assert_denied(exc: BaseException) -> None:
    assert isinstance(exc, InvalidRequestError), exc
    assert exc.code == -32600
    assert any(text in exc.message for text in DENIAL_TEXTS), exc.message


async def test_read_allows_readable_root(fs: ExecutorFileSystem, layout: Any, ctx: Any) -> None:
    (layout.allowed / "note.txt").write_text("sandboxed hello")
    data = await fs.read_file(layout.allowed / "note.txt", sandbox=ctx.ro(layout.allowed))
    assert data == b"sandboxed hello"


async def test_write_rejects_unwritable_path(fs: ExecutorFileSystem, layout: Any, ctx: Any) -> None:
    blocked = layout.root / "blocked.txt"
    with pytest.raises(ExecServerError) as info:
        await fs.write_file(blocked, b"nope", sandbox=ctx.ro(layout.allowed))
    assert_denied(info.value)
    assert info.value.message == f"{blocked} is not permitted by filesystem sandbox"
    assert not blocked.exists()


async def test_read_rejects_symlink_escape(fs: ExecutorFileSystem, layout: Any, ctx: Any) -> None:
    (layout.outside / "secret.txt").write_text("secret")
    with pytest.raises(ExecServerError) as info:
        await fs.read_file(layout.link / "secret.txt", sandbox=ctx.ro(layout.allowed))
    assert_denied(info.value)
    # The message names the resolved path, not the requested one (§10.2).
    assert str(layout.outside / "secret.txt") in info.value.message


async def test_read_rejects_symlink_parent_dotdot_escape(
    fs: ExecutorFileSystem, layout: Any, ctx: Any
) -> None:
    (layout.root / "secret.txt").write_text("secret")
    # ``link/../secret.txt`` is normalised lexically to ``allowed/secret.txt``.
    path = str(layout.link) + "/../secret.txt"
    with pytest.raises(ExecServerError) as info:
        await fs.read_file(path, sandbox=ctx.ro(layout.allowed))
    if isinstance(info.value, NotFoundError):
        assert "No such file or directory" in info.value.message
    else:
        assert_denied(info.value)


async def test_write_rejects_symlink_escape(fs: ExecutorFileSystem, layout: Any, ctx: Any) -> None:
    with pytest.raises(ExecServerError) as info:
        await fs.write_file(layout.link / "blocked.txt", b"x", sandbox=ctx.ww(layout.allowed))
    assert_denied(info.value)
    assert not (layout.outside / "blocked.txt").exists()


async def test_create_directory_rejects_symlink_escape(
    fs: ExecutorFileSystem, layout: Any, ctx: Any
) -> None:
    with pytest.raises(ExecServerError) as info:
        await fs.create_directory(
            layout.link / "created", recursive=False, sandbox=ctx.ww(layout.allowed)
        )
    assert_denied(info.value)
    assert not (layout.outside / "created").exists()


async def test_get_metadata_rejects_symlink_escape(
    fs: ExecutorFileSystem, layout: Any, ctx: Any
) -> None:
    (layout.outside / "secret.txt").write_text("secret")
    with pytest.raises(ExecServerError) as info:
        await fs.get_metadata(layout.link / "secret.txt", sandbox=ctx.ro(layout.allowed))
    assert_denied(info.value)


async def test_read_directory_rejects_symlink_escape(
    fs: ExecutorFileSystem, layout: Any, ctx: Any
) -> None:
    with pytest.raises(ExecServerError) as info:
        await fs.read_directory(layout.link, sandbox=ctx.ro(layout.allowed))
    assert_denied(info.value)


async def test_copy_rejects_symlink_escape_destination(
    fs: ExecutorFileSystem, layout: Any, ctx: Any
) -> None:
    (layout.allowed / "source.txt").write_text("source")
    with pytest.raises(ExecServerError) as info:
        await fs.copy(
            layout.allowed / "source.txt",
            layout.link / "copied.txt",
            recursive=False,
            sandbox=ctx.ww(layout.allowed),
        )
    assert_denied(info.value)
    assert not (layout.outside / "copied.txt").exists()


async def test_remove_removes_symlink_not_target(
    fs: ExecutorFileSystem, layout: Any, ctx: Any
) -> None:
    keep = layout.outside / "keep.txt"
    keep.write_text("outside")
    layout.link.unlink()
    layout.link.symlink_to(keep)
    await fs.remove(layout.link, recursive=False, force=False, sandbox=ctx.ww(layout.allowed))
    assert not layout.link.is_symlink()
    assert not layout.link.exists()
    assert keep.read_text() == "outside"


async def test_copy_preserves_symlink_source(fs: ExecutorFileSystem, layout: Any, ctx: Any) -> None:
    target = layout.outside / "outside.txt"
    target.write_text("outside")
    layout.link.unlink()
    layout.link.symlink_to(target)
    copied = layout.allowed / "copied-link"
    await fs.copy(layout.link, copied, recursive=False, sandbox=ctx.ww(layout.allowed))
    assert copied.is_symlink()
    assert os.readlink(copied) == os.readlink(layout.link)


async def test_remove_rejects_symlink_escape(fs: ExecutorFileSystem, layout: Any, ctx: Any) -> None:
    secret = layout.outside / "secret.txt"
    secret.write_text("secret")
    with pytest.raises(ExecServerError) as info:
        await fs.remove(layout.link / "secret.txt", sandbox=ctx.ww(layout.allowed))
    assert_denied(info.value)
    assert secret.read_text() == "secret"


async def test_copy_rejects_symlink_escape_source(
    fs: ExecutorFileSystem, layout: Any, ctx: Any
) -> None:
    (layout.outside / "secret.txt").write_text("secret")
    dest = layout.allowed / "copied.txt"
    with pytest.raises(ExecServerError) as info:
        await fs.copy(
            layout.link / "secret.txt", dest, recursive=False, sandbox=ctx.ww(layout.allowed)
        )
    assert_denied(info.value)
    assert not dest.exists()


async def test_all_methods_inside_workspace(fs: ExecutorFileSystem, layout: Any, ctx: Any) -> None:
    """The seven methods plus canonicalize succeed under workspace-write (§15.6 #21 shape)."""
    c = ctx.ww(layout.allowed)
    src = layout.allowed / "source"
    await fs.create_directory(src / "nested", sandbox=c)
    await fs.write_file(src / "nested" / "note.txt", b"nested", sandbox=c)
    await fs.write_file(src / "root.txt", b"root", sandbox=c)
    assert await fs.read_file(src / "root.txt", sandbox=c) == b"root"
    meta = await fs.get_metadata(src / "root.txt", sandbox=c)
    assert meta.is_file and not meta.is_directory and meta.modified_at_ms > 0
    await fs.copy(src / "root.txt", layout.allowed / "copy.txt", recursive=False, sandbox=c)
    assert (layout.allowed / "copy.txt").read_bytes() == b"root"
    await fs.copy(src, layout.allowed / "copied", recursive=True, sandbox=c)
    assert (layout.allowed / "copied" / "nested" / "note.txt").read_bytes() == b"nested"
    entries = sorted(await fs.read_directory(src, sandbox=c), key=lambda e: e.file_name)
    assert [(e.file_name, e.is_directory, e.is_file) for e in entries] == [
        ("nested", True, False),
        ("root.txt", False, True),
    ]
    assert await fs.canonicalize(src / "nested", sandbox=c) == str(src / "nested")
    await fs.remove(layout.allowed / "copied", recursive=True, force=True, sandbox=c)
    assert not (layout.allowed / "copied").exists()
    with pytest.raises(InvalidRequestError) as info:
        await fs.copy(src, src / "nested" / "copy", recursive=True, sandbox=c)
    assert info.value.message == (
        "fs/copy cannot copy a directory to itself or one of its descendants"
    )
    with pytest.raises(InvalidRequestError) as info:
        await fs.copy(src, layout.allowed / "x", recursive=False, sandbox=c)
    assert info.value.message == "fs/copy requires recursive: true when sourcePath is a directory"


async def test_missing_parent_is_not_found_then_create_and_retry(
    fs: ExecutorFileSystem, layout: Any, ctx: Any
) -> None:
    """apply_patch's retry depends on -32004 for a missing parent (CLIENT_COMPAT §6.5)."""
    c = ctx.ww(layout.allowed)
    target = layout.allowed / "sub" / "dir" / "added.txt"
    with pytest.raises(NotFoundError):
        await fs.write_file(target, b"added", sandbox=c)
    await fs.create_directory(target.parent, recursive=True, sandbox=c)
    await fs.write_file(target, b"added", sandbox=c)
    assert target.read_bytes() == b"added"


async def test_read_only_context_cannot_write_inside_readable_root(
    fs: ExecutorFileSystem, layout: Any, ctx: Any
) -> None:
    target = layout.allowed / "new.txt"
    with pytest.raises(ExecServerError) as info:
        await fs.write_file(target, b"x", sandbox=ctx.ro(layout.allowed))
    assert_denied(info.value)
    assert not target.exists()


async def test_current_client_context_sequence(
    fs: ExecutorFileSystem, layout: Any, ctx: Any
) -> None:
    """apply_patch/view_image calls with the current client's ``permissions`` context."""
    c = ctx.current_ww(layout.allowed, tmp=False)
    (layout.allowed / "edit.txt").write_text("a\n")
    assert await fs.read_file(layout.allowed / "edit.txt", sandbox=c) == b"a\n"
    added = layout.allowed / "new" / "file.txt"
    with pytest.raises(NotFoundError):
        await fs.get_metadata(added, sandbox=c)
    with pytest.raises(NotFoundError):
        await fs.write_file(added, b"n\n", sandbox=c)
    await fs.create_directory(added.parent, recursive=True, sandbox=c)
    await fs.write_file(added, b"n\n", sandbox=c)
    meta = await fs.get_metadata(added, sandbox=c)
    assert meta.is_file and meta.size == 2
    await fs.remove(layout.allowed / "edit.txt", recursive=False, force=False, sandbox=c)
    assert not (layout.allowed / "edit.txt").exists()
    with pytest.raises(ExecServerError):
        await fs.write_file(layout.outside / "x.txt", b"x", sandbox=c)
    assert not (layout.outside / "x.txt").exists()
    with pytest.raises(ExecServerError):
        await fs.write_file(layout.link / "x.txt", b"x", sandbox=c)
    assert not (layout.outside / "x.txt").exists()


async def test_non_utf8_names_round_trip(fs: ExecutorFileSystem, layout: Any, ctx: Any) -> None:
    raw = os.fsencode(layout.allowed) + b"/caf\xe9-\xff.bin"
    name = os.fsdecode(raw)
    await fs.write_file(name, b"\x00\xffbinary", sandbox=ctx.ww(layout.allowed))
    assert await fs.read_file(name, sandbox=ctx.ww(layout.allowed)) == b"\x00\xffbinary"
    entries = await fs.read_directory(layout.allowed, sandbox=ctx.ww(layout.allowed))
    assert "caf\ufffd-\ufffd.bin" in {e.file_name for e in entries}


async def test_remove_of_link_behind_a_symlinked_directory_is_checked_where_it_lives(
    fs: ExecutorFileSystem, layout: Any, ctx: Any
) -> None:
    """``allowed/link/victim`` is a link that really sits in ``outside``: not removable."""
    victim = layout.outside / "victim"
    victim.symlink_to("/nonexistent")
    with pytest.raises(ExecServerError) as info:
        await fs.remove(
            layout.link / "victim", recursive=False, force=False, sandbox=ctx.ww(layout.allowed)
        )
    assert_denied(info.value)
    assert victim.is_symlink()


async def test_confined_replace_is_a_new_inode_with_the_old_mode_and_no_temp(
    fs: ExecutorFileSystem, layout: Any, ctx: Any
) -> None:
    """A confined write over an existing file swaps a complete new file in (the
    exchange path, or rename where it is unavailable): new inode, old mode, no
    temp file left, a hard link to the old inode keeps the old contents."""
    target = layout.allowed / "replace.txt"
    target.write_text("old contents")
    target.chmod(0o640)
    keep = layout.allowed / "old-link.txt"
    os.link(target, keep)
    old_ino = target.stat().st_ino
    await fs.write_file(target, b"new contents", sandbox=ctx.ww(layout.allowed))
    assert target.read_bytes() == b"new contents"
    assert target.stat().st_ino != old_ino
    assert target.stat().st_mode & 0o777 == 0o640
    assert keep.read_text() == "old contents"
    names = sorted(p.name for p in layout.allowed.iterdir())
    assert names == ["link", "old-link.txt", "replace.txt"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand files to other owners")
async def test_confined_write_never_hands_a_file_to_another_owner(
    fs: ExecutorFileSystem, layout: Any, ctx: Any
) -> None:
    """A confined write keeps the file's owner and group. The confined child has
    no capabilities, even for a root server (as upstream's helper): a file it may
    not give back to its owner is written in place, as upstream always does, and
    one whose own bits forbid writing is refused, like upstream. A set-group-ID
    directory's group is put back where it may be (our own group)."""
    shared = layout.allowed / "shared"
    shared.mkdir()
    os.chown(shared, 0, 4242)
    os.chmod(shared, 0o2775)
    sandbox = ctx.ww(layout.allowed)
    cases = {"ours.txt": (0, 0, 0o640, False), "theirs.txt": (1234, 5678, 0o666, True)}
    for name, (uid, gid, mode, in_place) in cases.items():
        path = shared / name
        path.write_text("old")
        os.chown(path, uid, gid)
        os.chmod(path, mode)
        inode = path.stat().st_ino
        await fs.write_file(path, b"new", sandbox=sandbox)
        st = path.stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (uid, gid, mode), name
        assert (st.st_ino == inode) is in_place, name
        assert path.read_bytes() == b"new"

    private = shared / "private.txt"
    private.write_text("old")
    os.chown(private, 1234, 5678)
    os.chmod(private, 0o640)
    with pytest.raises(ExecServerError) as info:
        await fs.write_file(private, b"new", sandbox=sandbox)
    assert "Permission denied" in str(info.value)
    st = private.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (1234, 5678, 0o640)
    assert private.read_bytes() == b"old"
    assert sorted(p.name for p in shared.iterdir()) == ["ours.txt", "private.txt", "theirs.txt"]


async def test_confined_replace_keeps_extended_attributes(
    fs: ExecutorFileSystem, layout: Any, ctx: Any, set_xattr: Any
) -> None:
    target = layout.allowed / "tagged.txt"
    target.write_text("old")
    set_xattr(target, "user.origin", b"kept")
    before = target.stat()
    await fs.write_file(target, b"new", sandbox=ctx.ww(layout.allowed))
    assert target.stat().st_ino != before.st_ino
    assert os.getxattr(target, "user.origin") == b"kept"
    assert target.read_bytes() == b"new"
