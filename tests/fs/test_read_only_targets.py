"""``fs/writeFile`` does not replace a file its caller may not write.

The write goes through a temp file renamed over the target, and a rename needs
only the directory's permission: a read-only file (0444), or another user's
file in a directory both may write, was replaced where upstream's ``O_TRUNC``
open fails with ``EACCES`` (found by an audit). Root is not refused, as
upstream's open is not, so the check runs as another user: a child interpreter
started as root (the interpreter may live where only root can read) that drops
to ``nobody`` before writing.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exec_server.exceptions import InvalidRequestError

NOBODY = 65534
WAIT = 60.0

CHILD = """
import json, os, sys
from exec_server.exceptions import wire_error
from exec_server.fs import direct as ops
from exec_server.fs.errors import FsError
os.setgroups([])
os.setresgid(NOBODY, NOBODY, NOBODY)
os.setresuid(NOBODY, NOBODY, NOBODY)
out = {}
for path in sys.argv[1:]:
    try:
        ops.write_file(path, b"new")
        out[path] = "ok"
    except FsError as exc:
        err = wire_error(exc)
        out[path] = [err.code, err.message]
print(json.dumps(out))
""".replace("NOBODY", str(NOBODY))

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory everyone may write (no sticky bit), reachable by ``nobody``."""
    path = Path(tempfile.mkdtemp(prefix="ro-targets-", dir="/tmp"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def write_as_nobody(*paths: Path) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, *map(str, paths)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout)
    return result


def make(path: Path, owner: int, mode: int) -> Path:
    path.write_bytes(b"old")
    os.chown(path, owner, owner)
    path.chmod(mode)
    return path


def test_files_the_caller_may_not_write_are_not_replaced(shared_dir: Path) -> None:
    read_only = make(shared_dir / "read-only.txt", NOBODY, 0o444)
    roots = make(shared_dir / "roots.txt", 0, 0o644)
    own = make(shared_dir / "own.txt", NOBODY, 0o644)
    result = write_as_nobody(read_only, roots, own, shared_dir / "new.txt")
    assert result[str(read_only)] == [-32600, "Permission denied (os error 13)"]
    assert result[str(roots)] == [-32600, "Permission denied (os error 13)"]
    assert read_only.read_bytes() == roots.read_bytes() == b"old"
    assert os.stat(roots).st_uid == 0
    # What the caller may write is written, and a new file is created.
    assert result[str(own)] == result[str(shared_dir / "new.txt")] == "ok"
    assert own.read_bytes() == (shared_dir / "new.txt").read_bytes() == b"new"
    # Nothing else was left behind (no temp file).
    assert sorted(p.name for p in shared_dir.iterdir()) == [
        "new.txt", "own.txt", "read-only.txt", "roots.txt"
    ]


def test_root_still_writes_a_read_only_file(shared_dir: Path) -> None:
    from exec_server.fs import direct as ops

    target = make(shared_dir / "read-only.txt", 0, 0o444)
    ops.write_file(str(target), b"new")
    assert target.read_bytes() == b"new"


async def test_a_confined_write_does_not_replace_a_read_only_file(
    sandboxed_fs: Any, tdir: Path, legacy_workspace_write_context: Any
) -> None:
    """The confined helper runs without capabilities (as upstream's): like any other
    user, it may not write a 0444 file, so it does not replace it either."""
    ctx = legacy_workspace_write_context(tdir)
    read_only = make(tdir / "read-only.txt", 0, 0o444)
    writable = make(tdir / "writable.txt", 0, 0o644)
    with pytest.raises(InvalidRequestError, match=r"Permission denied \(os error 13\)"):
        await asyncio.wait_for(sandboxed_fs.write_file(read_only, b"new", ctx), WAIT)
    assert read_only.read_bytes() == b"old"
    await asyncio.wait_for(sandboxed_fs.write_file(writable, b"new", ctx), WAIT)
    assert writable.read_bytes() == b"new"
    assert sorted(os.listdir(tdir)) == ["read-only.txt", "writable.txt"]
