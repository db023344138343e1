"""Spare unnamed files for writes (``fs/spare.py``) and the pool's ``after_answer``.

A write in a worker takes the spare made in its directory after the previous
write was answered, where creating files is slow; the spare is only given out
while the path still names the directory it was made in; spares expire, are
bounded, and never outlive a failed write or a fork. Most tests mark their
directory slow (``note_create``) rather than slowing the filesystem down.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from exec_server.exceptions import InvalidRequestError
from exec_server.fs import ops, spare
from exec_server.fs.spare import SpareFiles, shared_spares
from exec_server.fs.workers import WorkerPool, after_answer

pytestmark = pytest.mark.skipif(not SpareFiles().supported, reason="needs O_TMPFILE and /proc")

DEADLINE = 10.0


def _fds() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/fd")}


@pytest.fixture
def counted_fds() -> None:
    """For tests that count this process's descriptors: none of the shared spares
    (left by earlier tests) is open, so the reaper closes none meanwhile."""
    shared_spares().close_all()


def _until(predicate: Callable[[], bool]) -> None:
    """Wait for a thread's work to show (a spare made or closed), with a deadline."""
    deadline = time.monotonic() + DEADLINE
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)


SLOW = 1.0  # seconds: a creation time that marks a directory as one for spares


POOL_THREADS = 4


def _nothing() -> None:
    pass


@pytest.fixture
async def pool(tmp_path: Path) -> AsyncIterator[WorkerPool]:
    """A pool, and ``tmp_path`` marked as a directory where creating files is slow."""
    shared_spares().note_create(str(tmp_path), SLOW)
    workers = WorkerPool(max_workers=POOL_THREADS)
    yield workers
    # One job per thread, handed out at once: each runs after the work its thread
    # left for after its last answer (a spare), so none is made after this point.
    await asyncio.gather(*(workers.run(_nothing) for _ in range(POOL_THREADS)))
    shared_spares().close_all()  # what this test's writes left for the next ones


async def test_a_write_takes_the_spare_made_after_the_previous_one(
    tmp_path: Path, pool: WorkerPool
) -> None:
    target = tmp_path / "file.txt"
    await pool.run(ops.write_file, str(target), b"first")
    _until(lambda: shared_spares().held(str(tmp_path)) is not None)
    ino = shared_spares().held(str(tmp_path))

    await pool.run(ops.write_file, str(target), b"second")

    assert target.stat().st_ino == ino  # the spare became the file
    assert target.read_bytes() == b"second"
    assert os.listdir(tmp_path) == ["file.txt"]  # no temp name left
    _until(lambda: shared_spares().held(str(tmp_path)) not in (None, ino))  # and the next


async def test_new_file_from_a_spare_gets_mode_from_umask_like_any_new_file(
    tmp_path: Path, pool: WorkerPool
) -> None:
    await pool.run(ops.write_file, str(tmp_path / "a"), b"a")
    _until(lambda: shared_spares().held(str(tmp_path)) is not None)
    ino = shared_spares().held(str(tmp_path))
    umask = os.umask(0)
    os.umask(umask)

    await pool.run(ops.write_file, str(tmp_path / "b"), b"b")

    st = (tmp_path / "b").stat()
    assert st.st_ino == ino
    assert st.st_mode & 0o777 == 0o666 & ~umask
    assert (tmp_path / "b").read_bytes() == b"b"


async def test_replacing_a_file_from_a_spare_keeps_its_mode(
    tmp_path: Path, pool: WorkerPool
) -> None:
    target = tmp_path / "script.sh"
    target.write_bytes(b"old")
    target.chmod(0o751)
    await pool.run(ops.write_file, str(tmp_path / "other"), b"x")
    _until(lambda: shared_spares().held(str(tmp_path)) is not None)
    ino = shared_spares().held(str(tmp_path))

    await pool.run(ops.write_file, str(target), b"new")

    assert target.stat().st_ino == ino
    assert target.stat().st_mode & 0o7777 == 0o751
    assert target.read_bytes() == b"new"


async def test_an_empty_write_does_not_take_the_spare(tmp_path: Path, pool: WorkerPool) -> None:
    # Nothing would be written into it: it would keep the spare's older times.
    await pool.run(ops.write_file, str(tmp_path / "a"), b"a")
    _until(lambda: shared_spares().held(str(tmp_path)) is not None)
    ino = shared_spares().held(str(tmp_path))

    await pool.run(ops.write_file, str(tmp_path / "empty"), b"")

    assert (tmp_path / "empty").stat().st_ino != ino
    assert (tmp_path / "empty").read_bytes() == b""
    assert shared_spares().held(str(tmp_path)) == ino  # still there for the next write


