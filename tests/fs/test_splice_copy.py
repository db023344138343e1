"""Big-file copies through one large pipe (:mod:`exec_server.fs.splice_copy`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from exec_server.fs import ops, splice_copy

MIB = 1024 * 1024


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _assert_refused(src: int, dst_path: Path) -> None:
    """``copy_through_pipe`` says no and writes nothing (closes ``src``)."""
    dst = os.open(dst_path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        assert splice_copy.copy_through_pipe(src, dst) is False
        assert os.fstat(dst).st_size == 0
    finally:
        os.close(src)
        os.close(dst)


@pytest.fixture(params=["tmp", "shm"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """The test's temp dir (ext4 here and on CI) and, where there is one, a tmpfs."""
    if request.param == "tmp":
        return tmp_path
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm")
    d = shm / f"splice-test-{os.getpid()}-{tmp_path.name}"
    d.mkdir()
    request.addfinalizer(lambda: ops.remove(str(d), recursive=True, force=True))
    return d


def test_known_filesystems_take_the_pipe(where: Path) -> None:
    src = where / "src"
    src.write_bytes(b"x" * splice_copy.SPLICE_MIN)
    fd = os.open(src, os.O_RDONLY)
    try:
        dev = os.fstat(fd).st_dev
        assert splice_copy.splice_pays_off(fd, dev, fd, dev, splice_copy.SPLICE_MIN)
        assert not splice_copy.splice_pays_off(fd, dev, fd, dev, splice_copy.SPLICE_MIN - 1)
    finally:
        os.close(fd)


def test_other_filesystems_keep_copy_file_range() -> None:
    fd = os.open("/proc/self/status", os.O_RDONLY)
    try:
        dev = os.fstat(fd).st_dev
        assert not splice_copy.splice_pays_off(fd, dev, fd, dev, 10 * MIB)
    finally:
        os.close(fd)


@pytest.mark.parametrize("size", [splice_copy.SPLICE_MIN, 3 * MIB + 12345])
def test_copy_is_byte_exact_and_closes_its_pipe(where: Path, size: int) -> None:
    data = os.urandom(size)
    (where / "src").write_bytes(data)
    (where / "old").write_bytes(b"o" * (5 * MIB))  # longer: must be truncated
    before = _fds()
    ops.copy(str(where / "src"), str(where / "new"), recursive=False)
    ops.copy(str(where / "src"), str(where / "old"), recursive=False)
    assert _fds() == before
    assert (where / "new").read_bytes() == data
    assert (where / "old").read_bytes() == data


def test_copy_through_pipe_writes_from_offset_zero_and_moves_no_offsets(tmp_path: Path) -> None:
    data = os.urandom(2 * MIB + 7)
    (tmp_path / "src").write_bytes(data)
    src = os.open(tmp_path / "src", os.O_RDONLY)
    dst = os.open(tmp_path / "dst", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        assert splice_copy.copy_through_pipe(src, dst) is True
        assert os.lseek(src, 0, os.SEEK_CUR) == 0
        assert os.lseek(dst, 0, os.SEEK_CUR) == 0
    finally:
        os.close(src)
        os.close(dst)
    assert (tmp_path / "dst").read_bytes() == data


def test_a_pipe_that_cannot_grow_falls_back_without_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(MIB)
    (tmp_path / "src").write_bytes(data)
    real = splice_copy.fcntl.fcntl

    def refuse(fd: int, cmd: int, arg: int = 0) -> int:
        if cmd == splice_copy._F_SETPIPE_SZ:
            raise PermissionError(1, "Operation not permitted")
        return real(fd, cmd, arg)

    monkeypatch.setattr(splice_copy.fcntl, "fcntl", refuse)
    _assert_refused(os.open(tmp_path / "src", os.O_RDONLY), tmp_path / "dst")
    ops.copy(str(tmp_path / "src"), str(tmp_path / "copy"), recursive=False)  # falls back
    assert (tmp_path / "copy").read_bytes() == data


def test_a_source_that_refuses_splice_falls_back(tmp_path: Path) -> None:
    """A directory fd refuses ``splice`` (EINVAL) before anything is written."""
    _assert_refused(os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY), tmp_path / "dst")


def test_big_files_inside_a_tree_copy(where: Path) -> None:
    big = os.urandom(MIB + 3)
    (where / "tree" / "sub").mkdir(parents=True)
    (where / "tree" / "sub" / "big").write_bytes(big)
    (where / "tree" / "small").write_bytes(b"s")
    ops.copy(str(where / "tree"), str(where / "copy"), recursive=True)
    assert (where / "copy" / "sub" / "big").read_bytes() == big
    assert (where / "copy" / "small").read_bytes() == b"s"


def test_a_fifo_destination_with_a_reader_gets_the_bytes(tmp_path: Path) -> None:
    """Copying onto an existing FIFO that has a reader feeds it everything, waiting
    for the reader like ``cp`` (and upstream) do; only regular files take the pipe."""
    import threading

    data = os.urandom(splice_copy.SPLICE_MIN + 5)
    (tmp_path / "src").write_bytes(data)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader exists before the copy
    os.set_blocking(reader, True)
    holder = os.open(fifo, os.O_WRONLY)  # no EOF for the reader until the copy is done
    got = bytearray()

    def drain() -> None:
        while chunk := os.read(reader, 1 << 16):
            got.extend(chunk)

    t = threading.Thread(target=drain)
    t.start()
    try:
        ops.copy(str(tmp_path / "src"), str(fifo), recursive=False)
    finally:
        os.close(holder)
        t.join(timeout=30)
        os.close(reader)
    assert not t.is_alive()
    assert bytes(got) == data
