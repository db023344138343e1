"""Confined calls answer dangling links, symlinks and FIFOs as the direct path does.

Each confined answer is compared with the same call made without a sandbox
(the direct path, PROTOCOL.md §9.3 / CLIENT_COMPAT.md §6), on every
confinement path and client backend (see conftest's ``fs``), under contexts
whose reads are restricted (so reads run in the confined helper, not
directly). The last tests drive a real ``exec-server serve`` child with the
context codex 0.163 sends when reads are restricted to its workspace.
"""

from __future__ import annotations

import asyncio
import base64
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from exec_server.client.fs import ExecutorFileSystem
from exec_server.exceptions import ExecServerError
from exec_server.fs.confined import SandboxedFileSystem


def uri(path: Path) -> str:
    return "file://" + str(path)


def restricted_entries() -> list[dict[str, Any]]:
    """The current client's entries reading only its workspace (and the platform minimum)."""

    def entry(kind: str, access: str, subpath: str | None = None) -> dict[str, Any]:
        value = {"kind": kind} if subpath is None else {"kind": kind, "subpath": subpath}
        out: dict[str, Any] = {"path": {"type": "special", "value": value}, "access": access}
        if subpath is not None:
            out["missing_path_behavior"] = "skip"
        return out

    return [
        entry("minimal", "read"),
        entry("project_roots", "write"),
        *(entry("project_roots", "read", s) for s in (".git", ".agents", ".codex")),
    ]


@dataclass
class Tree:
    root: Path
    ws: Path
    elsewhere: Path


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    root = Path(os.path.realpath(tmp_path))
    ws = root / "ws"
    elsewhere = root / "elsewhere"
    ws.mkdir()
    elsewhere.mkdir()
    (ws / "file.txt").write_text("hello")
    (ws / "dangling").symlink_to(ws / "missing")
    (ws / "dangling_rel").symlink_to("missing")
    (ws / "loop").symlink_to("loop")
    (ws / "link_in").symlink_to("file.txt")
    (elsewhere / "link_to_ws").symlink_to(ws / "file.txt")
    os.mkfifo(ws / "fifo")
    return Tree(root, ws, elsewhere)


#: Contexts that read only the workspace: legacy RO and WW, the current client's.
RESTRICTED = ["legacy-ro", "legacy-ww", "current"]


def restricted_context(name: str, ctx: Any, ws: Path) -> dict[str, Any]:
    if name == "legacy-ro":
        return dict(ctx.ro(ws))
    if name == "legacy-ww":
        return dict(ctx.ww(ws))
    return ctx.current(ws, restricted_entries())


async def outcome(call: Any) -> tuple[str, Any]:
    """``("ok", result)`` or ``("error", (code, message))``."""
    try:
        return "ok", await call
    except ExecServerError as exc:
        return "error", (exc.code, exc.message)


def reads(fs: ExecutorFileSystem, path: Path, sandbox: Any) -> dict[str, Any]:
    return {
        "readFile": fs.read_file(path, sandbox=sandbox),
        "getMetadata": fs.get_metadata(path, sandbox=sandbox),
        "readDirectory": fs.read_directory(path, sandbox=sandbox),
        "canonicalize": fs.canonicalize(path, sandbox=sandbox),
    }


@pytest.mark.parametrize("context", RESTRICTED)
async def test_confined_reads_of_a_dangling_or_looping_link_answer_as_direct(
    fs: ExecutorFileSystem, tree: Tree, ctx: Any, context: str
) -> None:
    sandbox = restricted_context(context, ctx, tree.ws)
    # The client's apply_patch and probes depend on -32004 (CLIENT_COMPAT §6.5).
    not_found = ("error", (-32004, "No such file or directory (os error 2)"))
    loop = ("error", (-32603, "Symbolic link loop (os error 40)"))
    for name, expected in (("dangling", not_found), ("dangling_rel", not_found), ("loop", loop)):
        path = tree.ws / name
        confined = {m: await outcome(c) for m, c in reads(fs, path, sandbox).items()}
        direct = {m: await outcome(c) for m, c in reads(fs, path, None).items()}
        assert confined == direct, name
        assert set(confined.values()) == {expected}, name
        assert path.is_symlink()