async def test_a_failed_write_closes_its_spare_and_leaves_the_target(
    tmp_path: Path, pool: WorkerPool
) -> None:
    # Called outside a pool job: the spare is taken, and no next one is made.
    del pool  # for tmp_path marked slow
    target = tmp_path / "keep.txt"
    target.write_bytes(b"complete")
    shared_spares().close_all()  # no other spare expires while descriptors are counted
    shared_spares().make(str(tmp_path))
    assert shared_spares().held(str(tmp_path)) is not None
    before = _fds()

    def pieces() -> Iterator[bytes]:
        yield b"half"
        raise InvalidRequestError("bad piece")

    with pytest.raises(InvalidRequestError):
        ops.write_file(str(target), ops.Pieces(8, pieces))

    assert target.read_bytes() == b"complete"
    assert os.listdir(tmp_path) == ["keep.txt"]  # its temp name is gone too
    assert shared_spares().held(str(tmp_path)) is None
    assert len(_fds()) == len(before) - 1  # the spare's descriptor was closed


async def test_a_spare_that_cannot_be_linked_is_closed_and_the_call_goes_the_old_way(
    tmp_path: Path, pool: WorkerPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    del pool  # for tmp_path marked slow; called here, outside a job: no refills
    (tmp_path / "src").write_bytes(b"copied")
    shared_spares().close_all()  # no other spare expires while descriptors are counted

    def refuse(fd: int, path: str) -> None:
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), path)

    monkeypatch.setattr(ops, "link_unnamed", refuse)
    for call in (
        lambda: ops.write_file(str(tmp_path / "written"), b"written"),
        lambda: ops.copy(str(tmp_path / "src"), str(tmp_path / "copy"), recursive=False),
    ):
        shared_spares().make(str(tmp_path))
        before = _fds()
        call()
        assert shared_spares().held(str(tmp_path)) is None  # taken
        assert len(_fds()) == len(before) - 1  # and closed
    assert (tmp_path / "written").read_bytes() == b"written"
    assert (tmp_path / "copy").read_bytes() == b"copied"
    assert sorted(os.listdir(tmp_path)) == ["copy", "src", "written"]


async def test_concurrent_writes_in_one_directory_each_land_whole(
    tmp_path: Path, pool: WorkerPool
) -> None:
    payloads = {f"f{i}": os.urandom(1000 + i) for i in range(24)}
    for _ in range(3):
        await asyncio.gather(
            *(pool.run(ops.write_file, str(tmp_path / name), data)
              for name, data in payloads.items())
        )
    assert sorted(os.listdir(tmp_path)) == sorted(payloads)
    for name, data in payloads.items():
        assert (tmp_path / name).read_bytes() == data


async def _spare_in(directory: Path, pool: WorkerPool) -> int:
    """Have a spare made in ``directory`` (by a write there) and return its inode."""
    await pool.run(ops.write_file, str(directory / "warm"), b"w")
    _until(lambda: shared_spares().held(str(directory)) is not None)
    ino = shared_spares().held(str(directory))
    assert ino is not None
    return ino


async def test_a_copy_to_a_new_file_takes_the_spare_with_the_sources_mode(
    tmp_path: Path, pool: WorkerPool
) -> None:
    source = tmp_path / "src.sh"
    source.write_bytes(b"#!/bin/sh\n" * 1000)
    source.chmod(0o751)
    ino = await _spare_in(tmp_path, pool)

    await pool.run(ops.copy, str(source), str(tmp_path / "dst.sh"), recursive=False)

    st = (tmp_path / "dst.sh").stat()
    assert st.st_ino == ino
    assert st.st_mode & 0o7777 == 0o751
    assert (tmp_path / "dst.sh").read_bytes() == source.read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["dst.sh", "src.sh", "warm"]


async def test_a_copy_onto_an_existing_file_overwrites_it_without_the_spare(
    tmp_path: Path, pool: WorkerPool
) -> None:
    (tmp_path / "src").write_bytes(b"new contents")
    (tmp_path / "dst").write_bytes(b"old and longer contents")
    old_ino = (tmp_path / "dst").stat().st_ino
    ino = await _spare_in(tmp_path, pool)

    await pool.run(ops.copy, str(tmp_path / "src"), str(tmp_path / "dst"), recursive=False)

    assert (tmp_path / "dst").read_bytes() == b"new contents"
    assert (tmp_path / "dst").stat().st_ino == old_ino != ino  # written in place, as before


