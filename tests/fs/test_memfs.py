"""Writes on filesystems kept in memory: learned per device, renamed, small ones inline."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exec_server.client.fs import RemoteFileSystem
from exec_server.fs import memfs, nonblocking, ops
from exec_server.fs.service import INLINE_WRITE_LIMIT, FileSystemService, inline_write_target
from exec_server.fs.workers import WorkerPool

WAIT = 30.0


def _fs_type(path: Path) -> str:
    """The filesystem type of the mount holding ``path`` (``/proc/self/mounts``)."""
    best, kind = "", ""
    real = os.path.realpath(path)
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            point = fields[1].replace("\\040", " ")
            inside = real == point or real.startswith(point.rstrip("/") + "/")
            if inside and len(point) > len(best):
                best, kind = point, fields[2]
    return kind


@pytest.fixture
def shm_dir(tdir: Path) -> Iterator[Path]:
    shm = Path("/dev/shm")
    if not shm.is_dir() or _fs_type(shm) != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm")
    d = Path(os.path.realpath(shm)) / f"memfs-test-{os.getpid()}-{tdir.name}"
    d.mkdir()
    yield d
    ops.remove(str(d), recursive=True, force=True)


def _learned(path: Path) -> bool | None:
    return memfs.in_memory(os.stat(path).st_dev)


def test_learn_tells_tmpfs_from_disk(fresh_table: None, shm_dir: Path, tdir: Path) -> None:
    if _fs_type(tdir) in ("tmpfs", "ramfs"):
        pytest.skip("the test's temp dir is itself in memory")
    (shm_dir / "f").write_text("x")
    (tdir / "f").write_text("x")
    assert _learned(shm_dir / "f") is None  # nothing learned yet
    assert not memfs.any_in_memory()
    for path, answer in ((tdir / "f", False), (shm_dir / "f", True)):
        fd = os.open(path, os.O_RDONLY)
        try:
            assert memfs.learn(fd) is answer
        finally:
            os.close(fd)
        assert _learned(path) is answer
        assert memfs.any_in_memory() is answer  # disk first: none until tmpfs


def test_a_full_table_starts_afresh(
    fresh_table: None, shm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(memfs, "_MAX_DEVICES", 3)
    for dev in (-1, -2, -3):
        memfs._devices[dev] = True
    (shm_dir / "f").write_text("x")
    fd = os.open(shm_dir / "f", os.O_RDONLY)
    try:
        assert memfs.learn(fd) is True
    finally:
        os.close(fd)
    assert memfs._devices == {os.stat(shm_dir / "f").st_dev: True}


def test_a_replacing_write_learns_then_renames_on_tmpfs_and_exchanges_on_disk(
    fresh_table: None, shm_dir: Path, tdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if _fs_type(tdir) in ("tmpfs", "ramfs"):
        pytest.skip("the test's temp dir is itself in memory")
    exchanged: list[str] = []
    real_exchange = ops._exchange_into_place

    def spy(tmp: str, target: str) -> bool:
        exchanged.append(target)
        return real_exchange(tmp, target)

    monkeypatch.setattr(ops, "_exchange_into_place", spy)
    for d in (shm_dir, tdir):
        target = d / "data"
        target.write_bytes(b"old")
        first = target.stat().st_ino
        for n in range(3):
            ops.write_file(str(target), b"new %d" % n)
        assert target.read_bytes() == b"new 2"
        assert target.stat().st_ino != first  # replaced, not written in place
        assert sorted(p.name for p in d.iterdir()) == ["data"]  # no temp file left
    assert exchanged == [str(tdir / "data")] * 3  # tmpfs: plain rename every time
    assert _learned(shm_dir / "data") is True


def test_temp_names_differ_and_a_taken_one_is_skipped(
    tdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = str(tdir / "data")
    names = {ops._temp_name(target) for _ in range(100)}
    assert len(names) == 100
    assert all(os.path.dirname(n) == str(tdir) for n in names)
    (tdir / "data").write_bytes(b"old")
    taken = tdir / ".taken.tmp"
    taken.write_bytes(b"someone else's")
    real_name = ops._temp_name
    handed: list[str] = []

    def name_taken_first(t: str) -> str:
        handed.append(str(taken) if not handed else real_name(t))
        return handed[-1]

    monkeypatch.setattr(ops, "_temp_name", name_taken_first)
    tag = ops._temp_tag
    ops.write_file(target, b"new")
    assert len(handed) == 2
    assert ops._temp_tag != tag  # guessed names are abandoned
    assert (tdir / "data").read_bytes() == b"new"
    assert taken.read_bytes() == b"someone else's"


def test_a_write_whose_temp_names_are_all_taken_fails_and_changes_nothing(
    tdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tdir / "data").write_bytes(b"old")
    taken = tdir / ".taken.tmp"
    taken.write_bytes(b"someone else's")
    monkeypatch.setattr(ops, "_temp_name", lambda t: str(taken))
    with pytest.raises(Exception, match="File exists"):
        ops.write_file(str(tdir / "data"), b"new")
    assert (tdir / "data").read_bytes() == b"old"
    assert taken.read_bytes() == b"someone else's"


def _record_threads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Patch ``ops.write_file`` to note the thread each write runs on."""
    seen: list[int] = []
    real = ops.write_file

    def recording(path: str, data: Any, **kwargs: Any) -> None:
        seen.append(threading.get_ident())
        real(path, data, **kwargs)

    monkeypatch.setattr(ops, "write_file", recording)
    return seen


