"""File handles (PROTOCOL_CURRENT §4-§5): ``fs/open``, ``fs/readBlock``,
``fs/writeBlock``, ``fs/close``; limits, error codes and texts, per-connection
scope, closing on disconnect, sandboxed opens."""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
from pathlib import Path
from typing import Any

import msgspec
import pytest

from exec_server.client import sandbox_contexts as sc
from exec_server.client.fs import ExecutorFileSystem
from exec_server.exceptions import InternalError, InvalidRequestError, NotFoundError
from exec_server.fs.errors import FsNotFoundError
from exec_server.protocol.types import fs as t

from .conftest import open_live_server

MIB = 1024 * 1024


def uri(path: Path | str) -> str:
    return f"file://{os.fspath(path)}"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# -- through the client library, every backend


async def test_stream_read_in_blocks(fs: ExecutorFileSystem, tdir: Path) -> None:
    data = os.urandom(3 * MIB + 123)
    (tdir / "f").write_bytes(data)
    async with fs.open(tdir / "f") as f:
        blocks = [chunk async for chunk in f.chunks()]
        assert [len(b) for b in blocks] == [MIB, MIB, MIB, 123]
        assert b"".join(blocks) == data
        assert await f.read_block(10, 5) == (data[10:15], False)
        assert await f.read_block(len(data), 5) == (b"", True)
        assert await f.read_block(len(data) + 100, 5) == (b"", True)


async def test_eof_only_when_short(fs: ExecutorFileSystem, tdir: Path) -> None:
    (tdir / "f").write_bytes(b"abcd")
    async with fs.open(tdir / "f") as f:
        assert await f.read_block(0, 4) == (b"abcd", False)  # exactly to the end
        assert await f.read_block(4, 4) == (b"", True)
        assert await f.read_block(2, 4) == (b"cd", True)


async def test_a_handle_reads_what_was_opened(fs: ExecutorFileSystem, tdir: Path) -> None:
    (tdir / "f").write_bytes(b"old")
    async with fs.open(tdir / "f") as f:
        (tdir / "f").unlink()
        (tdir / "f").write_bytes(b"new contents")
        assert await f.read_all() == b"old"


async def test_replace_writes_blocks_in_place(fs: ExecutorFileSystem, tdir: Path) -> None:
    target = tdir / "w"
    target.write_bytes(b"previous contents, longer")
    os.chmod(target, 0o600)
    inode = target.stat().st_ino
    data = os.urandom(2 * MIB + 7)
    async with fs.open(target, "replace") as f:
        assert target.read_bytes() == b""  # truncated at open
        await f.write_all(data)
        assert target.read_bytes() == data  # visible before the close
        await f.write_block(len(data) + 3, b"z")  # a hole reads as zeros
    assert target.read_bytes() == data + b"\0\0\0z"
    assert target.stat().st_ino == inode
    assert target.stat().st_mode & 0o777 == 0o600


async def test_replace_through_a_link_truncates_the_target(
    fs: ExecutorFileSystem, tdir: Path
) -> None:
    (tdir / "t").write_bytes(b"target")
    (tdir / "l").symlink_to("t")
    async with fs.open(tdir / "l", "replace") as f:
        await f.write_block(0, b"X")
    assert (tdir / "l").is_symlink()
    assert (tdir / "t").read_bytes() == b"X"


async def test_replace_creates(fs: ExecutorFileSystem, tdir: Path) -> None:
    async with fs.open(tdir / "new", "replace") as f:
        await f.write_block(0, b"hi")
    assert (tdir / "new").read_bytes() == b"hi"


async def test_open_errors(fs: ExecutorFileSystem, tdir: Path) -> None:
    (tdir / "d").mkdir()
    os.mkfifo(tdir / "fifo")
    with pytest.raises(NotFoundError, match=r"^No such file or directory \(os error 2\)$"):
        await fs.open(tdir / "missing")
    with pytest.raises(InvalidRequestError, match=rf"^path `{tdir}/d` is not a file$"):
        await fs.open(tdir / "d")
    with pytest.raises(InvalidRequestError, match=rf"^path `{tdir}/fifo` is not a file$"):
        await fs.open(tdir / "fifo")  # without waiting for a writer
    with pytest.raises(InternalError, match=r"^Is a directory \(os error 21\)$"):
        await fs.open(tdir / "d", "replace")
    with pytest.raises(NotFoundError):
        await fs.open(tdir / "no" / "f", "replace")
    assert not (tdir / "no").exists()


