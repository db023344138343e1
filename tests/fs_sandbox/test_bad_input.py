"""Malformed contexts; helpers that crash, babble or hang; a dying zygote.

Each yields a clear error and leaves no process behind.
"""

from __future__ import annotations

import asyncio
import base64
import errno
import json
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from exec_server.client.fs import LocalFileSystem
from exec_server.config import ServerConfig
from exec_server.exceptions import InternalError, from_domain_error
from exec_server.fs.confined import SandboxedFileSystem
from exec_server.fs.errors import FsFailedError, fs_error_from_os
from exec_server.fs.helper import ops as helper_ops
from exec_server.fs.helper.client import Zygote
from exec_server.protocol.types.sandbox import decode_fs_sandbox
from exec_server.sandbox.manager import SandboxManager

TIMEOUT = 10.0


def zygote_children(sfs: SandboxedFileSystem) -> set[int]:
    pid = sfs.zygote.pid
    if pid is None:
        return set()
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except FileNotFoundError:
        return set()
    return {int(p) for p in text.split()}


def inject(sfs: SandboxedFileSystem, hook: str) -> None:
    """Make every request of ``sfs`` carry a failure-injection hook."""
    zygote = sfs.zygote
    original: Callable[..., Awaitable[Any]] = zygote.run

    async def run(
        header: dict[str, object],
        data: bytes = b"",
        *,
        timeout: float,  # noqa: ASYNC109
        owner: Any = None,
    ) -> Any:
        return await original(
            {**header, "test_hook": hook}, data, timeout=timeout, owner=owner
        )

    zygote.run = run  # type: ignore[method-assign]


def service(timeout: float = 10.0, *, prefork: bool = False) -> SandboxedFileSystem:
    """A zygote service; without a pre-forked spare, zygote children == running requests."""
    config = ServerConfig(fs_helper_timeout=timeout)
    zygote = Zygote(test_hooks=True, prefork=prefork)
    return SandboxedFileSystem(config, SandboxManager(config), mode="zygote", zygote=zygote)


@pytest.mark.parametrize(
    ("context", "fragment"),
    [
        ({"sandboxPolicy": {"type": "read-only"}}, "windowsSandboxLevel"),
        ({"sandboxPolicy": {"type": "sideways"}, "windowsSandboxLevel": "disabled"}, "sideways"),
        ({"permissions": {"type": "bogus"}, "windowsSandboxLevel": "disabled"}, "bogus"),
        (
            {
                "sandboxPolicy": {"type": "workspace-write", "writable_roots": ["relative/dir"]},
                "windowsSandboxLevel": "disabled",
            },
            "",
        ),
        (5, ""),
    ],
)
async def test_malformed_context_is_invalid_params(
    no_leaks: None, layout: Any, make_caller: Any, context: Any, fragment: str
) -> None:
    sfs = service()
    try:
        caller = make_caller(sfs)
        reply = await caller.raw(
            "fs/readFile", {"path": str(layout.allowed / "x"), "sandbox": context}
        )
        assert reply["error"]["code"] == -32602, reply
        assert fragment in reply["error"]["message"]
        assert sfs.zygote.pid is None  # nothing was launched
    finally:
        await sfs.aclose()


@pytest.mark.parametrize(
    ("hook", "message"),
    [
        ("crash", "fs sandbox helper failed with status signal: 11 (SIGSEGV)"),
        ("exit", "fs sandbox helper failed with status exit status: 3"),
        ("garbage", "failed to encode or decode fs sandbox helper message"),
    ],
)
async def test_broken_helper_is_a_clear_internal_error(
    no_leaks: None, layout: Any, ctx: Any, hook: str, message: str
) -> None:
    sfs = service()
    fs = LocalFileSystem(confined=sfs)
    (layout.allowed / "f").write_text("f")
    try:
        await fs.read_file(layout.allowed / "f", sandbox=ctx.ro(layout.allowed))
        # The answered request's child may still be on its way out (it exits
        # after replying); only the failed request's child is checked below.
        earlier = zygote_children(sfs)
        inject(sfs, hook)
        with pytest.raises(InternalError) as info:
            await fs.read_file(layout.allowed / "f", sandbox=ctx.ro(layout.allowed))
        assert info.value.code == -32603
        assert message in info.value.message
        # Returned errors come after the child was reaped: nothing new is left.
        assert zygote_children(sfs) <= earlier
    finally:
        await sfs.aclose()


