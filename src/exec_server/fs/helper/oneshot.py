"""``exec-server --codex-run-as-fs-helper``: one sandboxed fs operation, stdin → stdout.

The upstream-equivalent path (PROTOCOL.md §10.4-§10.6), wrapped by the sandbox manager:
one §10.5 request in, one response line out, run as a zygote child runs it, from the
server's header in the ``x-exec-server`` member. Stdlib only (tight read confinement).
"""

from __future__ import annotations

import base64
import binascii
import json
import sys
from collections.abc import Sequence

from exec_server.fs.helper.ops import OPERATIONS, OpError, OpRequest, execute

__all__ = ["helper_main"]

#: §10.5's operations: all but ``fs/open`` (a descriptor cannot travel over a pipe).
_OPERATIONS = OPERATIONS - {"fs/open"}


def _path(value: object, key: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"`{key}` must be a string path")
    if value[:5].lower() == "file:":
        from exec_server.protocol.paths import parse_wire_path

        return parse_wire_path(value).path
    if not value.startswith("/"):
        raise ValueError(f"`{key}` must be absolute")
    return value


def _decode(raw: bytes) -> tuple[OpRequest, bytes]:
    """§10.5 request → operation; ValueError for anything malformed."""
    msg = json.loads(raw)
    if not isinstance(msg, dict):
        raise ValueError("request is not an object")
    op = msg.get("operation")
    params = msg.get("params")
    if op not in _OPERATIONS or not isinstance(params, dict):
        raise ValueError(f"unknown variant `{op}`")
    # Our server's request header (the zygote's): the same strict checks apply.
    ext = msg.get("x-exec-server")
    header: dict[str, object] = dict(ext) if isinstance(ext, dict) else {}
    header["op"] = op
    if op == "fs/copy":
        header["path"] = _path(params.get("sourcePath"), "sourcePath")
        header["dest"] = _path(params.get("destinationPath"), "destinationPath")
        if not isinstance(params.get("recursive"), bool):
            raise ValueError("missing field `recursive`")
    else:
        header["path"] = _path(params.get("path"), "path")
    for key in ("recursive", "force"):
        value = params.get(key)
        header[key] = True if value is None else bool(value)
    data = b""
    if op == "fs/writeFile":
        try:
            data = base64.b64decode(str(params.get("dataBase64", "")), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise OpError(-32600, f"fs/writeFile requires valid base64 dataBase64: {exc}") from exc
    return OpRequest.from_header(header), data


def helper_main(argv: Sequence[str]) -> int:
    """Run one request from stdin; exit 0 with a response (also for failed operations)."""
    del argv
    try:
        req, data = _decode(sys.stdin.buffer.read())
        result, payload = execute(req, data)
        if req.op == "fs/readFile":
            result = {"dataBase64": base64.b64encode(payload).decode("ascii")}
        out = {"status": "ok", "payload": {"operation": req.op, "response": result}}
    except OpError as exc:
        out = {"status": "error", "payload": {"code": exc.code, "message": exc.message}}
    except (ValueError, OSError) as exc:
        sys.stderr.write(f"fs sandbox helper failed: {exc}\n")
        return 1
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0
