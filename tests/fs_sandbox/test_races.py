"""A path component is swapped for a symlink in a tight loop while sandboxed calls run.

``allowed/dir`` is atomically exchanged (``renameat2(RENAME_EXCHANGE)``) with
a symlink to an outside directory that holds a file of the same name. Every
read must return the inside bytes or fail; never a byte from outside. Two
outside targets: a temp dir (outside every plan) and ``/etc`` (readable by the
helper's platform-default reads but not by the request policy), which only the
child's fd-verified check stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from exec_server._os.linux import rename_exchange
from exec_server.client.fs import LocalFileSystem
from exec_server.exceptions import ExecServerError
from exec_server.fs.confined import SandboxedFileSystem

_AT_FDCWD = -100
HAS_HOSTNAME = os.path.exists("/etc/hostname")
HAS_BWRAP = shutil.which("bwrap") is not None


def _exchange(a: Path, b: Path) -> None:
    rename_exchange(_AT_FDCWD, os.fsencode(a), os.fsencode(b))


class Swapper:
    """Exchanges ``path`` with a symlink to ``target`` until stopped; counts swaps."""

    def __init__(self, path: Path, target: Path) -> None:
        self.path = path
        self.other = path.with_name(path.name + ".swap")
        self.other.symlink_to(target)
        self.stop = threading.Event()
        self.swaps = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            _exchange(self.path, self.other)
            self.swaps += 1

    def __enter__(self) -> Swapper:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
        if self.path.is_symlink():
            _exchange(self.path, self.other)


@pytest.fixture
def racing(layout: Any) -> tuple[Path, Path]:
    inside = layout.allowed / "dir"
    inside.mkdir()
    (inside / "hostname").write_bytes(b"inside-bytes\n")
    (layout.outside / "hostname").write_bytes(b"OUTSIDE-SECRET\n")
    return inside, layout.outside


async def _reads(fs: LocalFileSystem, path: Path, sandbox: Any, n: int) -> dict[str, int]:
    outcomes: dict[str, int] = {}

    async def one() -> None:
        try:
            data = await fs.read_file(path, sandbox=sandbox)
        except ExecServerError as exc:
            key = f"error {exc.code}"
        else:
            assert data == b"inside-bytes\n", data
            key = "inside"
        outcomes[key] = outcomes.get(key, 0) + 1

    for _ in range(n // 4):
        await asyncio.gather(*(one() for _ in range(4)))
    return outcomes


@pytest.mark.parametrize("target", ["tmp", "etc"])
async def test_swapped_component_never_leaks_outside_bytes(
    zygote_sfs: SandboxedFileSystem, layout: Any, ctx: Any, racing: tuple[Path, Path], target: str
) -> None:
    inside, outside = racing
    real_target = outside if target == "tmp" else Path("/etc")
    if target == "etc" and not HAS_HOSTNAME:
        pytest.skip("no /etc/hostname")
    fs = LocalFileSystem(confined=zygote_sfs)
    with Swapper(inside, real_target) as swapper:
        outcomes = await _reads(fs, inside / "hostname", ctx.ro(layout.allowed), 200)
    assert swapper.swaps > 0
    assert sum(outcomes.values()) == 200
    assert set(outcomes) <= {"inside", "error -32600", "error -32603", "error -32004"}
    print(f"swap race ({target}): {swapper.swaps} swaps, outcomes {outcomes}")


async def test_swapped_component_never_receives_writes(
    zygote_sfs: SandboxedFileSystem, layout: Any, ctx: Any, racing: tuple[Path, Path]
) -> None:
    inside, outside = racing
    fs = LocalFileSystem(confined=zygote_sfs)
    with Swapper(inside, outside) as swapper:
        for i in range(40):
            await asyncio.gather(
                *(
                    _write_quietly(fs, inside / f"w{i}-{j}.txt", ctx.ww(layout.allowed))
                    for j in range(4)
                )
            )
    assert swapper.swaps > 0
    assert sorted(p.name for p in outside.iterdir()) == ["hostname"]


async def _write_quietly(fs: LocalFileSystem, path: Path, sandbox: Any) -> None:
    with contextlib.suppress(ExecServerError):
        await fs.write_file(path, b"w", sandbox=sandbox)


async def test_one_shot_helper_under_swaps(
    layout: Any, ctx: Any, racing: tuple[Path, Path]
) -> None:
    from exec_server.config import ServerConfig
    from exec_server.sandbox.manager import SandboxManager

    if not HAS_BWRAP:
        pytest.skip("bubblewrap not installed")
    inside, _ = racing
    config = ServerConfig(fs_helper_timeout=20, sandbox_backend="bwrap")
    service = SandboxedFileSystem(config, SandboxManager(config), mode="helper")
    try:
        fs = LocalFileSystem(confined=service)
        with Swapper(inside, Path("/etc")):
            await _reads(fs, inside / "hostname", ctx.ro(layout.allowed), 16)
    finally:
        await service.aclose()