@pytest.mark.parametrize("context", ["legacy-ww", "current"])
async def test_a_broken_link_where_a_directory_goes_is_file_exists_confined_as_direct(
    fs: ExecutorFileSystem, tree: Tree, ctx: Any, context: str
) -> None:
    """A recursive createDirectory of a link leading nowhere or to itself, and a tree
    copy whose subdirectory's place holds one (or a file), answer "File exists", as
    the direct path and upstream's create_dir_all do. The confined helper answered
    the link's own error (Not a directory, or a symbolic link loop): found by the
    sandboxed random differential test (tests/fs/test_upstream_fs_random.py)."""
    sandbox = restricted_context(context, ctx, tree.ws)
    exists = ("error", (-32603, "File exists (os error 17)"))
    source = tree.ws / "src"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "f").write_text("f")
    for name in ("dangling", "dangling_rel", "loop"):
        path = tree.ws / name
        for box in (sandbox, None):
            made = await outcome(fs.create_directory(path, recursive=True, sandbox=box))
            assert made == exists, (name, box)
        dest = tree.ws / f"dest-{name}"
        dest.mkdir()
        (dest / "sub").symlink_to(os.readlink(path))
        for box in (sandbox, None):
            copied = await outcome(fs.copy(source, dest, recursive=True, sandbox=box))
            assert copied == exists, (name, box)
        assert path.is_symlink() and (dest / "sub").is_symlink()  # left as they were
    blocked = tree.ws / "dest-file"
    blocked.mkdir()
    (blocked / "sub").write_text("a file")
    for box in (sandbox, None):
        assert await outcome(fs.copy(source, blocked, recursive=True, sandbox=box)) == exists
    assert (blocked / "sub").read_text() == "a file"


@pytest.mark.parametrize("context", RESTRICTED)
async def test_confined_get_metadata_of_a_symlink_reports_is_symlink(
    fs: ExecutorFileSystem, tree: Tree, ctx: Any, context: str
) -> None:
    sandbox = restricted_context(context, ctx, tree.ws)
    link = tree.ws / "link_in"
    confined = await fs.get_metadata(link, sandbox=sandbox)
    assert confined == await fs.get_metadata(link)
    assert (confined.is_file, confined.is_symlink, confined.size) == (True, True, 5)
    # The target itself is no link; reading through the link is unchanged.
    target = await fs.get_metadata(tree.ws / "file.txt", sandbox=sandbox)
    assert (target.is_file, target.is_symlink) == (True, False)
    assert await fs.read_file(link, sandbox=sandbox) == b"hello"
    assert await fs.canonicalize(link, sandbox=sandbox) == str(tree.ws / "file.txt")


async def test_is_symlink_of_a_link_the_policy_cannot_read_is_not_reported(
    fs: ExecutorFileSystem, tree: Tree, ctx: Any
) -> None:
    # The path resolves into the readable workspace, so the call is allowed
    # (§10.2 checks the resolved path), but the link itself lives where the
    # policy reads nothing: nothing is said about it.
    meta = await fs.get_metadata(tree.elsewhere / "link_to_ws", sandbox=ctx.ro(tree.ws))
    assert (meta.is_file, meta.is_symlink, meta.size) == (True, False, 5)
    assert (await fs.get_metadata(tree.elsewhere / "link_to_ws")).is_symlink is True


async def test_a_final_link_that_resolves_in_the_child_is_not_followed(
    zygote_sfs: SandboxedFileSystem, tree: Tree
) -> None:
    """The child follows a final link only to report that it leads nowhere.

    Straight to the zygote, as if ``ws/dangling`` had got its target between
    the server's check (which saw nothing behind it) and the child's use: the
    target was never checked, so it is not read, listed, stat'ed or named.
    """
    (tree.ws / "missing").write_text("created since the check")
    path = tree.ws / "dangling"
    plan = {
        "full_read": False,
        "full_write": False,
        "network": False,
        "readable_roots": [str(tree.ws)],
        "writable_roots": [],
    }
    changed = f"{path} changed while the sandboxed operation was running"
    for op in ("fs/readFile", "fs/getMetadata", "fs/readDirectory", "fs/canonicalize"):
        header: dict[str, object] = {
            "op": op,
            "path": str(path),
            "expect": str(tree.ws),
            "plan": plan,
        }
        reply, payload = await zygote_sfs.zygote.run(header, b"", timeout=10)
        assert reply == {"status": "error", "code": -32603, "message": changed}, op
        assert payload == b""


#: Contexts whose writes run in the confined helper: codex's workspace-write
#: (reads everything), legacy WW and the current client's restricted-read one.
WRITERS = ["current-ww", "legacy-ww", "current"]


def writer_context(name: str, ctx: Any, ws: Path) -> dict[str, Any]:
    if name == "current-ww":
        return dict(ctx.current_ww(ws, tmp=False))
    return restricted_context(name, ctx, ws)


@pytest.mark.parametrize("context", WRITERS)
async def test_confined_copy_onto_a_fifo_without_reader_fails_at_once_as_direct(
    fs: ExecutorFileSystem, tree: Tree, ctx: Any, context: str
) -> None:
    sandbox = writer_context(context, ctx, tree.ws)
    fifo = tree.ws / "fifo"
    src = tree.ws / "file.txt"
    confined = await outcome(fs.copy(src, fifo, recursive=False, sandbox=sandbox))
    direct = await outcome(fs.copy(src, fifo, recursive=False))
    assert confined == direct == ("error", (-32603, "No such device or address (os error 6)"))
    # The same inside a recursive copy merging into a directory holding a FIFO.
    (tree.ws / "srcdir").mkdir()
    (tree.ws / "srcdir" / "fifo").write_text("into the pipe")
    (tree.ws / "dstdir").mkdir()
    os.mkfifo(tree.ws / "dstdir" / "fifo")
    confined = await outcome(
        fs.copy(tree.ws / "srcdir", tree.ws / "dstdir", recursive=True, sandbox=sandbox)
    )
    direct = await outcome(fs.copy(tree.ws / "srcdir", tree.ws / "dstdir", recursive=True))
    assert confined == direct == ("error", (-32603, "No such device or address (os error 6)"))


