"""Which calls may skip the helper: only reads under policies that read the whole disk."""

from __future__ import annotations

from typing import Any

import pytest

from exec_server.client.fs import LocalFileSystem
from exec_server.exceptions import ExecServerError
from exec_server.fs.confined import SandboxedFileSystem


async def test_full_read_policy_reads_directly_but_writes_are_confined(
    zygote_sfs: SandboxedFileSystem, layout: Any, ctx: Any
) -> None:
    fs = LocalFileSystem(confined=zygote_sfs)
    c = ctx.current_ww(layout.allowed, tmp=False)  # root: read, workspace: write
    (layout.outside / "o.txt").write_text("o")
    assert await fs.read_file(layout.outside / "o.txt", sandbox=c) == b"o"
    assert (await fs.get_metadata(layout.outside / "o.txt", sandbox=c)).is_file
    assert [e.file_name for e in await fs.read_directory(layout.outside, sandbox=c)] == ["o.txt"]
    assert zygote_sfs.zygote.pid is None  # equivalent, so no helper was needed
    await fs.write_file(layout.allowed / "w.txt", b"w", sandbox=c)
    assert zygote_sfs.zygote.pid is not None  # writes always run confined
    with pytest.raises(ExecServerError):
        await fs.write_file(layout.outside / "w.txt", b"w", sandbox=c)
    assert not (layout.outside / "w.txt").exists()


async def test_a_none_entry_forces_confined_reads(
    zygote_sfs: SandboxedFileSystem, layout: Any, ctx: Any
) -> None:
    fs = LocalFileSystem(confined=zygote_sfs)
    c = ctx.current_ww(layout.allowed, tmp=False)
    secret = layout.allowed / "secret"
    secret.mkdir()
    (secret / "k").write_text("k")
    c["permissions"]["file_system"]["entries"].append(
        {"path": {"type": "path", "path": "file://" + str(secret)}, "access": "deny"}
    )
    (layout.allowed / "p.txt").write_text("p")
    assert await fs.read_file(layout.allowed / "p.txt", sandbox=c) == b"p"
    assert zygote_sfs.zygote.pid is not None
    with pytest.raises(ExecServerError) as info:
        await fs.read_file(secret / "k", sandbox=c)
    assert "is not permitted by filesystem sandbox" in info.value.message
