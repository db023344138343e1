"""Small files are read on the event loop only from memory; anything that would wait
for a device is read in a worker (``ops.read_resident_and_close``)."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from pathlib import Path

import pytest

from exec_server.client.fs import ExecutorFileSystem
from exec_server.fs import memfs, ops
from exec_server.fs.service import FileSystemService

WAIT = 30.0

pytestmark = pytest.mark.skipif(not hasattr(os, "RWF_NOWAIT"), reason="RWF_NOWAIT is Linux-only")


def _evict(path: Path) -> None:
    """Drop ``path``'s pages from the page cache, or skip where the kernel keeps them."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # clean pages only can be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        try:
            os.preadv(fd, [bytearray(1)], 0, os.RWF_NOWAIT)
        except BlockingIOError:
            return  # evicted: reading now would wait for the device
        except OSError as exc:
            if exc.errno == errno.EOPNOTSUPP:
                pytest.skip("this filesystem cannot tell what is in the page cache")
            raise
        pytest.skip("the kernel kept the pages in the cache")
    finally:
        os.close(fd)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError as exc:
        assert exc.errno == errno.EBADF
        return False
    return True


def test_cached_file_is_read_and_closed(tdir: Path) -> None:
    target = tdir / "f"
    data = os.urandom(5000)
    target.write_bytes(data)
    fd, size = ops.open_for_read(str(target))
    assert size == len(data)
    got = ops.read_resident_and_close(fd, size)
    assert got == data
    assert type(got) is bytes
    assert not _is_open(fd)


def test_evicted_file_is_left_to_the_worker_with_its_descriptor(tdir: Path) -> None:
    target = tdir / "f"
    data = os.urandom(20000)
    target.write_bytes(data)
    _evict(target)
    fd, size = ops.open_for_read(str(target))
    assert size is not None
    assert ops.read_resident_and_close(fd, size) is None
    assert _is_open(fd)
    assert ops.read_and_close(fd, size) == data  # the worker's read, from offset 0
    assert not _is_open(fd)


@pytest.mark.parametrize("change", [-1, 5], ids=["grew", "shrank"])
def test_size_changed_since_fstat_is_left_to_the_worker(tdir: Path, change: int) -> None:
    """``size`` is what ``fstat`` said; a file that is longer or shorter now is read
    whole by the worker (which reads to EOF), never cut at the old size."""
    target = tdir / "f"
    data = os.urandom(3000)
    target.write_bytes(data)
    fd = os.open(target, os.O_RDONLY)
    assert ops.read_resident_and_close(fd, len(data) + change) is None
    assert _is_open(fd)
    assert ops.read_and_close(fd, len(data) + change) == data


def test_empty_file_is_read_at_once(tdir: Path) -> None:
    target = tdir / "empty"
    target.write_bytes(b"")
    fd, size = ops.open_for_read(str(target))
    assert size == 0
    assert ops.read_resident_and_close(fd, 0) == b""
    assert not _is_open(fd)


def test_filesystem_that_cannot_tell_is_read_only_if_in_memory(
    fresh_table: None, tdir: Path
) -> None:
    """``/proc`` answers ``EOPNOTSUPP`` and is no tmpfs: the worker reads it."""
    fd, size = ops.open_for_read("/proc/self/status")
    assert size == 0
    assert ops.read_resident_and_close(fd, 0) is None
    assert _is_open(fd)
    assert b"Pid:" in ops.read_and_close(fd, size)


def test_tmpfs_is_read_at_once(fresh_table: None, tdir: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm")
    target = Path(os.path.realpath(shm)) / f"resident-{os.getpid()}-{tdir.name}"
    target.write_bytes(b"in memory")
    try:
        fd, size = ops.open_for_read(str(target))
        if memfs.learn(fd) is not True:
            os.close(fd)
            pytest.skip("/dev/shm is not a tmpfs here")
        memfs.forget()  # the read learns it itself
        assert ops.read_resident_and_close(fd, size or 0) == b"in memory"
        assert not _is_open(fd)
        assert memfs.in_memory(target.stat().st_dev) is True
    finally:
        target.unlink()


def test_without_rwf_nowait_reads_as_before(tdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Platforms without ``RWF_NOWAIT`` (macOS) read small files at once, cached or not."""
    monkeypatch.setattr(ops, "_RWF_NOWAIT", None)
    target = tdir / "f"
    target.write_bytes(b"plain")
    _evict(target)
    fd, size = ops.open_for_read(str(target))
    assert ops.read_resident_and_close(fd, size or 0) == b"plain"
    assert not _is_open(fd)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_service_reads_an_evicted_file_in_a_worker(
    tdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tdir / "f"
    data = os.urandom(40000)
    target.write_bytes(data)
    readers: list[int] = []
    real = ops.read_and_close

    def spy(fd: int, size: int | None, limit: int = ops.READ_LIMIT) -> bytes:
        readers.append(threading.get_ident())
        return real(fd, size, limit)

    monkeypatch.setattr(ops, "read_and_close", spy)
    service = FileSystemService()
    before = _open_fds()
    assert await asyncio.wait_for(service.read_file(str(target)), WAIT) == data
    assert readers == []  # just written: in the cache, read on the loop
    _evict(target)
    assert service.read_file_now(str(target)) is None  # the handler goes async
    # That miss started the kernel's readahead: evict again for the async read.
    _evict(target)
    assert await asyncio.wait_for(service.read_file(str(target)), WAIT) == data
    assert len(readers) == 1
    assert readers[0] != threading.get_ident()
    _evict(target)
    mapped = await asyncio.wait_for(
        service.read_file_mapped(str(target), lambda b: ("big", b), 1 << 20), WAIT
    )
    assert mapped == data
    assert len(readers) == 2
    assert readers[1] != threading.get_ident()
    assert _open_fds() == before


async def test_evicted_file_reads_the_same_through_both_backends(
    fs: ExecutorFileSystem, tdir: Path
) -> None:
    target = tdir / "cold.txt"
    data = os.urandom(10000)
    target.write_bytes(data)
    _evict(target)
    assert await asyncio.wait_for(fs.read_file(str(target)), WAIT) == data
    _evict(target)
    assert await asyncio.wait_for(fs.read_file(str(target)), WAIT) == data