async def test_small_tmpfs_writes_run_on_the_loop_and_the_rest_in_workers(
    fresh_table: None, shm_dir: Path, tdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if _fs_type(tdir) in ("tmpfs", "ramfs"):
        pytest.skip("the test's temp dir is itself in memory")
    service = FileSystemService(pool=WorkerPool(max_workers=2))
    seen = _record_threads(monkeypatch)
    loop_thread = threading.get_ident()
    small, big = b"s" * 1024, b"b" * (INLINE_WRITE_LIMIT + 1)
    target = shm_dir / "f"
    await service.write_file(str(target), small)  # new file: in a worker (learns nothing)
    await service.write_file(str(target), small)  # replacing: a worker learns the device
    st = inline_write_target(str(target), len(small))
    assert st is not None and st.st_ino == os.lstat(target).st_ino
    await service.write_file(str(target), small)  # now inline
    await service.write_file(str(target), big)  # too big: worker
    assert inline_write_target(str(target), len(big)) is None
    (tdir / "f").write_bytes(b"old")
    await service.write_file(str(tdir / "f"), small)  # disk: worker
    await service.write_file(str(tdir / "f"), small)  # still a worker
    os.mkfifo(shm_dir / "fifo")
    assert inline_write_target(str(shm_dir / "fifo"), 1) is None  # only regular files
    assert inline_write_target(str(shm_dir / "missing"), 1) is None
    on_loop = [t == loop_thread for t in seen]
    assert on_loop == [False, False, True, False, False, False]
    assert target.read_bytes() == big
    assert (tdir / "f").read_bytes() == small


async def test_inline_write_errors_are_the_usual_answers(
    fresh_table: None, shm_dir: Path, live_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over a real connection: the inline path (taken from the socket callback) writes,
    and a failure there is the same JSON-RPC error as from a worker."""
    fs = RemoteFileSystem(await live_server.client())
    target = shm_dir / "f"
    await fs.write_file(target, b"one")
    await fs.write_file(target, b"two")  # learns the device
    seen = _record_threads(monkeypatch)
    await fs.write_file(target, b"three")
    assert seen == [threading.get_ident()]  # the server's loop is this test's loop
    assert target.read_bytes() == b"three"

    def no_space(*args: object) -> int:
        raise OSError(28, os.strerror(28))

    monkeypatch.setattr(os, "write", no_space)
    with pytest.raises(Exception, match=r"No space left on device \(os error 28\)") as exc:
        await fs.write_file(target, b"four")
    monkeypatch.undo()
    assert getattr(exc.value, "code", None) == -32603
    assert target.read_bytes() == b"three"
    assert os.listdir(shm_dir) == ["f"]
    await fs.write_file(target, b"five")  # the connection keeps serving
    assert target.read_bytes() == b"five"


async def test_an_inline_write_looks_the_path_up_once(
    fresh_table: None, shm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = FileSystemService(pool=WorkerPool(max_workers=1))
    target = shm_dir / "f"
    target.write_bytes(b"old")
    await service.write_file(str(target), b"learn")  # a worker learns the device
    looked_up: list[str] = []
    real_lstat = os.lstat
    real_stat_now = nonblocking.stat_now

    def counting_lstat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        looked_up.append(os.fsdecode(path))
        return real_lstat(path, *args, **kwargs)

    def counting_stat_now(path: Any, *, follow: bool = True) -> os.stat_result | None:
        looked_up.append(os.fsdecode(path))
        return real_stat_now(path, follow=follow)

    monkeypatch.setattr(os, "lstat", counting_lstat)
    monkeypatch.setattr(nonblocking, "stat_now", counting_stat_now)
    await service.write_file(str(target), b"inline")
    # The decision's look-up (without blocking, fs/nonblocking.py) serves the write.
    assert looked_up.count(str(target)) == 1
    assert target.read_bytes() == b"inline"
