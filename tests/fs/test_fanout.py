"""Helper threads for blocking batches (:mod:`exec_server.fs.fanout`), the
removal that fans out once its unlinks prove slow (``ops._remove_tree``) and the
tree copy that fans out once its file copies do (``ops._copy_tree``)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from exec_server.fs import fanout, ops
from exec_server.fs.errors import FsFailedError, FsRefusedError
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


def test_width_caps_the_threads_on_a_batch() -> None:
    pool = FanOut(helpers=5)
    lock = threading.Lock()
    seen: set[int] = set()
    release = threading.Event()

    def task() -> None:
        with lock:
            seen.add(threading.get_ident())
        release.wait(0.01)  # long enough that idle helpers would pick up tasks

    pool.run([task] * 12, width=2)
    assert 1 <= len(seen) <= 2
    seen.clear()
    caller = threading.get_ident()
    pool.run([task] * 4, width=1)
    assert seen == {caller}


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
        self.widths: list[int | None] = []

    def run(self, tasks: Sequence[Callable[[], object]], *, width: int | None = None) -> None:
        self.batches += 1
        self.widths.append(width)
        super().run(tasks, width=width)


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
    with pytest.raises(FsRefusedError, match="not permitted"):
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


# ------------------------------------------------------------------ tree copy


def _snapshot(root: Path) -> dict[str, tuple[str, object, int]]:
    """Every entry below ``root``: its kind, contents or link target, permission bits."""
    out: dict[str, tuple[str, object, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            mode = path.lstat().st_mode & 0o7777
            if path.is_symlink():
                out[rel] = ("link", os.readlink(path), 0)
            elif path.is_dir():
                out[rel] = ("dir", None, mode)
            elif path.is_file():
                out[rel] = ("file", path.read_bytes(), mode)
            else:
                out[rel] = ("special", None, 0)
    return out


def _copy_source(root: Path) -> None:
    """:func:`_tree` plus links (one to a directory outside), odd modes and a FIFO."""
    _tree(root)
    for d in range(4):
        (root / f"d{d}" / f"g{d}").write_bytes(os.urandom(5000 + d))
    os.chmod(root / "d1" / "e2" / "f3", 0o751)
    os.chmod(root / "d3" / "g7", 0o600)
    (root / "d2" / "link-up").symlink_to("../top3")
    (root / "d0" / "e1" / "dangling").symlink_to("nowhere")
    os.mkfifo(root / "d3" / "e0" / "fifo")


@pytest.fixture
def many_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fan-out needs two CPUs or more; claim four so one-CPU machines test it too."""
    monkeypatch.setattr(ops, "_usable_cpus", lambda: 4)


@pytest.fixture
def slow_copies(many_cpus: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file copy counts as slow: tree copies fan out after their probe."""
    monkeypatch.setattr(ops, "_SLOW_COPY_NS", -1)


@pytest.mark.usefixtures("slow_copies")
def test_slow_file_copies_fan_the_tree_copy_out_and_it_is_whole(
    tmp_path: Path, recording: _Recording
) -> None:
    src = tmp_path / "src"
    _copy_source(src)
    (tmp_path / "outside").mkdir()
    (src / "d1" / "out").symlink_to(tmp_path / "outside")
    dst = tmp_path / "dst"
    ops.copy(str(src), str(dst), recursive=True)
    expected = {k: v for k, v in _snapshot(src).items() if v[0] != "special"}
    assert _snapshot(dst) == expected
    assert os.readlink(dst / "d1" / "out") == str(tmp_path / "outside")  # a link, not followed
    assert recording.batches > 0
    assert set(recording.widths) == {4}  # one thread per CPU


@pytest.mark.usefixtures("many_cpus")
def test_fast_file_copies_stay_sequential(
    tmp_path: Path, recording: _Recording, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ops, "_SLOW_COPY_NS", 10**12)
    src = tmp_path / "src"
    _copy_source(src)
    ops.copy(str(src), str(tmp_path / "dst"), recursive=True)
    assert _snapshot(tmp_path / "dst") == {
        k: v for k, v in _snapshot(src).items() if v[0] != "special"
    }
    assert recording.batches == 0


def test_one_cpu_never_fans_out(
    tmp_path: Path, recording: _Recording, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ops, "_usable_cpus", lambda: 1)
    monkeypatch.setattr(ops, "_SLOW_COPY_NS", -1)
    src = tmp_path / "src"
    _copy_source(src)
    ops.copy(str(src), str(tmp_path / "dst"), recursive=True)
    assert len(_snapshot(tmp_path / "dst")) == len(_snapshot(src)) - 1  # all but the FIFO
    assert recording.batches == 0


@pytest.mark.usefixtures("slow_copies")
def test_a_fanned_out_copy_merges_into_an_existing_tree(
    tmp_path: Path, recording: _Recording
) -> None:
    src = tmp_path / "src"
    _copy_source(src)
    dst = tmp_path / "dst"
    (dst / "d2" / "e1").mkdir(parents=True)
    (dst / "d2" / "e1" / "f4").write_text("a longer old text that must be replaced")
    (dst / "d2" / "e1" / "mine").write_text("stays")
    ops.copy(str(src), str(dst), recursive=True)
    assert (dst / "d2" / "e1" / "f4").read_bytes() == (src / "d2" / "e1" / "f4").read_bytes()
    assert (dst / "d2" / "e1" / "mine").read_text() == "stays"
    assert len(_snapshot(dst)) == len(_snapshot(src)) - 1 + 1  # no FIFO, one file of ours
    assert recording.batches > 0


@pytest.mark.usefixtures("slow_copies")
def test_a_failure_inside_a_fanned_out_copy_is_reported(
    tmp_path: Path, recording: _Recording
) -> None:
    src = tmp_path / "src"
    _copy_source(src)
    dst = tmp_path / "dst"
    (dst / "d3" / "e2").mkdir(parents=True)
    (dst / "d3" / "e2" / "f5").mkdir()  # a directory where a file goes
    with pytest.raises(FsFailedError, match="Is a directory"):
        ops.copy(str(src), str(dst), recursive=True)
    assert (dst / "d3" / "e2" / "f5").is_dir()
    assert recording.batches > 0


@pytest.mark.usefixtures("slow_copies")
def test_a_fanned_out_copy_of_a_deep_tree_goes_on_sequentially_below_the_limit(
    tmp_path: Path, recording: _Recording, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ops, "_RECURSION_DEPTH", 3)
    src = tmp_path / "src"
    level = src
    for depth in range(12):
        level.mkdir(parents=True)
        for f in range(9):
            (level / f"f{f}").write_bytes(f"{depth}-{f}".encode())
        (level / "side").mkdir()
        (level / "side" / "s").write_text(str(depth))
        level = level / "next"
    ops.copy(str(src), str(tmp_path / "dst"), recursive=True)
    assert _snapshot(tmp_path / "dst") == _snapshot(src)
    assert recording.batches > 0


@pytest.mark.usefixtures("slow_copies")
def test_the_copy_probe_counts_files_across_small_directories(
    tmp_path: Path, recording: _Recording
) -> None:
    """No directory has eight files, yet the timed copies add up and the rest fans out."""
    src = tmp_path / "src"
    for d in range(12):
        (src / f"d{d:02d}").mkdir(parents=True)
        for f in range(2):
            (src / f"d{d:02d}" / f"f{f}").write_bytes(b"x" * (d + f))
    ops.copy(str(src), str(tmp_path / "dst"), recursive=True)
    assert _snapshot(tmp_path / "dst") == _snapshot(src)
    assert recording.batches > 0
