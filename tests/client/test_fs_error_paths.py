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


@pytest.mark.parametrize("follow", [True, False], ids=["follow", "no-follow"])
@pytest.mark.parametrize("op", ["read_file", "write_file", "create_directory", "remove"])
async def test_calls_that_take_follow_symlinks_name_their_path(
    fs: Any, tmp_path: Path, op: str, follow: bool
) -> None:
    target = tmp_path / "no-parent" / "x"
    calls = {
        "read_file": lambda: fs.read_file(str(target), follow_symlinks=follow),
        "write_file": lambda: fs.write_file(str(target), b"x", follow_symlinks=follow),
        "create_directory": lambda: fs.create_directory(
            str(target), recursive=False, follow_symlinks=follow
        ),
        "remove": lambda: fs.remove(str(target), force=False, follow_symlinks=follow),
    }
    with pytest.raises(ExecServerError) as info:
        await calls[op]()
    assert str(target) in str(info.value)


async def test_copy_names_the_source(fs: Any, tmp_path: Path) -> None:
    with pytest.raises(ExecServerError) as info:
        await fs.copy(str(tmp_path / "src"), str(tmp_path / "dst"), recursive=False)
    assert str(info.value).startswith(f"{tmp_path / 'src'}")
