"""Writes that cannot go through a temp file and a rename go in place, as upstream's.

``fs/writeFile`` replaces a file through a temp file renamed over it (a failed
write never leaves half a file). Two targets refuse that and used to fail where
upstream (which truncates in place) succeeds or reports the file's own error:

* a bind-mounted file (a container's ``/etc/hosts``, a mounted config file):
  the rename fails with ``EBUSY``, and the write failed with it;
* a file in a directory that takes no new entry for another reason than
  ``EACCES`` (``/proc`` answers ``ENOENT``): the write failed with ``-32004``,
  which the current client reads as "create the parent directory and retry".
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exec_server.client.fs import ExecutorFileSystem
from exec_server.exceptions import ExecServerError, NotFoundError

_MS_BIND = 0x1000
_MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)
_PROC_FILE = Path("/proc/version")


@pytest.fixture
def bind_mounted(tdir: Path) -> Iterator[tuple[Path, Path]]:
    """``(source, target)``: ``target`` is a file with ``source`` bind-mounted on it."""
    source, target = tdir / "source.txt", tdir / "target.txt"
    source.write_text("mounted contents")
    target.write_text("covered contents")
    if _libc.mount(bytes(source), bytes(target), None, _MS_BIND, None) != 0:
        err = ctypes.get_errno()
        pytest.skip(f"cannot bind-mount here: {os.strerror(err)}")
    try:
        yield source, target
    finally:
        assert _libc.umount2(bytes(target), _MNT_DETACH) == 0, os.strerror(ctypes.get_errno())


def _mounted_at(path: Path) -> bool:
    with open("/proc/self/mountinfo") as mounts:
        return any(line.split()[4] == str(path) for line in mounts)


def _temp_names(directory: Path) -> list[str]:
    return [name for name in os.listdir(directory) if name.endswith(".tmp")]


async def test_a_bind_mounted_file_is_written_in_place(
    fs: ExecutorFileSystem, bind_mounted: tuple[Path, Path]
) -> None:
    source, target = bind_mounted
    await fs.write_file(target, b"written through the mount")
    assert target.read_bytes() == b"written through the mount"
    assert source.read_bytes() == b"written through the mount"  # the same file
    assert _mounted_at(target)  # still the mount, not a new file at its name
    assert _temp_names(target.parent) == []


async def test_a_confined_write_of_a_bind_mounted_file_goes_in_place(
    sandboxed_fs: ExecutorFileSystem,
    bind_mounted: tuple[Path, Path],
    legacy_workspace_write_context: Any,
) -> None:
    source, target = bind_mounted
    sandbox = legacy_workspace_write_context(target.parent)
    await sandboxed_fs.write_file(target, b"confined write", sandbox=sandbox)
    assert source.read_bytes() == b"confined write"
    assert _temp_names(target.parent) == []


async def test_a_file_where_no_temp_file_can_be_made_reports_its_own_error(
    fs: ExecutorFileSystem,
) -> None:
    before = _PROC_FILE.read_bytes()  # noqa: ASYNC240
    with pytest.raises(ExecServerError) as info:
        await fs.write_file(_PROC_FILE, b"x")
    assert not isinstance(info.value, NotFoundError), info.value
    assert info.value.code == -32603
    assert info.value.message == f"I/O error (os error {errno.EIO})"
    assert _PROC_FILE.read_bytes() == before  # noqa: ASYNC240


async def test_a_missing_parent_is_still_not_found(fs: ExecutorFileSystem, tdir: Path) -> None:
    """The fallback is for existing targets only: a new file's missing parent stays -32004."""
    with pytest.raises(NotFoundError):
        await fs.write_file(tdir / "missing" / "new.txt", b"x")
    assert not (tdir / "missing").exists()