async def test_a_big_read_cut_short_is_a_clear_internal_error(
    no_leaks: None, layout: Any, ctx: Any, make_caller: Any
) -> None:
    """A helper that announces 1 MiB and sends 10 bytes is a clear -32603, the
    child is reaped, and the next read is answered whole."""
    sfs = service()
    try:
        caller = make_caller(sfs)
        big = os.urandom(300_000)
        (layout.allowed / "f").write_bytes(big)
        params = {"path": str(layout.allowed / "f"), "sandbox": ctx.ro(layout.allowed)}
        honest = sfs.zygote.run
        inject(sfs, "short")
        reply = await caller.raw("fs/readFile", params)
        assert reply["error"]["code"] == -32603, reply
        assert reply["error"]["message"].startswith("fs sandbox helper"), reply
        assert zygote_children(sfs) == set()
        sfs.zygote.run = honest  # type: ignore[method-assign]
        reply = await caller.raw("fs/readFile", params)
        assert base64.b64decode(reply["result"]["dataBase64"]) == big
    finally:
        await sfs.aclose()


async def test_hung_helper_is_killed_after_the_timeout(
    no_leaks: None, layout: Any, ctx: Any
) -> None:
    sfs = service(timeout=0.5)
    fs = LocalFileSystem(confined=sfs)
    (layout.allowed / "f").write_text("f")
    try:
        inject(sfs, "hang")
        with pytest.raises(InternalError) as info:
            await fs.read_file(layout.allowed / "f", sandbox=ctx.ro(layout.allowed))
        assert info.value.message == "fs sandbox helper timed out after 0.5s and was killed"
        # Returned errors come after the child was reaped: nothing is left.
        assert zygote_children(sfs) == set()
    finally:
        await sfs.aclose()


async def test_dead_zygote_is_restarted(
    no_leaks: None, layout: Any, ctx: Any, process_gone: Any
) -> None:
    sfs = service()
    fs = LocalFileSystem(confined=sfs)
    (layout.allowed / "f").write_text("f")
    try:
        assert await fs.read_file(layout.allowed / "f", sandbox=ctx.ro(layout.allowed)) == b"f"
        first = sfs.zygote.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        await process_gone(first)
        assert await fs.read_file(layout.allowed / "f", sandbox=ctx.ro(layout.allowed)) == b"f"
        assert sfs.zygote.pid not in (None, first)
    finally:
        await sfs.aclose()


async def test_aclose_during_a_request_leaves_nothing_behind(
    no_leaks: None, layout: Any, ctx: Any
) -> None:
    sfs = service()
    fs = LocalFileSystem(confined=sfs)
    (layout.allowed / "f").write_text("f")
    inject(sfs, "hang")
    started = asyncio.Event()
    zygote = sfs.zygote
    original = zygote._on_control

    def spy(z: Any) -> None:
        original(z)
        if zygote_children(sfs):
            started.set()

    zygote._on_control = spy  # type: ignore[method-assign]
    task = asyncio.create_task(fs.read_file(layout.allowed / "f", sandbox=ctx.ro(layout.allowed)))
    async with asyncio.timeout(TIMEOUT):
        await started.wait()  # the hung child exists
    zygote_pid = sfs.zygote.pid
    assert zygote_pid is not None
    pidfd = os.pidfd_open(zygote_pid)
    try:
        await sfs.aclose()
        with pytest.raises(InternalError):
            await task
        with pytest.raises(ProcessLookupError):
            signal.pidfd_send_signal(pidfd, 0)  # the zygote is gone (and reaped)
    finally:
        os.close(pidfd)


@pytest.mark.parametrize("prefork", [True, False])
async def test_concurrent_requests(no_leaks: None, layout: Any, ctx: Any, prefork: bool) -> None:
    sfs = service(prefork=prefork)
    fs = LocalFileSystem(confined=sfs)
    for i in range(32):
        (layout.allowed / f"f{i}").write_text(str(i))
    try:
        got = await asyncio.gather(
            *(
                fs.read_file(layout.allowed / f"f{i}", sandbox=ctx.ro(layout.allowed))
                for i in range(32)
            )
        )
        assert got == [str(i).encode() for i in range(32)]
    finally:
        await sfs.aclose()


async def test_large_payload_round_trip(no_leaks: None, layout: Any, ctx: Any) -> None:
    sfs = service()
    fs = LocalFileSystem(confined=sfs)
    blob = os.urandom(1 << 20) * 24  # 24 MiB, not compressible by accident
    try:
        await fs.write_file(layout.allowed / "big.bin", blob, sandbox=ctx.ww(layout.allowed))
        assert (layout.allowed / "big.bin").stat().st_size == len(blob)
        got = await fs.read_file(layout.allowed / "big.bin", sandbox=ctx.ww(layout.allowed))
        assert got == blob
    finally:
        await sfs.aclose()


