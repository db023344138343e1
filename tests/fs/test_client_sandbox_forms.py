"""The ``sandbox`` argument of the client filesystem, in each form the docs offer,
means the same on every backend (found by an audit of the client library):

* ``Raw`` text that is empty or ``null`` is no context (locally it was; remotely it
  was sent as is, the whole request became unreadable, and the call never ended);
* ``Raw`` text that is not JSON is ``InvalidParamsError`` at once, everywhere;
* a context struct holding paths is encoded (``AbsPath`` made ``TypeError``), with
  its defaults left out and, in the current shape, paths as ``file://`` URIs.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec
import pytest

from exec_server.client.fs import ExecutorFileSystem
from exec_server.exceptions import InvalidParamsError
from exec_server.protocol.types import sandbox as st

WAIT = 30.0


def current_context(workspace: Path) -> st.CurrentSandboxContext:
    text = json.dumps(
        {
            "permissions": {"type": "disabled"},
            "windowsSandboxLevel": "disabled",
            "cwd": workspace.as_uri(),
            "workspaceRoots": [workspace.as_uri()],
        }
    )
    ctx: st.CurrentSandboxContext = st.decode_sandbox(text, st.CurrentSandboxContext)
    return ctx


def legacy_context(workspace: Path) -> st.FileSystemSandboxContext:
    text = json.dumps(
        {
            "sandboxPolicy": {"type": "danger-full-access"},
            "windowsSandboxLevel": "disabled",
            "sandboxPolicyCwd": str(workspace),
        }
    )
    ctx: st.FileSystemSandboxContext = st.decode_sandbox(text, st.FileSystemSandboxContext)
    return ctx


def test_a_client_context_leaves_defaults_out_and_sends_uris_in_the_current_shape(
    tdir: Path,
) -> None:
    sent = json.loads(st.encode_client_context(current_context(tdir)))
    assert sent == {
        "permissions": {"type": "disabled"},
        "windowsSandboxLevel": "disabled",
        "cwd": tdir.as_uri(),
        "workspaceRoots": [tdir.as_uri()],
    }
    legacy = json.loads(st.encode_client_context(legacy_context(tdir)))
    assert legacy["sandboxPolicy"] == {"type": "danger-full-access"}
    assert legacy.get("sandboxPolicyCwd", str(tdir)) == str(tdir)  # plain, if sent


@pytest.mark.parametrize("text", [b"", b"  ", b"null"])
async def test_empty_raw_text_is_no_context(
    fs: ExecutorFileSystem, tdir: Path, text: bytes
) -> None:
    (tdir / "f.txt").write_bytes(b"hi")
    read = fs.read_file(tdir / "f.txt", msgspec.Raw(text))
    assert await asyncio.wait_for(read, WAIT) == b"hi"


@pytest.mark.parametrize("text", [b"{bad", b'{"sandboxPolicy":'])
async def test_raw_text_that_is_not_json_is_refused_at_once(
    fs: ExecutorFileSystem, tdir: Path, text: bytes
) -> None:
    (tdir / "f.txt").write_bytes(b"hi")
    with pytest.raises(InvalidParamsError, match="sandbox"):
        await asyncio.wait_for(fs.read_file(tdir / "f.txt", msgspec.Raw(text)), WAIT)
    # the backend still serves
    assert await asyncio.wait_for(fs.read_file(tdir / "f.txt"), WAIT) == b"hi"


async def test_context_structs_holding_paths_work(fs: ExecutorFileSystem, tdir: Path) -> None:
    for ctx in (current_context(tdir), legacy_context(tdir)):
        await asyncio.wait_for(fs.write_file(tdir / "new.txt", b"data", ctx), WAIT)
        assert await asyncio.wait_for(fs.read_file(tdir / "new.txt", ctx), WAIT) == b"data"
        (tdir / "new.txt").unlink()
