"""The current client's apply_patch and view_image sequences under workspace-write.

A real ``exec-server serve`` child, a raw WebSocket client, ``file://`` URIs and
the ``permissions`` context codex 0.163 sends on every fs call
(CLIENT_COMPAT.md §1.4, §7.2 scenario 7; recording
``sandboxed_apply_patch.rpc.jsonl``).
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


def uri(path: Path) -> str:
    return "file://" + str(path)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path.resolve() / "workspace"
    ws.mkdir()
    (ws / "edit_me.txt").write_text("alpha\nbeta\ngamma\n")
    (ws / "delete_me.txt").write_text("bye\n")
    (ws / "pixel.png").write_bytes(PNG)
    (ws / ".git").mkdir()
    (ws / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (tmp_path / "outside.txt").write_text("outside\n")
    return ws


async def test_apply_patch_and_view_image_sequences(
    server_factory: Any, rpc: Any, workspace: Path, ctx: Any
) -> None:
    server = server_factory(cwd=workspace)
    client = await rpc(server.url)
    await client.initialize()
    sandbox = ctx.current_ww(workspace, tmp=False)

    async def call(method: str, **params: Any) -> dict[str, Any]:
        reply: dict[str, Any] = await client.request(method, {**params, "sandbox": sandbox})
        return reply

    added = workspace / "sub" / "dir" / "added.txt"
    # apply_patch: read the files it edits and deletes.
    r = await call("fs/readFile", path=uri(workspace / "edit_me.txt"))
    assert base64.b64decode(r["result"]["dataBase64"]) == b"alpha\nbeta\ngamma\n"
    r = await call("fs/readFile", path=uri(workspace / "delete_me.txt"))
    assert base64.b64decode(r["result"]["dataBase64"]) == b"bye\n"
    # The added file: probe, then write -> -32004, mkdir -p, write again.
    r = await call("fs/getMetadata", path=uri(added))
    assert r["error"]["code"] == -32004
    r = await call("fs/readFile", path=uri(added))
    assert r["error"]["code"] == -32004
    data = base64.b64encode(b"added by apply_patch\n").decode()
    r = await call("fs/writeFile", path=uri(added), dataBase64=data)
    assert r["error"] == {"code": -32004, "message": "No such file or directory (os error 2)"}
    r = await call("fs/createDirectory", path=uri(added.parent), recursive=True)
    assert r["result"] == {}
    r = await call("fs/writeFile", path=uri(added), dataBase64=data)
    assert r["result"] == {}
    assert added.read_bytes() == b"added by apply_patch\n"
    # Edit in place.
    r = await call("fs/getMetadata", path=uri(workspace / "edit_me.txt"))
    meta = r["result"]
    assert meta["isFile"] is True and meta["isDirectory"] is False
    assert meta["isSymlink"] is False and meta["size"] == len("alpha\nbeta\ngamma\n")
    patched = base64.b64encode(b"alpha\nBETA-patched\ngamma\n").decode()
    r = await call("fs/writeFile", path=uri(workspace / "edit_me.txt"), dataBase64=patched)
    assert r["result"] == {}
    assert (workspace / "edit_me.txt").read_text() == "alpha\nBETA-patched\ngamma\n"
    # Delete.
    r = await call("fs/getMetadata", path=uri(workspace / "delete_me.txt"))
    assert r["result"]["isFile"] is True
    r = await call("fs/remove", path=uri(workspace / "delete_me.txt"), recursive=False, force=False)
    assert r["result"] == {}
    assert not (workspace / "delete_me.txt").exists()
    # view_image.
    r = await call("fs/getMetadata", path=uri(workspace / "pixel.png"))
    assert r["result"]["size"] == len(PNG)
    r = await call("fs/readFile", path=uri(workspace / "pixel.png"))
    assert base64.b64decode(r["result"]["dataBase64"]) == PNG

    # Outside the workspace nothing is written; protected .git stays read-only.
    r = await call("fs/writeFile", path=uri(workspace.parent / "outside.txt"), dataBase64=data)
    assert r["error"]["code"] in (-32600, -32603)
    assert (workspace.parent / "outside.txt").read_text() == "outside\n"
    r = await call("fs/writeFile", path=uri(workspace / ".git" / "HEAD"), dataBase64=data)
    assert r["error"]["code"] in (-32600, -32603)
    assert (workspace / ".git" / "HEAD").read_text() == "ref: refs/heads/main\n"
    # Reads of the root are allowed by the policy (root: read).
    r = await call("fs/readFile", path=uri(workspace.parent / "outside.txt"))
    assert base64.b64decode(r["result"]["dataBase64"]) == b"outside\n"

    # The confined calls ran in children of the server's fs zygote.
    assert any(b"fs/helper/main.py" in c for c in _cmdlines(server.child_pids()))


def _cmdlines(pids: set[int]) -> list[bytes]:
    return [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in pids]