async def test_big_remote_write_under_a_confined_context(
    no_leaks: None, layout: Any, ctx: Any, make_caller: Any
) -> None:
    """Over the wire a big write's base64 is decoded in a worker before it goes to
    the confined writer; the kernel still refuses it outside the writable root."""
    import base64

    sfs = service()
    caller = make_caller(sfs)
    blob = os.urandom(300_000)
    text = base64.b64encode(blob).decode()
    try:
        inside = await caller.raw(
            "fs/writeFile",
            {
                "path": str(layout.allowed / "big.bin"),
                "dataBase64": text,
                "sandbox": ctx.ww(layout.allowed),
            },
        )
        assert inside == {"id": inside["id"], "result": {}}
        assert (layout.allowed / "big.bin").read_bytes() == blob
        outside = await caller.raw(
            "fs/writeFile",
            {
                "path": str(layout.outside / "big.bin"),
                "dataBase64": text,
                "sandbox": ctx.ww(layout.allowed),
            },
        )
        assert outside["error"]["code"] == -32600, outside
        assert not (layout.outside / "big.bin").exists()
    finally:
        await sfs.aclose()


async def test_big_confined_write_is_decoded_as_it_goes_to_the_helper(
    no_leaks: None, layout: Any, ctx: Any, make_caller: Any
) -> None:
    """A 3 MiB write is four 1 MiB slices of text, decoded one by one as they are
    sent to the confined child. A bad character in the third piece is upstream's
    error at its offset: the child, two pieces in, is killed before it has all
    the data, so nothing is written, and the service goes on."""
    import base64

    from exec_server.protocol.base64_text import DECODE_SLICE

    sfs = service()
    caller = make_caller(sfs)
    blob = os.urandom(3 << 20)
    text = base64.b64encode(blob).decode()
    target = layout.allowed / "big.bin"
    sandbox = ctx.ww(layout.allowed)
    try:
        reply = await caller.raw(
            "fs/writeFile", {"path": str(target), "dataBase64": text, "sandbox": sandbox}
        )
        assert reply == {"id": reply["id"], "result": {}}
        assert target.read_bytes() == blob
        earlier = zygote_children(sfs)  # the answered write's child may be on its way out
        offset = 2 * DECODE_SLICE + 999
        bad = text[:offset] + "!" + text[offset + 1 :]
        fresh = layout.allowed / "fresh.bin"
        for path in (target, fresh):
            reply = await caller.raw(
                "fs/writeFile", {"path": str(path), "dataBase64": bad, "sandbox": sandbox}
            )
            assert reply["error"] == {
                "code": -32600,
                "message": "fs/writeFile requires valid base64 dataBase64: "
                f"Invalid symbol 33, offset {offset}.",
            }
        assert target.read_bytes() == blob
        assert not fresh.exists()
        assert [n for n in os.listdir(layout.allowed) if n.startswith(".")] == []  # no temp
        assert zygote_children(sfs) <= earlier
        reply = await caller.raw(
            "fs/writeFile", {"path": str(fresh), "dataBase64": text, "sandbox": sandbox}
        )
        assert reply == {"id": reply["id"], "result": {}}
        assert fresh.read_bytes() == blob
    finally:
        await sfs.aclose()


async def test_pieces_shorter_than_announced_are_a_helper_failure(
    no_leaks: None, layout: Any, ctx: Any
) -> None:
    """The child reads exactly the announced size: pieces that fall short would
    leave it waiting, so the request fails at once and the child is killed."""

    from exec_server.fs import direct as ops
    from exec_server.fs.service import FsOperation
    from exec_server.sandbox.convert import fs_context

    sfs = service()
    fs = LocalFileSystem(confined=sfs)
    payload = ops.Pieces(10, lambda: iter([b"12345"]))
    context = fs_context(decode_fs_sandbox(json.dumps(ctx.ww(layout.allowed)).encode()))
    op = FsOperation("fs/writeFile", str(layout.allowed / "f"), data=payload)
    try:
        with pytest.raises(FsFailedError, match="payload was 5 bytes, not 10"):
            await asyncio.wait_for(sfs.run(op, context), TIMEOUT)
        assert not (layout.allowed / "f").exists()
        assert zygote_children(sfs) == set()
        await fs.write_file(layout.allowed / "f", b"fine", sandbox=ctx.ww(layout.allowed))
        assert (layout.allowed / "f").read_bytes() == b"fine"
    finally:
        await sfs.aclose()


