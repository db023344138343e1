"""Fixtures for the sandboxed-filesystem tests.

``confinement`` picks how each request is confined: ``zygote`` (the fast
path), or the one-shot ``--codex-run-as-fs-helper`` through the ``bwrap`` or
``landlock`` backend of the sandbox manager. ``backend`` picks the client
side: ``local`` (``LocalFileSystem`` handing confined calls to the service) or
``remote`` (``RemoteFileSystem`` over the real server router and ``fs/*``
handlers). ``sfs`` is the service under test; it is closed (zygote, children
and helpers killed and reaped) at teardown.

``ctx.ro(root)`` / ``ctx.ww(root)`` build §15.6's RO/WW legacy contexts,
``ctx.current_ww(workspace)`` the current client's managed context.
``layout`` is PROTOCOL.md §15.6's temp dir ``T`` with ``T/allowed``,
``T/outside`` and ``T/allowed/link -> T/outside``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from exec_server.client.fs import ExecutorFileSystem, LocalFileSystem, RemoteFileSystem
from exec_server.client.sandbox_contexts import to_wire, workspace_write
from exec_server.config import ServerConfig
from exec_server.fs.confined import SandboxedFileSystem
from exec_server.fs.helper.client import Zygote
from exec_server.fs.helper.confine import landlock_abi
from exec_server.sandbox.manager import SandboxManager
from exec_server.server.services import ServerServices

T = TypeVar("T")
ContextMaker = Callable[[str | os.PathLike[str]], dict[str, Any]]

HAS_LANDLOCK = landlock_abi() > 0
HAS_BWRAP = shutil.which("bwrap") is not None

needs_landlock = pytest.mark.skipif(not HAS_LANDLOCK, reason="kernel without Landlock")


def current_context(workspace: Path | str, entries: list[dict[str, Any]]) -> dict[str, Any]:
    """A current-client ``managed`` + ``restricted`` fs context rooted at ``workspace``
    with these ``entries`` (the shape codex 0.163 sends, CLIENT_COMPAT §1.4)."""
    uri = "file://" + str(workspace)
    return {
        "permissions": {
            "type": "managed",
            "file_system": {"type": "restricted", "entries": entries},
            "network": "restricted",
        },
        "cwd": uri,
        "policyContext": {"cwd": uri, "workspaceRoots": [uri]},
        "workspaceRoots": [uri],
        "userHomeDir": "file:///home/user",
        "temporaryDirectories": [],
        "windowsSandboxLevel": "disabled",
        "useLegacyLandlock": False,
    }


def current_ww(workspace: Path | str, *, tmp: bool = True) -> dict[str, Any]:
    """The current client's workspace-write context as sent on fs calls (CLIENT_COMPAT §1.4),
    from the client library's builder.

    ``tmp=False`` drops the ``slash_tmp``/``tmpdir`` write entries (test
    directories live under /tmp, which those entries would make writable).
    """
    return to_wire(workspace_write(workspace, tmp=tmp, home="/home/user"))


@dataclass(frozen=True)
class Contexts:
    """The sandbox contexts tests use, as a fixture (tests never import conftest)."""

    ro: ContextMaker
    ww: ContextMaker
    current_ww: Callable[..., dict[str, Any]] = current_ww
    #: ``current(workspace, entries)``: any current-client restricted context.
    current: Callable[..., dict[str, Any]] = current_context


@pytest.fixture
def ctx(read_only_context: ContextMaker, legacy_workspace_write_context: ContextMaker) -> Contexts:
    """RO/WW from the root conftest's fixtures, and the current client's context."""
    return Contexts(ro=read_only_context, ww=legacy_workspace_write_context)


@dataclass
class Layout:
    root: Path
    allowed: Path
    outside: Path
    link: Path


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    root = Path(os.path.realpath(tmp_path))
    allowed = root / "allowed"
    outside = root / "outside"
    allowed.mkdir()
    outside.mkdir()
    link = allowed / "link"
    link.symlink_to(outside)
    return Layout(root, allowed, outside, link)


@pytest.fixture
def make_caller(router_caller: Any) -> Any:
    """``make_caller(sfs)``: a router caller whose services use ``sfs`` for confined calls."""

    def make(service: SandboxedFileSystem) -> Any:
        return router_caller(ServerServices(service._config, None, service))

    return make


def make_service(confinement: str, *, test_hooks: bool = False) -> SandboxedFileSystem:
    if confinement == "zygote":
        if not HAS_LANDLOCK:
            pytest.skip("kernel without Landlock")
        config = ServerConfig(fs_helper_timeout=10)
        return SandboxedFileSystem(
            config, SandboxManager(config), mode="zygote", zygote=Zygote(test_hooks=test_hooks)
        )
    backend = confinement.removeprefix("helper-")
    if backend == "bwrap" and not HAS_BWRAP:
        pytest.skip("bubblewrap not installed")
    if backend == "landlock" and not HAS_LANDLOCK:
        pytest.skip("kernel without Landlock")
    config = ServerConfig(fs_helper_timeout=20, sandbox_backend=backend)  # type: ignore[arg-type]
    return SandboxedFileSystem(config, SandboxManager(config), mode="helper")


@pytest.fixture
async def zygote_sfs() -> AsyncIterator[SandboxedFileSystem]:
    """The fast path with failure injection enabled."""
    service = make_service("zygote", test_hooks=True)
    yield service
    await service.aclose()


#: (confinement, client backend): every confinement path on both client backends.
MATRIX = [
    (confinement, backend)
    for confinement in ("zygote", "helper-bwrap", "helper-landlock")
    for backend in ("local", "remote")
]


@pytest.fixture(params=MATRIX, ids=["-".join(p) for p in MATRIX])
async def sfs_fs(
    request: pytest.FixtureRequest, router_caller: Any
) -> AsyncIterator[tuple[SandboxedFileSystem, ExecutorFileSystem]]:
    confinement, backend = request.param
    service = make_service(confinement)
    fs: ExecutorFileSystem
    if backend == "local":
        fs = LocalFileSystem(confined=service)
    else:
        fs = RemoteFileSystem(router_caller(ServerServices(service._config, None, service)))
    yield service, fs
    await service.aclose()


@pytest.fixture
async def fs(sfs_fs: tuple[SandboxedFileSystem, ExecutorFileSystem]) -> ExecutorFileSystem:
    return sfs_fs[1]


async def _process_gone(pid: int, timeout: float = 10.0) -> None:  # noqa: ASYNC109
    """Await the exit of ``pid`` (its pidfd becomes readable), with a deadline."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    loop.add_reader(fd, done.set)
    try:
        async with asyncio.timeout(timeout):
            await done.wait()
    finally:
        loop.remove_reader(fd)
        os.close(fd)


@pytest.fixture
def process_gone() -> Callable[[int], Awaitable[None]]:
    """``await process_gone(pid)``: the process has exited (deadline 10 s)."""
    return _process_gone
