"""The server-side pre-check for current-client (``permissions``) fs contexts.

A real ``exec-server serve`` child, a raw WebSocket client and ``file://``
URIs; every effect is checked on disk afterwards. Three gaps an audit against
upstream's 0.163 server found (docs/sandbox-policy.md, "Pre-check for current
contexts"):

* a workspace root or write entry given through a symlink grants what it
  names (check paths are canonical, so the entries must be too); a deny entry
  given through a symlink still denies;
* a readable ``minimal`` entry makes the platform-default read roots readable
  (upstream's helper mounts them), for reads only;
* ``.git``, ``.codex``, ``.agents`` and ``.aws`` directly under a writable root
  cannot be created, even when they do not exist and the client sent no
  carve-outs (CLIENT_COMPAT.md "Protected subpaths").

Legacy contexts keep PROTOCOL.md §10 (checked here where they differ).
"""

from __future__ import annotations

import base64
import os
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from exec_server.exceptions import ExecServerError

NOT_PERMITTED = "is not permitted by filesystem sandbox"
DATA = base64.b64encode(b"PLANTED\n").decode()
PROTECTED = (".git", ".codex", ".agents", ".aws")


def uri(path: Path | str) -> str:
    return "file://" + str(path)


def special(kind: str, subpath: str | None = None) -> dict[str, Any]:
    value: dict[str, Any] = {"kind": kind}
    if subpath is not None:
        value["subpath"] = subpath
    return {"type": "special", "value": value}


def entry(path: dict[str, Any], access: str) -> dict[str, Any]:
    return {"path": path, "access": access}


def path_entry(path: Path | str, access: str) -> dict[str, Any]:
    return entry({"type": "path", "path": uri(path)}, access)


def carve_outs() -> list[dict[str, Any]]:
    """The read-only carve-outs codex 0.163 sends (CLIENT_COMPAT.md §1.4)."""
    return [
        {**entry(special("project_roots", name), "read"), "missing_path_behavior": "skip"}
        for name in PROTECTED
    ]


@dataclass
class Tree:
    """``R/ws`` (server cwd, workspace), ``R/wslink -> ws``, ``R/extra``, ``R/out``."""

    root: Path
    ws: Path
    wslink: Path
    extra: Path
    out: Path


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    root = tmp_path.resolve()
    ws, extra, out = root / "ws", root / "extra", root / "out"
    for d in (ws / "sub", ws / ".git", ws / "realdir", ws / "gitsrc" / ".git", extra, out):
        d.mkdir(parents=True)
    (ws / "file.txt").write_bytes(b"file\n")
    (ws / ".git" / "HEAD").write_bytes(b"ref: refs/heads/main\n")
    (ws / "realdir" / "s.txt").write_bytes(b"SECRET\n")
    (ws / "gitsrc" / ".git" / "config").write_bytes(b"[core]\n\thooksPath = /evil\n")
    (out / "secret.txt").write_bytes(b"OUT\n")
    (ws / "symlinkdir").symlink_to("realdir")
    (ws / "link_extra").symlink_to("../extra")
    (root / "wslink").symlink_to("ws")
    return Tree(root, ws, root / "wslink", extra, out)


Call = Callable[..., Awaitable[dict[str, Any]]]


@pytest.fixture
async def session(server_factory: Any, rpc: Any, tree: Tree) -> Callable[[dict[str, Any]], Call]:
    """``call = session(context)``; ``await call(method, **params)`` -> the whole reply."""
    server = server_factory(cwd=tree.ws)
    client = await rpc(server.url)
    await client.initialize()

    def bind(sandbox: dict[str, Any]) -> Call:
        async def call(method: str, **params: Any) -> dict[str, Any]:
            reply: dict[str, Any] = await client.request(method, {**params, "sandbox": sandbox})
            return reply

        return call

    return bind


def absent(path: Path) -> bool:
    """Not even a dangling symlink at ``path``."""
    return not (path.exists() or path.is_symlink())


def assert_refused(reply: dict[str, Any]) -> None:
    assert "error" in reply, reply
    assert reply["error"]["code"] in (-32600, -32603), reply


# --------------------------------------------------------------- symlinked roots