async def test_block_errors(fs: ExecutorFileSystem, tdir: Path) -> None:
    (tdir / "f").write_bytes(b"abc")
    async with fs.open(tdir / "f") as f:
        for length in (0, MIB + 1):
            with pytest.raises(InvalidRequestError, match="between 1 and 1048576"):
                await f.read_block(0, length)
        assert await f.read_block(0, MIB) == (b"abc", True)  # still open
        with pytest.raises(InternalError, match=r"Bad file descriptor \(os error 9\)"):
            await f.write_block(0, b"x")
        assert await f.read_block(0, 1) == (b"a", False)  # a write error keeps it open
        with pytest.raises(InvalidRequestError, match=r"^Invalid argument \(os error 22\)$"):
            await f.read_block(2**64 - 1, 1)
        with pytest.raises(NotFoundError, match=r"^unknown file handle `[0-9a-f]{32}`$"):
            await f.read_block(0, 1)  # a failed read closed it
    async with fs.open(tdir / "w", "replace") as w:
        with pytest.raises(InvalidRequestError, match="write block length must be between"):
            await w.write_block(0, b"")
        with pytest.raises(InvalidRequestError, match="signed 64-bit file offset limit"):
            await w.write_block(2**63 - 1, b"xy")
        await w.write_block(0, b"ok")  # validation errors leave it usable
        with pytest.raises(InternalError, match=r"^Bad file descriptor \(os error 9\)$"):
            await w.read_block(0, 1)
    assert (tdir / "w").read_bytes() == b"ok"


# -- on the wire


async def test_ids_limits_and_check_order(wire: Any, tdir: Path) -> None:
    (tdir / "f").write_bytes(b"x")
    f = uri(tdir / "f")
    long_id = "é" * 17  # 34 bytes, 17 characters
    for method, params in [
        ("fs/open", {"handleId": long_id, "path": f}),
        ("fs/readBlock", {"handleId": long_id, "offset": 0, "len": 1}),
        ("fs/writeBlock", {"handleId": long_id, "offset": 0, "chunk": "eA=="}),
        ("fs/close", {"handleId": long_id}),
    ]:
        reply = await wire.raw(method, params)
        assert reply["error"] == {
            "code": -32600,
            "message": "file handle ID must not exceed 32 bytes",
        }
    assert (await wire.raw("fs/open", {"handleId": "", "path": f}))["result"] == {"handleId": ""}
    reply = await wire.raw("fs/open", {"handleId": "", "path": f})
    assert reply["error"] == {"code": -32600, "message": "file handle `` already exists"}
    for i in range(127):
        reply = await wire.raw("fs/open", {"handleId": str(i), "path": f})
        assert reply["result"] == {"handleId": str(i)}
    reply = await wire.raw("fs/open", {"handleId": "x", "path": uri(tdir / "missing")})
    assert reply["error"] == {
        "code": -32600,
        "message": "at most 128 file handles may be open per connection",
    }
    assert (await wire.raw("fs/close", {"handleId": "5"}))["result"] == {}
    assert (await wire.raw("fs/close", {"handleId": "5"}))["result"] == {}  # idempotent
    assert (await wire.raw("fs/close", {"handleId": "unknown"}))["result"] == {}
    reply = await wire.raw("fs/open", {"handleId": "5", "path": f})  # a slot and the id again
    assert reply["result"] == {"handleId": "5"}
    for i in [*range(127), ""]:
        await wire.raw("fs/close", {"handleId": str(i)})


async def test_wire_shapes_and_params_errors(wire: Any, tdir: Path) -> None:
    (tdir / "f").write_bytes(b"hello")
    f = uri(tdir / "f")
    assert (await wire.raw("fs/open", {"handleId": "h", "path": f, "mode": "read"}))["result"]
    reply = await wire.raw("fs/readBlock", {"handleId": "h", "offset": 1, "len": 3})
    assert reply["result"] == {"chunk": b64(b"ell"), "eof": False}
    for params, text in [
        ({"handleId": "h", "offset": 0}, "missing field `len`"),
        ({"handleId": "h", "offset": -1, "len": 1}, ""),
        ({"handleId": "h", "offset": "3", "len": 1}, ""),
        ({"handleId": "h", "offset": 2**64, "len": 1}, ""),
    ]:
        reply = await wire.raw("fs/readBlock", params)
        assert reply["error"]["code"] == -32602, params
        assert text in reply["error"]["message"]
    for mode in (None, "bogus"):
        reply = await wire.raw("fs/open", {"handleId": "m", "path": f, "mode": mode})
        assert reply["error"]["code"] == -32602
    reply = await wire.raw("fs/open", {"handleId": "m", "path": str(tdir / "f")})
    assert "result" in reply  # ours takes plain paths too (both generations)
    reply = await wire.raw("fs/readBlock", {"handleId": "nope", "offset": 0, "len": 1})
    assert reply["error"] == {"code": -32004, "message": "unknown file handle `nope`"}
    reply = await wire.raw("fs/writeBlock", {"handleId": "nope", "offset": 0, "chunk": "eA=="})
    assert reply["error"] == {"code": -32004, "message": "unknown file handle `nope`"}
    reply = await wire.raw("fs/writeBlock", {"handleId": "h", "offset": 0, "chunk": "!!"})
    assert reply["error"]["code"] == -32602


