"""Helper threads for blocking batches (:mod:`exec_server.fs.fanout`) and the
removal that fans out once its unlinks prove slow (``ops._remove_tree``)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from exec_server.exceptions import InvalidRequestError
from exec_server.fs import fanout, ops
from exec_server.fs.fanout import FanOut


def test_every_task_runs_once_and_helpers_really_run_alongside_the_caller() -> None:
    pool = FanOut(helpers=3)
    # Each task waits at a 2-party barrier: the batch only completes if at
    # least two threads work through it at the same time.
    barrier = threading.Barrier(2, timeout=10)
    ran: list[int] = []
    lock = threading.Lock()

    def task(i: int) -> None:
        barrier.wait()
        with lock:
            ran.append(i)

    pool.run([lambda i=i: task(i) for i in range(8)])
    assert sorted(ran) == list(range(8))


def test_without_helpers_the_caller_runs_the_batch_itself() -> None:
    caller = threading.get_ident()
    seen: list[int] = []
    FanOut(helpers=0).run([lambda: seen.append(threading.get_ident())] * 3)
    assert seen == [caller] * 3


def test_the_first_error_is_raised_after_running_tasks_finish() -> None:
    pool = FanOut(helpers=2)
    started = threading.Event()
    failed = threading.Event()
    finished = threading.Event()

    def slow() -> None:
        started.set()
        assert failed.wait(10)  # still running when the error happens
        finished.set()

    def fail() -> None:
        assert started.wait(10)
        failed.set()
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        pool.run([slow, fail])
    assert finished.is_set()  # run() waited for the task in flight


def test_tasks_not_started_are_abandoned_after_an_error() -> None:
    ran: list[int] = []

    def fail() -> None:
        raise OSError("first")

    with pytest.raises(OSError, match="first"):
        FanOut(helpers=0).run([fail, lambda: ran.append(1), lambda: ran.append(2)])
    assert ran == []


def test_nested_batches_complete_even_with_every_helper_busy() -> None:
    pool = FanOut(helpers=1)
    total: list[int] = []
    lock = threading.Lock()

    def leaf() -> None:
        with lock:
            total.append(1)

    def branch() -> None:
        pool.run([leaf] * 5)

    done = threading.Event()

    def main() -> None:
        pool.run([branch] * 4)
        done.set()

    threading.Thread(target=main, daemon=True).start()
    assert done.wait(30), "nested fan-out deadlocked"
    assert len(total) == 20


def test_idle_helpers_exit() -> None:
    pool = FanOut(helpers=2, idle_timeout=0.05)
    pool.run([lambda: None] * 3)
    deadline = time.monotonic() + 10
    while pool.threads and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.threads == 0


# ------------------------------------------------------------------ removal


class _Recording(FanOut):
    def __init__(self) -> None:
        super().__init__(helpers=3)
        self.batches = 0

    def run(self, tasks: Sequence[Callable[[], object]]) -> None:
        self.batches += 1
        super().run(tasks)


@pytest.fixture
def recording(monkeypatch: pytest.MonkeyPatch) -> _Recording:
    rec = _Recording()
    monkeypatch.setattr(ops, "shared_fanout", lambda: rec)
    return rec


def _tree(root: Path) -> None:
    """Three levels, files everywhere, a link out of the tree, an empty directory."""
    for d in range(4):
        for e in range(3):
            sub = root / f"d{d}" / f"e{e}"
            sub.mkdir(parents=True)
            for f in range(10):
                (sub / f"f{f}").write_bytes(b"x" * 100)
        for f in range(12):
            (root / f"d{d}" / f"g{f}").write_bytes(b"y")
    for f in range(20):
        (root / f"top{f}").write_bytes(b"z")
    (root / "empty").mkdir()


def test_slow_unlinks_fan_the_removal_out_and_links_are_not_followed(
    tmp_path: Path, recording: _Recording, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ops, "_SLOW_UNLINK_NS", -1)  # every unlink counts as slow
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("keep")
    root = tmp_path / "root"
    _tree(root)
    (root / "d1" / "link").symlink_to(outside)
    (root / "d2" / "e0" / "file-link").symlink_to(outside / "keep")
    ops.remove(str(root), recursive=True, force=False)
    assert not root.exists()
    assert (outside / "keep").read_text() == "keep"
    assert recording.batches > 0


def test_fast_unlinks_stay_sequential(
    tmp_path: Path, recording: _Recording, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ops, "_SLOW_UNLINK_NS", 10**12)
    root = tmp_path / "root"
    _tree(root)
    ops.remove(str(root), recursive=True, force=False)
    assert not root.exists()
    assert recording.batches == 0


def test_a_failure_inside_a_fanned_out_removal_is_reported(
    tmp_path: Path, recording: _Recording, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ops, "_SLOW_UNLINK_NS", -1)
    root = tmp_path / "root"
    _tree(root)
    real_unlink = os.unlink
    refused = str(root / "d3" / "e2" / "f7")

    def unlink(path: str, *, dir_fd: int | None = None) -> None:
        if path == "f7" and dir_fd is not None and os.readlink(f"/proc/self/fd/{dir_fd}") == str(
            root / "d3" / "e2"
        ):
            raise PermissionError(1, "Operation not permitted", path)
        real_unlink(path, dir_fd=dir_fd)

    monkeypatch.setattr(os, "unlink", unlink)
    with pytest.raises(InvalidRequestError, match="not permitted"):
        ops.remove(str(root), recursive=True, force=False)
    monkeypatch.undo()
    assert os.path.exists(refused)  # the refused entry is still there
    assert recording.batches > 0
    ops.remove(str(root), recursive=True, force=False)
    assert not root.exists()


def test_the_shared_helpers_are_one_instance() -> None:
    assert fanout.shared_fanout() is fanout.shared_fanout()


def test_the_probe_counts_unlinks_across_small_directories(
    tmp_path: Path, recording: _Recording, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No directory has eight files, yet the timed unlinks add up and the rest fans out."""
    monkeypatch.setattr(ops, "_SLOW_UNLINK_NS", -1)
    root = tmp_path / "root"
    for d in range(12):
        (root / f"d{d:02d}").mkdir(parents=True)
        for f in range(2):
            (root / f"d{d:02d}" / f"f{f}").write_bytes(b"x")
    ops.remove(str(root), recursive=True, force=False)
    assert not root.exists()
    assert recording.batches > 0