async def test_workspace_root_through_symlink_grants_its_target(
    session: Callable[[dict[str, Any]], Call], tree: Tree, ctx: Any
) -> None:
    call = session(
        ctx.current(
            tree.wslink,
            [
                entry(special("root"), "read"),
                entry(special("project_roots"), "write"),
                *carve_outs(),
            ],
        )
    )
    r = await call("fs/writeFile", path=uri(tree.wslink / "new.txt"), dataBase64=DATA)
    assert r.get("result") == {}, r
    assert (tree.ws / "new.txt").read_bytes() == b"PLANTED\n"
    r = await call("fs/createDirectory", path=uri(tree.wslink / "d" / "e"), recursive=True)
    assert r.get("result") == {}, r
    assert (tree.ws / "d" / "e").is_dir()
    r = await call(
        "fs/copy",
        sourcePath=uri(tree.wslink / "new.txt"),
        destinationPath=uri(tree.wslink / "d" / "copy.txt"),
        recursive=False,
    )
    assert r.get("result") == {}, r
    assert (tree.ws / "d" / "copy.txt").read_bytes() == b"PLANTED\n"
    r = await call("fs/remove", path=uri(tree.wslink / "d"), recursive=True, force=False)
    assert r.get("result") == {}, r
    assert not (tree.ws / "d").exists()
    # What the symlinked root names stays bounded: .git is read-only, outside is not writable.
    r = await call("fs/writeFile", path=uri(tree.wslink / ".git" / "HEAD"), dataBase64=DATA)
    assert_refused(r)
    assert (tree.ws / ".git" / "HEAD").read_bytes() == b"ref: refs/heads/main\n"
    r = await call("fs/writeFile", path=uri(tree.out / "x.txt"), dataBase64=DATA)
    assert_refused(r)
    assert not (tree.out / "x.txt").exists()
    # The link itself lives in R, which is only readable.
    r = await call("fs/remove", path=uri(tree.wslink), recursive=False, force=False)
    assert_refused(r)
    assert tree.wslink.is_symlink()


async def test_write_entry_through_symlink_grants_its_target(
    session: Callable[[dict[str, Any]], Call], tree: Tree, ctx: Any
) -> None:
    call = session(
        ctx.current(
            tree.ws, [entry(special("root"), "read"), path_entry(tree.ws / "link_extra", "write")]
        )
    )
    r = await call("fs/writeFile", path=uri(tree.ws / "link_extra" / "a.txt"), dataBase64=DATA)
    assert r.get("result") == {}, r
    r = await call("fs/writeFile", path=uri(tree.extra / "b.txt"), dataBase64=DATA)
    assert r.get("result") == {}, r
    assert (
        (tree.extra / "a.txt").read_bytes() == (tree.extra / "b.txt").read_bytes() == b"PLANTED\n"
    )
    # The workspace itself (where the link lives) is only readable.
    r = await call("fs/writeFile", path=uri(tree.ws / "c.txt"), dataBase64=DATA)
    assert_refused(r)
    assert not (tree.ws / "c.txt").exists()
    r = await call("fs/remove", path=uri(tree.ws / "link_extra"), recursive=False, force=False)
    assert_refused(r)
    assert (tree.ws / "link_extra").is_symlink()


async def test_deny_entry_through_symlink_still_denies(
    session: Callable[[dict[str, Any]], Call], tree: Tree, ctx: Any
) -> None:
    call = session(
        ctx.current(
            tree.wslink,
            [
                entry(special("root"), "read"),
                entry(special("project_roots"), "write"),
                path_entry(tree.ws / "symlinkdir" / "s.txt", "none"),
                path_entry(tree.wslink / "sub", "none"),
                *carve_outs(),
            ],
        )
    )
    for path in (
        tree.ws / "symlinkdir" / "s.txt",
        tree.ws / "realdir" / "s.txt",
        tree.wslink / "realdir" / "s.txt",
    ):
        r = await call("fs/readFile", path=uri(path))
        assert_refused(r)
        r = await call("fs/writeFile", path=uri(path), dataBase64=DATA)
        assert_refused(r)
    assert (tree.ws / "realdir" / "s.txt").read_bytes() == b"SECRET\n"
    for path in (tree.ws / "sub" / "n.txt", tree.wslink / "sub" / "n.txt"):
        r = await call("fs/writeFile", path=uri(path), dataBase64=DATA)
        assert_refused(r)
    assert os.listdir(tree.ws / "sub") == []
    r = await call("fs/remove", path=uri(tree.ws / "sub"), recursive=True, force=False)
    assert_refused(r)
    assert (tree.ws / "sub").is_dir()