async def test_full_access_contexts_never_start_the_helper(no_leaks: None, layout: Any) -> None:
    sfs = service()
    fs = LocalFileSystem(confined=sfs)
    (layout.root / "f").write_text("direct")
    full = [
        {"sandboxPolicy": {"type": "danger-full-access"}, "windowsSandboxLevel": "disabled"},
        {"sandboxPolicy": {"type": "external-sandbox"}, "windowsSandboxLevel": "disabled"},
        {"permissions": {"type": "disabled"}, "windowsSandboxLevel": "disabled"},
        None,
    ]
    try:
        for context in full:
            assert await fs.read_file(layout.root / "f", sandbox=context) == b"direct"
        assert sfs.zygote.pid is None
    finally:
        await sfs.aclose()


def test_one_shot_helper_protocol(tmp_path: Path) -> None:
    """``exec-server --codex-run-as-fs-helper`` speaks PROTOCOL.md §10.5 (run unconfined here)."""
    (tmp_path / "a.txt").write_bytes(b"hi")

    def helper(stdin: bytes) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, "-m", "exec_server", "--codex-run-as-fs-helper"],
            input=stdin,
            capture_output=True,
            timeout=TIMEOUT,
            check=False,
        )

    ok = helper(
        json.dumps(
            {
                "operation": "fs/readFile",
                "params": {"path": str(tmp_path / "a.txt"), "sandbox": None},
            }
        ).encode()
    )
    assert ok.returncode == 0
    assert json.loads(ok.stdout) == {
        "status": "ok",
        "payload": {"operation": "fs/readFile", "response": {"dataBase64": "aGk="}},
    }
    missing = helper(
        json.dumps(
            {
                "operation": "fs/getMetadata",
                "params": {"path": str(tmp_path / "nope"), "sandbox": None},
            }
        ).encode()
    )
    assert missing.returncode == 0
    assert json.loads(missing.stdout) == {
        "status": "error",
        "payload": {"code": -32004, "message": "No such file or directory (os error 2)"},
    }
    garbage = helper(b"{not json")
    assert garbage.returncode == 1
    assert garbage.stderr.decode().startswith("fs sandbox helper failed: ")


async def test_a_full_control_socket_is_waited_out(no_leaks: None, tmp_path: Path) -> None:
    """A call that finds the zygote's control socket full (the zygote is stopped
    here) waits for room instead of giving up on the zygote, and then runs."""
    root = os.path.realpath(tmp_path)  # noqa: ASYNC240 - a test's own set-up
    (tmp_path / "f").write_bytes(b"data")
    zygote = Zygote(prefork=False)
    try:
        await zygote.ensure_started()
        pid = zygote.pid
        assert pid is not None
        proc = zygote._z
        assert proc is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            filler = b"?" + bytes(9) + bytes(60_000)  # an unknown kind: answered with E
            with pytest.raises(BlockingIOError):
                for _ in range(10_000):
                    proc.ctl.send(filler)
            header = {"op": "fs/readFile", "path": f"{root}/f", "expect": root,
                      "plan": {"full_read": True, "full_write": False, "network": False}}
            call = asyncio.create_task(zygote.run(header, timeout=TIMEOUT))
            async with asyncio.timeout(TIMEOUT):
                while proc.writable is None:  # noqa: ASYNC110 - no event for it
                    await asyncio.sleep(0.01)
            assert not call.done()
        finally:
            os.kill(pid, signal.SIGCONT)
        reply, payload = await asyncio.wait_for(call, TIMEOUT)
        assert reply["status"] == "ok" and payload == b"data", reply
        assert zygote.pid == pid  # the same zygote served it
    finally:
        await zygote.aclose()


@pytest.mark.parametrize("code", sorted(errno.errorcode))
def test_helper_maps_os_errors_as_the_direct_route(code: int) -> None:
    """PROTOCOL.md §9.1 / §10.6: the helper's code and text for an errno are the direct
    route's (EINVAL is Rust's InvalidInput: -32600 on both)."""
    exc = OSError(code, os.strerror(code))
    direct = from_domain_error(fs_error_from_os(exc))
    assert direct is not None
    helper = helper_ops.error_from_os(exc)
    assert (helper.code, helper.message) == (direct.code, direct.message)


def test_helper_einval_is_invalid_request(tmp_path: Path) -> None:
    """A real EINVAL in the helper's code (``rmdir`` of ``.``) answers -32600, as upstream."""
    target = tmp_path / "d"
    target.mkdir()
    req = helper_ops.OpRequest(
        op="fs/remove", path=f"{target}/.", expect=str(target), recursive=False
    )
    with pytest.raises(helper_ops.OpError) as info:
        helper_ops.execute(req, b"")
    assert (info.value.code, info.value.message) == (-32600, "Invalid argument (os error 22)")
    assert target.is_dir()