async def test_a_copy_onto_a_dangling_symlink_still_creates_its_target(
    tmp_path: Path, pool: WorkerPool
) -> None:
    (tmp_path / "src").write_bytes(b"data")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    await _spare_in(tmp_path, pool)

    await pool.run(ops.copy, str(tmp_path / "src"), str(tmp_path / "link"), recursive=False)

    assert (tmp_path / "link").is_symlink()
    assert (tmp_path / "target").read_bytes() == b"data"


async def test_a_copy_onto_itself_is_still_refused(tmp_path: Path, pool: WorkerPool) -> None:
    (tmp_path / "f").write_bytes(b"keep me")
    await _spare_in(tmp_path, pool)

    with pytest.raises(InvalidRequestError):
        await pool.run(ops.copy, str(tmp_path / "f"), str(tmp_path / "f"), recursive=False)
    assert (tmp_path / "f").read_bytes() == b"keep me"


async def test_a_copy_of_an_empty_file_does_not_take_the_spare(
    tmp_path: Path, pool: WorkerPool
) -> None:
    (tmp_path / "empty").write_bytes(b"")
    ino = await _spare_in(tmp_path, pool)

    await pool.run(ops.copy, str(tmp_path / "empty"), str(tmp_path / "copy"), recursive=False)

    assert (tmp_path / "copy").stat().st_ino != ino
    assert (tmp_path / "copy").read_bytes() == b""
    assert shared_spares().held(str(tmp_path)) == ino


def _replace(directory: Path) -> None:
    directory.rename(directory.with_name("moved"))
    directory.mkdir()


def _remove(directory: Path) -> None:
    directory.rmdir()  # an unnamed file is no entry: the directory is empty


@pytest.mark.usefixtures("counted_fds")
@pytest.mark.parametrize("change", [_replace, _remove], ids=["replaced", "gone"])
def test_a_spare_is_not_given_out_once_its_directory_changed(
    tmp_path: Path, change: Callable[[Path], None]
) -> None:
    spares = SpareFiles()
    directory = tmp_path / "d"
    directory.mkdir()
    spares.note_create(str(directory), SLOW)
    before = _fds()
    spares.make(str(directory))
    assert spares.held(str(directory)) is not None
    change(directory)

    assert spares.take(str(directory)) is None

    assert _fds() == before  # the stale spare was closed
    spares.close_all()


def test_take_outside_a_pool_job_gives_what_is_there_and_asks_for_nothing(
    tmp_path: Path,
) -> None:
    spares = SpareFiles()
    spares.note_create(str(tmp_path), SLOW)
    assert spares.take(str(tmp_path)) is None
    assert spares.held(str(tmp_path)) is None  # nothing was made for it

    spares.make(str(tmp_path))
    fd = spares.take(str(tmp_path))
    assert fd is not None
    try:
        assert spares.held(str(tmp_path)) is None
    finally:
        os.close(fd)


class _NoTime:
    """``time`` for the spare module with creations that take no time (``perf_counter``
    stands still), so only the test's own ``note_create`` figures count."""

    monotonic = staticmethod(time.monotonic)

    @staticmethod
    def perf_counter() -> float:
        return 0.0


def test_spares_are_for_directories_where_creating_is_slow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spare, "time", _NoTime)
    spares = SpareFiles()
    d = str(tmp_path)
    spares.make(d)  # its own creation, timed: 0 s
    assert spares.take(d) is None  # quiet: nothing given out

    spares.note_create(d, 1e-3)  # average 250 µs: slow
    fd = spares.take(d)
    assert fd is not None
    os.close(fd)

    for _ in range(5):
        spares.note_create(d, 40e-6)  # down to ~90 µs: under SLOW_CREATE, over FAST_CREATE
    spares.make(d)  # (~67 µs)
    fd = spares.take(d)
    assert fd is not None  # still on: it takes FAST_CREATE to stop
    os.close(fd)

    for _ in range(20):
        spares.note_create(d, 10e-6)
    spares.make(d)
    assert spares.take(d) is None  # off

    other = tmp_path / "other"
    other.mkdir()
    spares.note_create(str(other), 80e-6)  # between the two from the start: stays off
    spares.make(str(other))
    assert spares.take(str(other)) is None
    spares.close_all()


def test_only_the_latest_directories_costs_are_kept(tmp_path: Path) -> None:
    spares = SpareFiles()
    first = tmp_path / "first"
    first.mkdir()
    spares.note_create(str(first), SLOW)
    spares.make(str(first))
    for i in range(spare._MAX_TRACKED):  # as many other directories after it
        spares.note_create(str(tmp_path / f"other-{i}"), SLOW)

    assert spares.take(str(first)) is None  # forgotten: counts as never measured
    spares.close_all()


