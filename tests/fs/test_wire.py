"""``fs/*`` on the wire: shapes and codes of both generations, bad input, sandbox routing."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest

WW_LEGACY = {
    "sandboxPolicy": {
        "type": "workspace-write",
        "writable_roots": ["/nonexistent-root"],
        "read_only_access": {"type": "restricted", "include_platform_defaults": False},
        "network_access": False,
        "exclude_tmpdir_env_var": True,
        "exclude_slash_tmp": True,
    },
    "windowsSandboxLevel": "disabled",
}
RO_LEGACY = {
    "sandboxPolicy": {
        "type": "read-only",
        "access": {"type": "restricted", "include_platform_defaults": False, "readable_roots": []},
    },
    "windowsSandboxLevel": "disabled",
}
MANAGED_CURRENT = {
    "permissions": {
        "type": "managed",
        "file_system": {
            "type": "restricted",
            "entries": [
                {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
                {
                    "path": {"type": "special", "value": {"kind": "project_roots"}},
                    "access": "write",
                },
            ],
        },
        "network": "restricted",
    },
    "windowsSandboxLevel": "disabled",
    "useLegacyLandlock": False,
}
DIRECT_CONTEXTS: list[Any] = [
    None,
    {"sandboxPolicy": {"type": "danger-full-access"}, "windowsSandboxLevel": "disabled"},
    {
        "sandboxPolicy": {"type": "external-sandbox", "network_access": "restricted"},
        "windowsSandboxLevel": "disabled",
    },
    {
        "permissions": {"type": "disabled"},
        "policyContext": {"cwd": "file:///tmp", "workspaceRoots": ["file:///tmp"]},
        "userHomeDir": "file:///root",
        "temporaryDirectories": [],
        "windowsSandboxLevel": "disabled",
        "useLegacyLandlock": False,
    },
    {"permissions": {"type": "external", "network": "enabled"}, "windowsSandboxLevel": "disabled"},
    {
        "permissions": {
            "type": "managed",
            "file_system": {"type": "unrestricted"},
            "network": "enabled",
        },
        "windowsSandboxLevel": "disabled",
    },
]


def uri(path: Path | str) -> str:
    return "file://" + str(path)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def error(reply: dict[str, Any]) -> tuple[int, str]:
    assert "error" in reply, reply
    return reply["error"]["code"], reply["error"]["message"]


# ---------------------------------------------------------------- generations


async def test_metadata_shape_per_generation(wire: Any, tdir: Path) -> None:
    (tdir / "f").write_text("hello")
    legacy = await wire.raw("fs/getMetadata", {"path": str(tdir / "f")})
    assert list(legacy["result"]) == ["isDirectory", "isFile", "createdAtMs", "modifiedAtMs"]
    current = await wire.raw("fs/getMetadata", {"path": uri(tdir / "f"), "sandbox": None})
    assert list(current["result"]) == [
        "isDirectory",
        "isFile",
        "isSymlink",
        "size",
        "createdAtMs",
        "modifiedAtMs",
    ]
    assert current["result"]["size"] == 5
    assert current["result"]["isSymlink"] is False
    assert current["result"]["createdAtMs"] == 0
    mtime_ms = (tdir / "f").stat().st_mtime_ns // 1_000_000
    assert current["result"]["modifiedAtMs"] == legacy["result"]["modifiedAtMs"] == mtime_ms


async def test_read_directory_as_file_per_generation(wire: Any, tdir: Path) -> None:
    legacy = await wire.raw("fs/readFile", {"path": str(tdir)})
    assert error(legacy) == (-32603, "Is a directory (os error 21)")
    current = await wire.raw("fs/readFile", {"path": uri(tdir)})
    assert error(current) == (-32600, f"path `{tdir}` is not a file")


async def test_read_fifo_and_device_per_generation(
    wire: Any, tdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Legacy (plain path): read what is there, never hanging on a FIFO without a
    writer; current (URI): anything but a regular file is not a file (upstream
    0.163.0), refused before it is opened (opening a FIFO would release a
    writer waiting for a reader)."""
    os.mkfifo(tdir / "pipe")
    opened: list[str] = []
    real_open = os.open

    def recording_open(path: Any, *args: Any, **kwargs: Any) -> int:
        opened.append(os.fsdecode(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", recording_open)
    for path in (tdir / "pipe", Path("/dev/null")):
        legacy = await wire.raw("fs/readFile", {"path": str(path)})
        assert legacy["result"] == {"dataBase64": ""}
        assert str(path) in opened
        opened.clear()
        current = await wire.raw("fs/readFile", {"path": uri(path)})
        assert error(current) == (-32600, f"path `{path}` is not a file")
        assert str(path) not in opened


async def test_canonicalize_answers_in_request_form(wire: Any, tdir: Path) -> None:
    (tdir / "sp ace#x%y").mkdir()
    (tdir / "sp ace#x%y" / "é").write_text("")
    (tdir / "alias").symlink_to("sp ace#x%y")
    plain = await wire.raw("fs/canonicalize", {"path": f"{tdir}/alias/é"})
    assert plain["result"] == {"path": f"{tdir}/sp ace#x%y/é"}
    current = await wire.raw(
        "fs/canonicalize", {"path": f"file://{tdir}/alias/%C3%A9", "sandbox": None}
    )
    assert current["result"] == {"path": f"file://{tdir}/sp%20ace%23x%25y/%C3%A9"}
    missing = await wire.raw("fs/canonicalize", {"path": uri(tdir / "missing")})
    assert error(missing) == (-32004, "No such file or directory (os error 2)")


async def test_uri_variants_accepted(wire: Any, tdir: Path) -> None:
    (tdir / "f").write_text("x")
    for spelled in (f"file://{tdir}/f", f"file://localhost{tdir}/f", f"FILE://{tdir}/f"):
        reply = await wire.raw("fs/readFile", {"path": spelled})
        assert reply["result"] == {"dataBase64": b64(b"x")}, spelled
    other = await wire.raw("fs/readFile", {"path": f"file://otherhost{tdir}/f"})
    assert error(other)[0] == -32600


BAD_HOST = "invalid URI: invalid international domain name"


async def test_uri_spellings_read_as_upstream_reads_them(wire: Any, tdir: Path) -> None:
    """Upstream (codex 0.163.0) parses path URIs with the URL standard; its answers,
    recorded side by side with ours: each spelling names the same file, or gets
    the same code (and, where upstream's text is known, the same message)."""
    (tdir / "a.txt").write_text("x")
    (tdir / "d").mkdir()
    (tdir / "d" / "a.txt").write_text("in d")
    found = {"dataBase64": b64(b"x")}
    for spelled in (
        f"file://LOCALHOST{tdir}/a.txt",  # hosts are case-insensitive
        f"file://{tdir}\\a.txt",  # a backslash is a slash in file URLs
        f" file://{tdir}/a.txt ",  # spaces around a URL are dropped
        f"file://{tdir}/a.t\txt",  # so are tabs and newlines anywhere
        # A host is percent-decoded and mapped as IDNA maps it (full-width letters,
        # soft hyphens) before it is compared with localhost.
        f"file://%6Cocalhost{tdir}/a.txt",
        f"file://LOCAL%48OST{tdir}/a.txt",
        f"file://\uff4c\uff4f\uff43\uff41\uff4c\uff48\uff4f\uff53\uff54{tdir}/a.txt",
        f"file://loc\u00adalhost{tdir}/a.txt",
    ):
        reply = await wire.raw("fs/readFile", {"path": spelled})
        assert reply.get("result") == found, spelled
    # An empty segment counts for a URL's `..` (it removes the empty segment), so
    # these name d/a.txt, where a file path's normalisation would give a.txt.
    for spelled in (
        f"file://{tdir}/d//../a.txt",
        f"file://{tdir}/d///../../a.txt",
        f"file://{tdir}/d//%2E%2e/a.txt",
    ):
        reply = await wire.raw("fs/readFile", {"path": spelled})
        assert reply.get("result") == {"dataBase64": b64(b"in d")}, spelled
    reply = await wire.raw("fs/canonicalize", {"path": f"file://{tdir}/d//.."})
    assert reply["result"] == {"path": f"file://{tdir}/d"}
    # Plain paths are file paths: `..` after a doubled slash leaves d.
    reply = await wire.raw("fs/readFile", {"path": f"{tdir}/d//../a.txt"})
    assert reply.get("result") == found
    for spelled, answer in (
        ("file:a.txt", (-32004, "No such file or directory (os error 2)")),  # /a.txt
        ("file://", (-32600, "path `/` is not a file")),  # the root
        ("file://localhost", (-32600, "path `/` is not a file")),
        (f"file://localhost:80{tdir}/a.txt", (-32602, BAD_HOST)),
        (f"file://user@localhost{tdir}/a.txt", (-32602, BAD_HOST)),
        (f"http://{tdir}/a.txt", (-32602, "unsupported path URI scheme `http`")),
        (f"file://{tdir}/a%00.txt", (-32602, f"'file://{tdir}/a%00.txt' is invalid on 'linux'")),
        # Hosts that are no domain, and an unclosed IPv6 literal (was -32603).
        (f"file://xn--{tdir}/a.txt", (-32602, BAD_HOST)),
        (f"file://xn--a{tdir}/a.txt", (-32602, BAD_HOST)),  # decodes to no valid label
        (f"file://%{tdir}/a.txt", (-32602, BAD_HOST)),
        (f"file://a b{tdir}/a.txt", (-32602, BAD_HOST)),
        (f"file://[::1{tdir}/a.txt", (-32602, "invalid URI: invalid IPv6 address")),
        # Another host is named as upstream writes the URL back: its ASCII form.
        (f"file://ex%41mple.com{tdir}/a.txt",
         (-32600, f"'file://example.com{tdir}/a.txt' is invalid on 'linux'")),
        (f"file://a..b{tdir}/a.txt", (-32600, f"'file://a..b{tdir}/a.txt' is invalid on 'linux'")),
        # No length limit on a label (IDNA 2003's is 63).
        (f"file://{'A' * 70}{tdir}/a.txt",
         (-32600, f"'file://{'a' * 70}{tdir}/a.txt' is invalid on 'linux'")),
    ):
        reply = await wire.raw("fs/readFile", {"path": spelled})
        assert error(reply) == answer, spelled
    # A plain path keeps its spaces: they are part of the name.
    (tdir / "a.txt ").write_text("spaced")
    reply = await wire.raw("fs/readFile", {"path": f"{tdir}/a.txt "})
    assert reply["result"] == {"dataBase64": b64(b"spaced")}


# ------------------------------------------------------------------ bad input


async def test_invalid_base64(wire: Any, tdir: Path) -> None:
    (tdir / "f").write_text("complete")
    for bad, detail in [
        ("!!!!", "Invalid symbol 33, offset 0."),
        ("aGVsbG8", "Invalid padding"),
        ("aGVsbG8=x", "Invalid symbol 61, offset 7."),
        ("a", "Invalid input length: 1"),
        # Upstream's own answers (codex 0.163.0): stray bits in the last symbol,
        # padding in the wrong place, a bad symbol found in its order.
        ("aGVsbG9=", "Invalid last symbol 57, offset 6."),
        ("aR==", "Invalid last symbol 82, offset 1."),
        ("aGk==", "Invalid symbol 61, offset 3."),
        ("====", "Invalid symbol 61, offset 0."),
        ("\n fB!", "Invalid symbol 33, offset 4."),
    ]:
        reply = await wire.raw("fs/writeFile", {"path": str(tdir / "f"), "dataBase64": bad})
        assert error(reply) == (
            -32600,
            f"fs/writeFile requires valid base64 dataBase64: {detail}",
        ), bad
    assert (tdir / "f").read_text() == "complete"


async def test_base64_with_json_escapes(wire: Any, tdir: Path) -> None:
    data = b"\xff\xfe\xfd" * 7  # base64 contains '/'
    encoded = b64(data)
    assert "/" in encoded
    escaped = encoded.replace("/", "\\/")
    target = tdir / "f"
    frame = (
        '{"id":1,"method":"fs/writeFile","params":'
        + f'{{"path":"{target}","dataBase64":"{escaped}"}}}}'
    )
    reply = await wire.exchange(frame)
    assert reply == b'{"id":1,"result":{}}'
    assert (tdir / "f").read_bytes() == data


async def test_big_writes_give_the_same_answers(wire: Any, tdir: Path) -> None:
    """Requests over the deferred-string threshold: escapes, errors and the sandbox
    member behave exactly as for small ones."""
    data = b"\xff\xfe\xfd" * 40000  # ~120 KB; base64 full of '/'
    target = tdir / "big"
    escaped = b64(data).replace("/", "\\/")
    frame = (
        '{"id":1,"method":"fs/writeFile","params":'
        + f'{{"path":"{target}","dataBase64":"{escaped}","sandbox":null}}}}'
    )
    assert await wire.exchange(frame) == b'{"id":1,"result":{}}'
    assert target.read_bytes() == data
    bad = b64(data)[:-4] + "!!!!"
    reply = await wire.raw("fs/writeFile", {"path": str(target), "dataBase64": bad})
    offset = len(bad) - 4
    assert error(reply) == (
        -32600,
        f"fs/writeFile requires valid base64 dataBase64: Invalid symbol 33, offset {offset}.",
    )
    reply = await wire.raw("fs/writeFile", {"path": 7, "dataBase64": b64(data)})
    assert error(reply)[0] == -32602
    assert target.read_bytes() == data  # failed writes left the file alone


async def test_big_writes_are_decoded_piece_by_piece_as_they_are_written(
    wire: Any, tdir: Path
) -> None:
    """A 3 MiB write is 4 MiB of text, four 1 MiB slices (``base64_text.DECODE_SLICE``):
    the whole file arrives, and a bad character in the third slice - after two
    were written to the temp file - is upstream's error at its offset, with the
    old file untouched and no temp file left."""
    from exec_server.protocol.base64_text import DECODE_SLICE

    data = os.urandom(3 * 1024 * 1024)
    target = tdir / "big"
    text = b64(data)
    assert len(text) == 4 * DECODE_SLICE
    reply = await wire.raw("fs/writeFile", {"path": uri(target), "dataBase64": text})
    assert reply["result"] == {}
    assert target.read_bytes() == data
    offset = 2 * DECODE_SLICE + 12345
    bad = text[:offset] + "*" + text[offset + 1 :]
    reply = await wire.raw("fs/writeFile", {"path": uri(target), "dataBase64": bad})
    assert error(reply) == (
        -32600,
        f"fs/writeFile requires valid base64 dataBase64: Invalid symbol 42, offset {offset}.",
    )
    assert target.read_bytes() == data
    assert os.listdir(tdir) == ["big"]


async def test_big_writes_decode_their_base64_where_it_lies(
    wire: Any, tdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A big plain request leaves ``dataBase64`` undecoded until the writing worker
    decodes it a slice at a time; answers are those of the other paths."""
    from exec_server.server.handlers import fs as fs_handlers

    spans: list[int] = []
    real = fs_handlers.span_payload

    def spy(span: Any) -> Any:
        spans.append(span.end - span.start)
        return real(span)

    monkeypatch.setattr(fs_handlers, "span_payload", spy)
    data = os.urandom(1024 * 1024 + 1)
    target = tdir / "big"
    reply = await wire.raw("fs/writeFile", {"path": uri(target), "dataBase64": b64(data)})
    assert reply["result"] == {}
    assert target.read_bytes() == data
    assert spans == [len(b64(data))]
    # A raw control character is not JSON text: still a -32600 naming the member,
    # and the file keeps its content.
    body = b64(data).encode()
    frame = b'{"id":5,"method":"fs/writeFile","params":{"path":"%s","dataBase64":"%s"}}'
    reply = json.loads(await wire.exchange(frame % (str(target).encode(), body[:-4] + b"QU\nD")))
    assert reply["id"] == 5
    code, message = error(reply)
    assert code == -32600
    assert message.startswith("fs/writeFile requires valid base64 dataBase64: ")
    assert target.read_bytes() == data


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("fs/readFile", {}),
        ("fs/readFile", {"path": 5}),
        ("fs/readFile", {"path": "relative.txt"}),
        ("fs/readFile", {"path": "~/x"}),
        ("fs/readFile", {"path": "http://x/y"}),
        ("fs/readFile", {"path": "file:///a?q"}),
        ("fs/readFile", None),
        ("fs/writeFile", {"path": "/tmp/x"}),
        ("fs/writeFile", {"path": "/tmp/x", "dataBase64": 5}),
        ("fs/writeFile", {"path": "/tmp/x", "dataBase64": None}),
        ("fs/createDirectory", {"path": "/tmp/x", "recursive": "yes"}),
        ("fs/remove", {"path": "/tmp/x", "force": 1}),
        ("fs/copy", {"sourcePath": "/tmp/a", "destinationPath": "/tmp/b"}),
        ("fs/copy", {"sourcePath": "/tmp/a", "destinationPath": "b", "recursive": True}),
        ("fs/getMetadata", {"path": "/tmp", "sandbox": 5}),
        ("fs/getMetadata", {"path": "/tmp", "sandbox": {"sandboxPolicy": {"type": "bogus"}}}),
        ("fs/getMetadata", {"path": "/tmp", "sandbox": {"windowsSandboxLevel": "disabled"}}),
        (
            "fs/getMetadata",
            {"path": "/tmp", "sandbox": {"permissions": {"type": "disabled"}}},
        ),
    ],
)
async def test_bad_params_are_invalid_params(wire: Any, method: str, params: Any) -> None:
    code, message = error(await wire.raw(method, params))
    assert code == -32602, message
    assert message
    # The server keeps serving on the same connection.
    ok = await wire.raw("fs/getMetadata", {"path": "/"})
    assert ok["result"]["isDirectory"] is True


async def test_unknown_members_ignored_and_defaults(wire: Any, tdir: Path) -> None:
    reply = await wire.raw(
        "fs/createDirectory", {"path": str(tdir / "a" / "b"), "recursive": None, "extra": [1]}
    )
    assert reply["result"] == {}
    assert (tdir / "a" / "b").is_dir()
    reply = await wire.raw("fs/remove", {"path": str(tdir / "a"), "recursive": None, "force": None})
    assert reply["result"] == {}
    assert not (tdir / "a").exists()


# ------------------------------------------------------------ sandbox routing


@pytest.mark.parametrize("context", DIRECT_CONTEXTS)
async def test_full_access_contexts_run_directly(wire: Any, tdir: Path, context: Any) -> None:
    params = {"path": uri(tdir / "f"), "dataBase64": b64(b"direct"), "sandbox": context}
    assert (await wire.raw("fs/writeFile", params))["result"] == {}
    assert (tdir / "f").read_bytes() == b"direct"


@pytest.mark.parametrize("context", [WW_LEGACY, RO_LEGACY, MANAGED_CURRENT])
async def test_confining_contexts_fail_closed_without_service(
    wire: Any, tdir: Path, context: Any
) -> None:
    assert wire.services.fs_sandbox is None
    params = {"path": str(tdir / "f"), "dataBase64": b64(b"no"), "sandbox": context}
    code, message = error(await wire.raw("fs/writeFile", params))
    assert code == -32600
    assert message == "sandboxed filesystem operations require configured runtime paths"
    assert not (tdir / "f").exists()
    for method in ("fs/readFile", "fs/getMetadata", "fs/readDirectory", "fs/canonicalize"):
        code, _ = error(await wire.raw(method, {"path": str(tdir), "sandbox": context}))
        assert code == -32600


# ----------------------------------------------- the current client's sequences


async def test_apply_patch_sequence(wire: Any, tdir: Path) -> None:
    """CLIENT_COMPAT.md §7.2 scenario 4 (apply_patch.rpc.jsonl), as the client sends it."""
    ws = tdir / "workspace"
    ws.mkdir()
    (ws / "edit_me.txt").write_text("alpha\nbeta\ngamma\n")
    (ws / "delete_me.txt").write_text("bye\n")
    disabled = {
        "permissions": {"type": "disabled"},
        "policyContext": {"cwd": uri(ws), "workspaceRoots": [uri(ws)]},
        "userHomeDir": "file:///home/user",
        "temporaryDirectories": [],
        "windowsSandboxLevel": "disabled",
        "useLegacyLandlock": False,
    }
    for probe in (ws / ".git", tdir / ".git", ws / "AGENTS.md", ws / ".agents" / "skills"):
        reply = await wire.raw("fs/getMetadata", {"path": uri(probe), "sandbox": None})
        assert error(reply) == (-32004, "No such file or directory (os error 2)")
    r = await wire.raw("fs/readFile", {"path": uri(ws / "edit_me.txt"), "sandbox": disabled})
    assert r["result"] == {"dataBase64": "YWxwaGEKYmV0YQpnYW1tYQo="}
    added = uri(ws / "sub" / "dir" / "added.txt")
    assert error(await wire.raw("fs/getMetadata", {"path": added, "sandbox": None}))[0] == -32004
    assert error(await wire.raw("fs/readFile", {"path": added, "sandbox": None}))[0] == -32004
    write = {"path": added, "dataBase64": "YWRkZWQgYnkgYXBwbHlfcGF0Y2gK", "sandbox": None}
    assert error(await wire.raw("fs/writeFile", write)) == (
        -32004,
        "No such file or directory (os error 2)",
    )
    mkdir = {"path": uri(ws / "sub" / "dir"), "recursive": True, "sandbox": None}
    assert (await wire.raw("fs/createDirectory", mkdir))["result"] == {}
    assert (await wire.raw("fs/writeFile", write))["result"] == {}
    meta = await wire.raw("fs/getMetadata", {"path": uri(ws / "edit_me.txt"), "sandbox": None})
    assert meta["result"]["isFile"] is True
    assert meta["result"]["size"] == 17
    edit = {
        "path": uri(ws / "edit_me.txt"),
        "dataBase64": "YWxwaGEKQkVUQS1wYXRjaGVkCmdhbW1hCg==",
        "sandbox": None,
    }
    assert (await wire.raw("fs/writeFile", edit))["result"] == {}
    meta = await wire.raw("fs/getMetadata", {"path": uri(ws / "delete_me.txt"), "sandbox": None})
    assert meta["result"]["size"] == 4
    rm = {"path": uri(ws / "delete_me.txt"), "recursive": False, "force": False, "sandbox": None}
    assert (await wire.raw("fs/remove", rm))["result"] == {}

    assert (ws / "sub" / "dir" / "added.txt").read_text() == "added by apply_patch\n"
    assert (ws / "edit_me.txt").read_text() == "alpha\nBETA-patched\ngamma\n"
    assert not (ws / "delete_me.txt").exists()


async def test_view_image_sequence(wire: Any, tdir: Path) -> None:
    """CLIENT_COMPAT.md §7.2 scenario 5: getMetadata then readFile of a PNG."""
    png = base64.b64decode(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
    )
    (tdir / "pixel.png").write_bytes(png)
    disabled = {"permissions": {"type": "disabled"}, "windowsSandboxLevel": "disabled"}
    meta = await wire.raw("fs/getMetadata", {"path": uri(tdir / "pixel.png"), "sandbox": disabled})
    assert meta["result"]["isFile"] is True
    assert meta["result"]["size"] == 70
    data = await wire.raw("fs/readFile", {"path": uri(tdir / "pixel.png"), "sandbox": disabled})
    assert data["result"] == {"dataBase64": b64(png)}


async def test_read_too_large(wire: Any, tdir: Path) -> None:
    big = tdir / "sparse.bin"
    big.touch()
    os.truncate(big, 512 * 1024 * 1024 + 1)  # sparse: no real disk use
    code, message = error(await wire.raw("fs/readFile", {"path": str(big)}))
    assert (code, message) == (-32600, "file is too large to read: limit is 536870912 bytes")
    assert big.stat().st_size == 512 * 1024 * 1024 + 1
