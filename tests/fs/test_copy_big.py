"""Big-file copies (``copy_file_range``, with its fallbacks) on ext4 and on tmpfs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from exec_server.fs import direct as ops

MIB = 1024 * 1024


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


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


@pytest.mark.parametrize("size", [256 * 1024, 3 * MIB + 12345])
def test_copy_is_byte_exact_and_closes_its_descriptors(where: Path, size: int) -> None:
    data = os.urandom(size)
    (where / "src").write_bytes(data)
    (where / "old").write_bytes(b"o" * (5 * MIB))  # longer: must be truncated
    before = _fds()
    ops.copy(str(where / "src"), str(where / "new"), recursive=False)
    ops.copy(str(where / "src"), str(where / "old"), recursive=False)
    assert _fds() == before
    assert (where / "new").read_bytes() == data
    assert (where / "old").read_bytes() == data


def test_big_files_inside_a_tree_copy(where: Path) -> None:
    big = os.urandom(MIB + 3)
    (where / "tree" / "sub").mkdir(parents=True)
    (where / "tree" / "sub" / "big").write_bytes(big)
    (where / "tree" / "small").write_bytes(b"s")
    ops.copy(str(where / "tree"), str(where / "copy"), recursive=True)
    assert (where / "copy" / "sub" / "big").read_bytes() == big
    assert (where / "copy" / "small").read_bytes() == b"s"


def test_a_fifo_destination_with_a_reader_gets_the_bytes(tmp_path: Path) -> None:
    """Copying onto an existing FIFO that has a reader feeds it everything (more than
    its buffer holds), waiting for the reader like ``cp`` (and upstream) do."""
    import threading

    data = os.urandom(256 * 1024 + 5)
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