async def test_a_quiet_directory_gets_no_spares(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # However slow this machine's creations are now, none counts as slow.
    monkeypatch.setattr(spare, "SLOW_CREATE", float("inf"))
    pool = WorkerPool(max_workers=1)  # one thread: the next job runs after the hooks
    for i in range(5):
        await pool.run(ops.write_file, str(tmp_path / f"f{i}"), b"data")
    await pool.run(lambda: None)
    assert shared_spares().held(str(tmp_path)) is None


async def test_slow_creations_of_temp_files_start_the_spares(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spare, "SLOW_CREATE", 0.0)  # any creation counts as slow
    pool = WorkerPool(max_workers=1)
    await pool.run(ops.write_file, str(tmp_path / "a"), b"a")  # timed: slow
    await pool.run(ops.write_file, str(tmp_path / "b"), b"b")  # takes none, asks for one
    await pool.run(lambda: None)
    ino = shared_spares().held(str(tmp_path))
    assert ino is not None
    await pool.run(ops.write_file, str(tmp_path / "c"), b"c")
    assert (tmp_path / "c").stat().st_ino == ino
    await pool.run(_nothing)  # after the spare that write's thread makes next
    shared_spares().close_all()


@pytest.mark.usefixtures("counted_fds")
def test_spares_expire_and_the_reaper_exits(tmp_path: Path) -> None:
    before = _fds()
    spares = SpareFiles(keep=0.05)
    spares.make(str(tmp_path))
    assert spares.held(str(tmp_path)) is not None

    _until(lambda: spares.held(str(tmp_path)) is None)
    _until(lambda: spares._reaper is None)
    assert _fds() == before


@pytest.mark.usefixtures("counted_fds")
def test_at_most_max_directories_are_held_oldest_out_first(tmp_path: Path) -> None:
    spares = SpareFiles(max_directories=2)
    dirs = []
    for name in "abc":
        (tmp_path / name).mkdir()
        dirs.append(str(tmp_path / name))
    before = _fds()
    for directory in dirs:
        spares.make(directory)

    assert spares.held(dirs[0]) is None
    assert spares.held(dirs[1]) is not None and spares.held(dirs[2]) is not None
    assert len(_fds() - before) == 2
    spares.close_all()
    assert _fds() == before


def test_a_filesystem_without_o_tmpfile_is_remembered_and_writes_still_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    real_open = os.open

    def no_tmpfile(path: str, flags: int, *args: object, **kwargs: object) -> int:
        if flags & spare._O_TMPFILE == spare._O_TMPFILE:
            calls.append(path)
            raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(spare.os, "open", no_tmpfile)
    spares = SpareFiles()
    spares.make(str(tmp_path))
    spares.make(str(tmp_path))

    assert spares.held(str(tmp_path)) is None
    assert calls == [str(tmp_path)]  # the device was not asked twice
    ops.write_file(str(tmp_path / "f"), b"data")  # the usual temp file
    assert (tmp_path / "f").read_bytes() == b"data"


def test_a_forked_child_closes_the_parents_spares(tmp_path: Path) -> None:
    spares = shared_spares()
    spares.make(str(tmp_path))
    assert spares.held(str(tmp_path)) is not None
    pid = os.fork()
    if pid == 0:  # the child: its copies are closed, nothing is held
        code = 0 if spares.held(str(tmp_path)) is None and spares._reaper is None else 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert spares.held(str(tmp_path)) is not None  # the parent keeps its own
    spares.close_all()


# -- WorkerPool.after_answer


async def test_after_answer_runs_in_the_job_thread_once_the_answer_is_out() -> None:
    pool = WorkerPool(max_workers=2)
    answered = threading.Event()
    seen: list[tuple[int, bool]] = []
    ran = threading.Event()

    def later() -> None:
        seen.append((threading.get_ident(), answered.wait(DEADLINE)))
        ran.set()

    def job() -> int:
        assert after_answer(later) is True
        return threading.get_ident()

    job_thread = await pool.run(job)
    answered.set()
    assert await asyncio.to_thread(ran.wait, DEADLINE)
    assert seen == [(job_thread, True)]


async def test_after_answer_errors_are_dropped_and_the_worker_goes_on() -> None:
    pool = WorkerPool(max_workers=1)

    def boom() -> None:
        raise RuntimeError("dropped")

    def job() -> str:
        after_answer(boom)
        return "answered"

    assert await pool.run(job) == "answered"
    assert await pool.run(lambda: "next") == "next"  # the same single thread


def test_after_answer_outside_a_job_does_nothing() -> None:
    ran: list[int] = []
    assert after_answer(lambda: ran.append(1)) is False
    assert ran == []
