"""Writes on filesystems kept in memory: learned per device, renamed."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from exec_server.fs import memfs, ops

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
    for path, answer in ((tdir / "f", False), (shm_dir / "f", True)):
        fd = os.open(path, os.O_RDONLY)
        try:
            assert memfs.learn(fd) is answer
        finally:
            os.close(fd)
        assert _learned(path) is answer


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
