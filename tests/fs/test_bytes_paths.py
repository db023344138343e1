"""Paths given as bytes reach the same file on every backend, a name that is not
UTF-8 included (they failed with a ``TypeError`` that did not say why)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from exec_server.client.fs import ExecutorFileSystem

WAIT = 30.0


async def test_bytes_paths_name_the_same_files(fs: ExecutorFileSystem, tdir: Path) -> None:
    raw_dir = os.fsencode(tdir) + b"/d\xff"
    raw_file = raw_dir + b"/f\xfe.txt"
    await asyncio.wait_for(fs.create_directory(raw_dir), WAIT)
    await asyncio.wait_for(fs.write_file(raw_file, b"data"), WAIT)
    assert os.listdir(raw_dir) == [b"f\xfe.txt"]
    # The same file as text (surrogate escapes) and as bytes.
    assert await asyncio.wait_for(fs.read_file(os.fsdecode(raw_file)), WAIT) == b"data"
    meta = await asyncio.wait_for(fs.get_metadata(raw_file), WAIT)
    assert meta.is_file
    await asyncio.wait_for(fs.remove(raw_dir, recursive=True), WAIT)
    assert os.listdir(tdir) == []