# -- per connection, closed on disconnect


async def call(client: Any, method: str, params: dict[str, Any]) -> Any:
    types = {
        "fs/open": t.OpenParams,
        "fs/readBlock": t.ReadBlockParams,
        "fs/close": t.CloseParams,
    }
    struct = msgspec.convert(params, types[method])
    return await client.call(method, struct, dict)


def _open_fds_to(path: Path) -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                count += 1
        except OSError:
            pass
    return count


async def test_handles_are_per_connection_and_closed_with_it(tdir: Path, wait_until: Any) -> None:
    target = tdir / "f"
    target.write_bytes(b"data")
    async with open_live_server() as live:
        one = await live.client()
        two = await live.client()
        params = {"handleId": "h", "path": uri(target)}
        assert await call(one, "fs/open", params) == {"handleId": "h"}
        assert _open_fds_to(target) == 1
        with pytest.raises(NotFoundError, match="unknown file handle `h`"):
            await call(two, "fs/readBlock", {"handleId": "h", "offset": 0, "len": 4})
        assert await call(two, "fs/close", {"handleId": "h"}) == {}  # not one's handle
        read = {"handleId": "h", "offset": 0, "len": 4}
        assert await call(one, "fs/readBlock", read) == {"chunk": b64(b"data"), "eof": False}
        assert await call(two, "fs/open", params) == {"handleId": "h"}  # its own
        assert _open_fds_to(target) == 2
        await one.aclose()
        await wait_until(lambda: _open_fds_to(target) == 1, timeout=10)
        assert await call(two, "fs/readBlock", read) == {"chunk": b64(b"data"), "eof": False}
        await two.aclose()
        await wait_until(lambda: _open_fds_to(target) == 0, timeout=10)


async def test_many_handles_dropped_by_a_disconnect_leak_nothing(
    tdir: Path, wait_until: Any
) -> None:
    target = tdir / "f"
    target.write_bytes(b"x" * 10)
    async with open_live_server() as live:
        client = await live.client()
        opens = [
            call(client, "fs/open", {"handleId": f"h{i}", "path": uri(target)}) for i in range(100)
        ]
        await asyncio.gather(*opens)
        assert _open_fds_to(target) == 100
        await client.aclose()
        await wait_until(lambda: _open_fds_to(target) == 0, timeout=10)


# -- sandboxed


async def test_sandboxed_open_outside_the_readable_roots_is_refused(
    sandboxed_fs: ExecutorFileSystem, tdir: Path
) -> None:
    ws = tdir / "ws"
    ws.mkdir()
    (ws / "in.txt").write_bytes(b"inside")
    (tdir / "secret").write_bytes(b"secret")
    (ws / "link").symlink_to(tdir / "secret")
    sandbox = sc.read_only(ws, full_read=False)
    async with sandboxed_fs.open(ws / "in.txt", sandbox=sandbox) as f:
        assert await f.read_all() == b"inside"
    for path in (tdir / "secret", ws / "link"):
        with pytest.raises(InvalidRequestError, match="secret is not permitted by filesystem"):
            await sandboxed_fs.open(path, sandbox=sandbox)


async def test_sandboxed_replace_honours_the_writable_roots(
    sandboxed_fs: ExecutorFileSystem, tdir: Path
) -> None:
    ws = tdir / "ws"
    (ws / ".git").mkdir(parents=True)
    (ws / ".git" / "config").write_bytes(b"keep")
    (tdir / "outside").write_bytes(b"keep")
    sandbox = sc.workspace_write(ws, tmp=False)
    async with sandboxed_fs.open(ws / "new", "replace", sandbox=sandbox) as f:
        await f.write_block(0, b"written")
    assert (ws / "new").read_bytes() == b"written"
    for path in (tdir / "outside", ws / ".git" / "config", tdir / "created"):
        with pytest.raises(InvalidRequestError, match=f"^{path} is not permitted by filesystem"):
            await sandboxed_fs.open(path, "replace", sandbox=sandbox)
    assert (tdir / "outside").read_bytes() == b"keep"
    assert (ws / ".git" / "config").read_bytes() == b"keep"
    assert not (tdir / "created").exists()
    read_only = sc.read_only(ws)
    with pytest.raises(InvalidRequestError, match="is not permitted by filesystem sandbox"):
        await sandboxed_fs.open(ws / "new", "replace", sandbox=read_only)
    assert (ws / "new").read_bytes() == b"written"


# -- the table's own rules (no I/O in flight can lose a descriptor)