def read_up_to(fd: int, size: int) -> bytes:
    """Blocking reads until ``size`` bytes or EOF."""
    chunks: list[bytes] = []
    got = 0
    while got < size:
        chunk = os.read(fd, size - got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize("context", WRITERS)
async def test_confined_copy_onto_a_fifo_with_reader_writes_it_all_as_direct(
    fs: ExecutorFileSystem, tree: Tree, ctx: Any, context: str
) -> None:
    sandbox = writer_context(context, ctx, tree.ws)
    fifo = tree.ws / "fifo"
    src = tree.ws / "big.bin"
    payload = os.urandom(1 << 20)  # 16 pipe buffers: the writer must wait for the reader
    src.write_bytes(payload)
    for sb in (sandbox, None):
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        # A writer of our own until the copy is over: the reader meets EOF only
        # after it (all of it if the copy wrote everything, else short).
        keep = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.set_blocking(reader, True)
        drained = asyncio.ensure_future(asyncio.to_thread(read_up_to, reader, len(payload) + 1))
        try:
            result = await outcome(fs.copy(src, fifo, recursive=False, sandbox=sb))
        finally:
            os.close(keep)
            got = await drained
            os.close(reader)
        assert result == ("ok", None), sb
        assert got == payload, sb


async def test_confined_legacy_read_of_a_fifo_answers_as_direct(
    sfs_fs: tuple[SandboxedFileSystem, ExecutorFileSystem], make_caller: Any, tree: Tree, ctx: Any
) -> None:
    # Legacy requests (plain paths) read FIFOs and devices (§9.3) without
    # waiting for a writer: confined as on the server's direct route.
    caller = make_caller(sfs_fs[0])
    fifo = str(tree.ws / "fifo")

    async def read(sandbox: Any) -> Any:
        reply = await caller.raw("fs/readFile", {"path": fifo, "sandbox": sandbox})
        return reply.get("result", reply.get("error"))

    for sandbox in (ctx.ro(tree.ws), ctx.ww(tree.ws), None):
        assert await read(sandbox) == {"dataBase64": ""}, sandbox
        writer = os.open(fifo, os.O_RDWR)  # a writer that stays, bytes waiting
        try:
            os.write(writer, b"queued")
            assert await read(sandbox) == {"dataBase64": "cXVldWVk"}, sandbox
        finally:
            os.close(writer)


# ---------------------------------------------------------------- a real server


async def test_codex_restricted_context_end_to_end(
    server_factory: Any, rpc: Any, tree: Tree, ctx: Any
) -> None:
    server = server_factory(cwd=tree.ws)
    client = await rpc(server.url)
    await client.initialize()
    sandbox = ctx.current(tree.ws, restricted_entries())

    async def both(method: str, **params: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        confined: dict[str, Any] = await client.request(method, {**params, "sandbox": sandbox})
        direct: dict[str, Any] = await client.request(method, {**params, "sandbox": None})
        confined.pop("id")
        direct.pop("id")
        return confined, direct

    not_found = {"error": {"code": -32004, "message": "No such file or directory (os error 2)"}}
    for method in ("fs/readFile", "fs/getMetadata", "fs/canonicalize"):
        confined, direct = await both(method, path=uri(tree.ws / "dangling"))
        assert confined == direct == not_found, method
    confined, direct = await both("fs/getMetadata", path=uri(tree.ws / "link_in"))
    assert confined == direct
    assert confined["result"]["isSymlink"] is True and confined["result"]["isFile"] is True
    # Not a file for the current client, confined or not.
    confined, direct = await both("fs/readFile", path=uri(tree.ws / "fifo"))
    assert confined == direct
    assert confined["error"] == {
        "code": -32600,
        "message": f"path `{tree.ws / 'fifo'}` is not a file",
    }
    confined, direct = await both(
        "fs/copy",
        sourcePath=uri(tree.ws / "file.txt"),
        destinationPath=uri(tree.ws / "fifo"),
        recursive=False,
    )
    assert confined == direct
    assert confined["error"] == {
        "code": -32603,
        "message": "No such device or address (os error 6)",
    }
    # The connection answers the next request (nothing held behind the copy).
    r = await client.request("fs/readFile", {"path": uri(tree.ws / "file.txt"), "sandbox": sandbox})
    assert base64.b64decode(r["result"]["dataBase64"]) == b"hello"
