"""An error naming a file whose name is not UTF-8 is answered, with the bad bytes
as U+FFFD as upstream shows them, and the connection keeps serving. msgspec
refused to encode the surrogate escapes those names are held in, and the
server dropped the connection (found by an audit of the client library)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from exec_server.protocol.codec import encode_error, lossy_text

READ_ONLY_LEGACY = {
    "sandboxPolicy": {"type": "read-only", "networkAccess": False},
    "windowsSandboxLevel": "disabled",
}


def test_encode_error_carries_a_non_utf8_name_as_replacement_characters() -> None:
    name = os.fsdecode(b"/tmp/dir\xff\xfeend")
    assert encode_error(7, -32600, f"{name} is a directory") == (
        '{"id":7,"error":{"code":-32600,"message":"/tmp/dir\ufffd\ufffdend is a directory"}}'
    ).encode()
    assert lossy_text("lone \ud800 surrogate") == "lone ? surrogate"
    assert lossy_text("plain é") == "plain é"


async def test_errors_naming_non_utf8_paths_are_answered(
    server: Any, rpc: Any, tmp_path: Path
) -> None:
    raw_dir = os.fsencode(tmp_path) + b"/dir\xff"
    os.mkdir(raw_dir)
    client = await rpc(server.url)
    await client.initialize()
    uri = tmp_path.as_uri() + "/dir%FF"

    # readFile of a directory: the error names the path.
    reply = await client.request("fs/readFile", {"path": uri, "sandbox": None})
    assert reply["error"]["code"] == -32600, reply
    assert "dir\ufffd" in reply["error"]["message"], reply

    # A sandbox denial names it too (a write under a read-only context).
    reply = await client.request(
        "fs/writeFile",
        {"path": uri + "/new", "dataBase64": "aGk=", "sandbox": READ_ONLY_LEGACY},
    )
    assert reply["error"]["code"] == -32600, reply
    assert "dir\ufffd/new" in reply["error"]["message"], reply

    # The connection still serves, and the directory is there as it was.
    meta = await client.call("fs/getMetadata", {"path": uri, "sandbox": None})
    assert meta["isDirectory"] is True
    assert os.listdir(raw_dir) == []