def test_an_open_that_finishes_after_its_request_gave_up_is_closed(tdir: Path) -> None:
    from exec_server.fs.handles import FileHandles, open_descriptor

    target = tdir / "f"
    target.write_bytes(b"x")
    handles = FileHandles()
    handle = handles.reserve("h")
    handles.release("h", handle)  # the request was cancelled while the worker opened
    handles.install(handle, open_descriptor(str(target), "read"))
    assert _open_fds_to(target) == 0
    handle = handles.reserve("h")  # the id is free again
    handles.install(handle, open_descriptor(str(target), "read"))
    assert _open_fds_to(target) == 1
    handles.close_all()
    assert _open_fds_to(target) == 0


def test_closing_the_table_during_an_open_closes_what_it_opens(tdir: Path) -> None:
    from exec_server.fs.handles import FileHandles, open_descriptor

    target = tdir / "f"
    target.write_bytes(b"x")
    handles = FileHandles()
    handle = handles.reserve("h")
    handles.close_all()  # the connection ended while the worker opened
    handles.install(handle, open_descriptor(str(target), "read"))
    assert _open_fds_to(target) == 0
    with pytest.raises(FsNotFoundError, match="unknown file handle `h`"):
        handles.read_block("h", 0, 1)  # the table did not keep it


async def test_sandboxed_open_runs_in_the_confined_helper(
    sandboxed_fs: ExecutorFileSystem, tdir: Path
) -> None:
    """The confined child opens the file, without the server's capabilities (a file
    without write bits cannot be replaced, as in upstream's helper, though root could),
    and hands the descriptor over: blocks then go straight to the file."""
    ws = tdir / "ws"
    ws.mkdir()
    (ws / "ro").write_bytes(b"keep")
    (ws / "ro").chmod(0o444)
    (ws / "d").mkdir()
    sandbox = sc.workspace_write(ws, full_read=False, tmp=False)
    with pytest.raises(InvalidRequestError, match=r"^Permission denied \(os error 13\)$"):
        await sandboxed_fs.open(ws / "ro", "replace", sandbox=sandbox)
    assert (ws / "ro").read_bytes() == b"keep"
    with pytest.raises(InvalidRequestError, match=rf"^path `{ws}/d` is not a file$"):
        await sandboxed_fs.open(ws / "d", sandbox=sandbox)
    async with sandboxed_fs.open(ws / "ro", sandbox=sandbox) as f:
        assert await f.read_all() == b"keep"
    data = os.urandom(MIB + 5)
    async with sandboxed_fs.open(ws / "new", "replace", sandbox=sandbox) as w:
        await w.write_all(data)
    assert (ws / "new").read_bytes() == data
    async with sandboxed_fs.open(ws / "new", sandbox=sandbox) as f:
        assert await f.read_all() == data
        assert _open_fds_to(ws / "new") == 1  # the descriptor the helper passed
    assert _open_fds_to(ws / "new") == 0
    assert _open_fds_to(ws / "ro") == 0


@pytest.mark.parametrize("backend", ["bwrap", "landlock"])
async def test_sandboxed_open_with_the_one_shot_helper(tdir: Path, backend: str) -> None:
    """Without the zygote nothing can pass a descriptor: the checked location is opened
    in the server, following no link; the policy still decides."""
    from exec_server.client.fs import LocalFileSystem
    from exec_server.config import ServerConfig
    from exec_server.fs.confined import SandboxedFileSystem
    from exec_server.sandbox.manager import SandboxManager

    if backend == "bwrap" and not shutil.which("bwrap"):
        pytest.skip("bubblewrap not installed")
    config = ServerConfig(fs_helper_timeout=20, sandbox_backend=backend)  # type: ignore[arg-type]
    service = SandboxedFileSystem(config, SandboxManager(config), mode="helper")
    ws = tdir / "ws"
    ws.mkdir()
    (ws / "in").write_bytes(b"inside")
    (tdir / "secret").write_bytes(b"secret")
    try:
        fs = LocalFileSystem(confined=service)
        sandbox = sc.workspace_write(ws, full_read=False, tmp=False)
        async with fs.open(ws / "in", sandbox=sandbox) as f:
            assert await f.read_all() == b"inside"
        async with fs.open(ws / "out", "replace", sandbox=sandbox) as w:
            await w.write_block(0, b"written")
        assert (ws / "out").read_bytes() == b"written"
        with pytest.raises(InvalidRequestError, match="is not permitted by filesystem sandbox"):
            await fs.open(tdir / "secret", sandbox=sandbox)
        with pytest.raises(InvalidRequestError, match="is not permitted by filesystem sandbox"):
            await fs.open(tdir / "secret", "replace", sandbox=sandbox)
        assert (tdir / "secret").read_bytes() == b"secret"
        assert service.zygote.pid is None
        await fs.aclose()
    finally:
        await service.aclose()