async def test_legacy_writable_root_through_symlink_keeps_protocol_10(
    session: Callable[[dict[str, Any]], Call], tree: Tree
) -> None:
    """PROTOCOL.md §10.1/§6.11: legacy entries keep nested user symlinks, check paths do not."""
    call = session(
        {
            "sandboxPolicy": {
                "type": "workspace-write",
                "writable_roots": [str(tree.ws / "link_extra")],
                "exclude_tmpdir_env_var": True,
                "exclude_slash_tmp": True,
            },
            "windowsSandboxLevel": "disabled",
            "windowsSandboxPrivateDesktop": False,
            "useLegacyLandlock": False,
            "additionalPermissions": None,
        }
    )
    r = await call("fs/writeFile", path=uri(tree.extra / "a.txt"), dataBase64=DATA)
    assert r["error"] == {"code": -32600, "message": f"{tree.extra / 'a.txt'} {NOT_PERMITTED}"}
    assert not (tree.extra / "a.txt").exists()


# --------------------------------------------------------------- minimal: platform defaults


def _platform_file() -> Path:
    for candidate in ("/etc/passwd", "/etc/hostname", "/etc/os-release"):
        if os.path.isfile(candidate) and not os.path.islink(candidate):
            return Path(candidate)
    pytest.skip("no plain file in /etc")


async def test_minimal_reads_platform_defaults(
    session: Callable[[dict[str, Any]], Call], tree: Tree, ctx: Any
) -> None:
    target = _platform_file()
    call = session(
        ctx.current(
            tree.ws,
            [
                entry(special("minimal"), "read"),
                entry(special("project_roots"), "write"),
                *carve_outs(),
            ],
        )
    )
    r = await call("fs/readFile", path=uri(target))
    assert base64.b64decode(r["result"]["dataBase64"]) == target.read_bytes(), r
    r = await call("fs/getMetadata", path=uri(target))
    assert r["result"]["isFile"] is True and r["result"]["size"] == target.stat().st_size, r
    r = await call("fs/canonicalize", path=uri(target))
    assert r["result"]["path"] == uri(target) or r["result"]["path"] == str(target), r
    r = await call("fs/readDirectory", path=uri(target.parent))
    assert target.name in {e["fileName"] for e in r["result"]["entries"]}, r
    # Reads only: nothing is written into a platform default root.
    planted = target.parent / f"exec-server-precheck-{uuid.uuid4().hex}"
    try:
        r = await call("fs/writeFile", path=uri(planted), dataBase64=DATA)
        assert_refused(r)
        assert not planted.exists()
    finally:
        if planted.exists():
            planted.unlink()
    # Outside the defaults and the workspace nothing is readable.
    r = await call("fs/readFile", path=uri(tree.out / "secret.txt"))
    assert r["error"]["code"] == -32600, r


async def test_minimal_platform_defaults_yield_to_deny_entries(
    session: Callable[[dict[str, Any]], Call], tree: Tree, ctx: Any
) -> None:
    target = _platform_file()
    call = session(
        ctx.current(
            tree.ws,
            [
                entry(special("minimal"), "read"),
                entry(special("project_roots"), "write"),
                path_entry(target, "none"),
            ],
        )
    )
    r = await call("fs/readFile", path=uri(target))
    assert "result" not in r, r


async def test_legacy_minimal_never_matches_a_path(
    session: Callable[[dict[str, Any]], Call], tree: Tree
) -> None:
    """PROTOCOL.md §10.1 step 3: the legacy pre-check ignores platform defaults."""
    target = _platform_file()
    call = session(
        {
            "sandboxPolicy": {
                "type": "read-only",
                "access": {
                    "type": "restricted",
                    "include_platform_defaults": True,
                    "readable_roots": [],
                },
            },
            "windowsSandboxLevel": "disabled",
            "windowsSandboxPrivateDesktop": False,
            "useLegacyLandlock": False,
            "additionalPermissions": None,
        }
    )
    r = await call("fs/readFile", path=uri(target))
    assert r["error"] == {"code": -32600, "message": f"{target} {NOT_PERMITTED}"}


# --------------------------------------------------------------- protected names


def _no_carve_outs(ctx: Any, tree: Tree) -> dict[str, Any]:
    return ctx.current(
        tree.ws,
        [
            entry(special("root"), "read"),
            entry(special("project_roots"), "write"),
            path_entry(tree.extra, "write"),
        ],
    )


