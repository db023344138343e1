"""A missing required member is reported in upstream's (serde's) words,
``missing field `x```, which CLIENT_COMPAT.md quotes for the members clients
omit (§2 ``windowsSandboxLevel``, §4 ``env``). (``writeId``, which §5.1 also
quotes, is optional here: the legacy client never sends it.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PERMISSIONS = {
    "type": "managed",
    "file_system": {"type": "unrestricted"},
    "network": "enabled",
}


async def test_missing_members_are_named_as_upstream_names_them(
    server: Any, rpc: Any, tmp_path: Path
) -> None:
    client = await rpc(server.url)
    await client.initialize()
    uri = tmp_path.as_uri()

    reply = await client.request(
        "fs/getMetadata", {"path": uri, "sandbox": {"permissions": PERMISSIONS}}
    )
    assert reply["error"]["code"] == -32602, reply
    assert "missing field `windowsSandboxLevel`" in reply["error"]["message"], reply

    reply = await client.request(
        "process/start",
        {
            "processId": "p1",
            "argv": ["/bin/true"],
            "cwd": uri,
            "envPolicy": None,
            "tty": False,
            "sandbox": None,
        },
    )
    assert reply["error"]["code"] == -32602, reply
    assert "missing field `env`" in reply["error"]["message"], reply

    # The connection keeps serving.
    reply = await client.request("fs/getMetadata", {"path": uri, "sandbox": None})
    assert reply["result"]["isDirectory"] is True
