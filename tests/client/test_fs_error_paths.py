"""Filesystem errors name the path they are about (the wire text often does not)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from exec_server.client import ExecServerClient
from exec_server.client.fs import LocalFileSystem, RemoteFileSystem
from exec_server.exceptions import ExecServerError, NotFoundError


@pytest.fixture(params=["local", "remote"])
async def fs(request: pytest.FixtureRequest) -> Any:
    if request.param == "local":
        yield LocalFileSystem()
        return
    server = request.getfixturevalue("server")
    async with await ExecServerClient.connect(server.url) as client:
        yield RemoteFileSystem(client)


async def test_not_found_names_the_path(fs: Any, tmp_path: Path) -> None:
    missing = tmp_path / "missing.txt"
    with pytest.raises(NotFoundError) as info:
        await fs.read_file(str(missing))
    assert info.value.path == str(missing)
    assert str(info.value) == f"{missing}: {info.value.message}"
    # the wire text itself is unchanged (upstream's words)
    assert str(missing) not in info.value.message


@pytest.mark.parametrize("op", ["get_metadata", "read_directory", "canonicalize"])
async def test_every_call_names_its_path(fs: Any, tmp_path: Path, op: str) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ExecServerError) as info:
        await getattr(fs, op)(str(missing))
    assert str(missing) in str(info.value)


async def test_copy_names_the_source(fs: Any, tmp_path: Path) -> None:
    with pytest.raises(ExecServerError) as info:
        await fs.copy(str(tmp_path / "src"), str(tmp_path / "dst"), recursive=False)
    assert str(info.value).startswith(f"{tmp_path / 'src'}")