@pytest.mark.parametrize("name", PROTECTED)
async def test_missing_protected_names_cannot_be_created(
    session: Callable[[dict[str, Any]], Call], tree: Tree, name: str, ctx: Any
) -> None:
    call = session(_no_carve_outs(ctx, tree))
    for root in (tree.extra, tree.ws):
        target = root / name
        if target.exists():
            continue  # ws/.git: protected because it exists (§6.10)
        r = await call("fs/createDirectory", path=uri(target / "hooks"), recursive=True)
        assert r["error"]["code"] == -32600 and NOT_PERMITTED in r["error"]["message"], r
        r = await call("fs/createDirectory", path=uri(target), recursive=False)
        assert r["error"]["code"] == -32600, r
        r = await call("fs/writeFile", path=uri(target), dataBase64=DATA)
        assert r["error"]["code"] == -32600, r
        r = await call("fs/writeFile", path=uri(target / "config"), dataBase64=DATA)
        assert r["error"]["code"] == -32600, r
        r = await call(
            "fs/copy",
            sourcePath=uri(tree.ws / "file.txt"),
            destinationPath=uri(target),
            recursive=False,
        )
        assert r["error"]["code"] == -32600, r
        assert absent(target)
        # Reading is unchanged: a missing name is simply not found.
        r = await call("fs/getMetadata", path=uri(target))
        assert r["error"]["code"] == -32004, r


async def test_copy_cannot_plant_git_into_writable_root(
    session: Callable[[dict[str, Any]], Call], tree: Tree, ctx: Any
) -> None:
    call = session(_no_carve_outs(ctx, tree))
    (tree.ws / "gitsrc" / "a.txt").write_bytes(b"a\n")
    (tree.ws / "gitsrc" / "0-first.txt").write_bytes(b"0\n")
    r = await call(
        "fs/copy",
        sourcePath=uri(tree.ws / "gitsrc"),
        destinationPath=uri(tree.extra),
        recursive=True,
    )
    # Refused by the pre-check, before anything of the tree is written.
    assert r["error"] == {
        "code": -32600,
        "message": f"{tree.extra / '.git'} is not permitted by filesystem sandbox",
    }, r
    assert os.listdir(tree.extra) == []
    r = await call(
        "fs/copy",
        sourcePath=uri(tree.ws / "gitsrc" / ".git"),
        destinationPath=uri(tree.extra / ".git"),
        recursive=True,
    )
    assert r["error"]["code"] == -32600, r
    assert absent(tree.extra / ".git")
    # Elsewhere in the root, a tree holding .git copies as before.
    r = await call(
        "fs/copy",
        sourcePath=uri(tree.ws / "gitsrc"),
        destinationPath=uri(tree.extra / "vendored"),
        recursive=True,
    )
    assert r.get("result") == {}, r
    assert (tree.extra / "vendored" / ".git" / "config").is_file()


async def test_protected_names_stay_readable(
    session: Callable[[dict[str, Any]], Call], tree: Tree, ctx: Any
) -> None:
    call = session(_no_carve_outs(ctx, tree))
    r = await call("fs/readFile", path=uri(tree.ws / ".git" / "HEAD"))
    assert base64.b64decode(r["result"]["dataBase64"]) == b"ref: refs/heads/main\n", r
    r = await call("fs/readDirectory", path=uri(tree.ws / ".git"))
    assert [e["fileName"] for e in r["result"]["entries"]] == ["HEAD"], r


async def test_missing_git_is_read_only_on_every_confinement_path(
    fs: Any, tree: Tree, ctx: Any
) -> None:
    """The helper plan carries the missing names too: the confined child refuses them."""
    sandbox = _no_carve_outs(ctx, tree)
    with pytest.raises(ExecServerError):
        await fs.copy(tree.ws / "gitsrc", tree.extra, recursive=True, sandbox=sandbox)
    assert absent(tree.extra / ".git")
    with pytest.raises(ExecServerError) as info:
        await fs.create_directory(tree.extra / ".git" / "hooks", recursive=True, sandbox=sandbox)
    assert info.value.code == -32600 and NOT_PERMITTED in info.value.message
    assert absent(tree.extra / ".git")
    await fs.write_file(tree.extra / "ok.txt", b"fine", sandbox=sandbox)
    assert (tree.extra / "ok.txt").read_bytes() == b"fine"
