"""``http/request`` and ``environmentConfig/read`` side by side with upstream's
0.163 binary: the same requests give the same codes, texts, statuses, bodies
and config layers (PROTOCOL_CURRENT.md §9, §10)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import sys
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import websockets

pytestmark = pytest.mark.upstream


class _Side:
    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.next_id = 0

    async def call(self, method: str, params: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The reply, and for a streamed request its deltas up to ``done``."""
        self.next_id += 1
        await self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        reply: dict[str, Any] | None = None
        deltas: list[dict[str, Any]] = []
        streamed = isinstance(params, dict) and params.get("streamResponse") is True
        async with asyncio.timeout(30):
            while True:
                msg = json.loads(await self.ws.recv())
                if msg.get("id") == self.next_id:
                    reply = msg
                elif msg.get("method") == "http/request/bodyDelta":
                    deltas.append(msg["params"])
                if reply is not None and (
                    not streamed or "error" in reply or (deltas and deltas[-1]["done"])
                ):
                    return reply, deltas


@contextlib.asynccontextmanager
async def _serve(argv: list[str], env: dict[str, str]) -> AsyncIterator[_Side]:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL, env=env,
    )
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        match = re.search(rb"ws://\S+", line)
        assert match, line
        async with websockets.connect(match.group(0).decode(), max_size=None) as ws:
            side = _Side(ws)
            reply, _ = await side.call("initialize", {"clientName": "diff"})
            assert "result" in reply
            await ws.send(json.dumps({"method": "initialized", "params": {}}))
            yield side
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


@pytest.fixture
async def sides(
    codex_binary: str, tmp_path: Path
) -> AsyncIterator[tuple[_Side, _Side, Path]]:
    home = tmp_path / "codex-home"
    home.mkdir()
    env = {**os.environ, "CODEX_HOME": str(home), "DIFF_TOKEN": "tok-d", "DIFF_EMPTY": ""}
    ours = [sys.executable, "-m", "exec_server", "serve", "--listen", "ws://127.0.0.1:0"]
    async with (
        _serve([codex_binary, "exec-server", "--listen", "ws://127.0.0.1:0"], env) as up,
        _serve(ours, env) as mine,
    ):
        yield up, mine, home


def _probes(base: str) -> list[dict[str, Any]]:
    def req(**extra: Any) -> dict[str, Any]:
        return {"method": "GET", "url": base + "/echo", "headers": [], "requestId": "d", **extra}

    env_header = {"name": "authorization", "value": "Bearer "}
    return [
        req(),
        req(method="post", bodyBase64=base64.b64encode(b"body").decode()),
        req(url=base + "/status/404"),
        req(url=base + "/redirect", redirectPolicy="stop"),
        req(url=base + "/redirect"),
        req(url=base + "/status/500", streamResponse=True),
        req(url=base + "/bytes/3000000", streamResponse=True),
        req(url=base + "/trunc"),
        req(url=base + "/trunc", streamResponse=True),
        req(url="nope"), req(url="http://"), req(url="ftp://h/"), req(url="file:///x"),
        req(url="http://127.0.0.1:1/"),
        req(method="a b"), req(method=""),
        req(headers=[{"name": "bad name", "value": "x"}]),
        req(headers=[{"name": "x", "value": "a\nb"}]),
        req(headers=[{"name": "x", "value": "a\u0001b"}]),
        req(headers=[{**env_header, "valueEnvVar": "DIFF_TOKEN"}]),
        req(headers=[{**env_header, "valueEnvVar": "DIFF_EMPTY"}]),
        req(headers=[{**env_header, "valueEnvVar": "DIFF_UNSET_E29"}]),
        req(headers=[{**env_header, "valueEnvVar": "aws_session_token"}]),
        req(headers=[{**env_header, "valueEnvVar": "GOOGLE_APPLICATION_CREDENTIALS"}]),
        req(timeoutMs=0),
        req(method="HEAD"),
    ]


def _view(reply: dict[str, Any], deltas: list[dict[str, Any]]) -> Any:
    """What must agree: error code and text, or status, headers we control, body."""
    if "error" in reply:
        return {"error": reply["error"]}
    result = reply["result"]
    headers = [(h["name"], h["value"]) for h in result["headers"] if h["name"] != "date"]
    body = base64.b64decode(result["bodyBase64"])
    if body[:1] == b"{":
        echoed = json.loads(body)
        # header order around the library's own (host) differs; the set must not
        echoed["headers"] = sorted((k.lower(), v) for k, v in echoed["headers"])
        body = json.dumps(echoed).encode()
    streamed = b"".join(base64.b64decode(d["deltaBase64"]) for d in deltas)
    end = (deltas[-1]["done"], deltas[-1]["error"]) if deltas else None
    return {"status": result["status"], "headers": headers, "body": body,
            "streamed": streamed, "end": end}


async def test_http_request_matches_upstream(sides: Any, http_peer: Any) -> None:
    up, ours, _ = sides
    for probe in _probes(http_peer.base):
        theirs = _view(*await up.call("http/request", probe))
        mine = _view(*await ours.call("http/request", probe))
        assert mine == theirs, probe


async def test_environment_config_read_matches_upstream(sides: Any, tmp_path: Path) -> None:
    up, ours, home = sides
    params = {"cwd": tmp_path.as_uri(), "configPaths": [["mcp_servers"]],
              "requirementsPaths": [["mcp_servers"]]}
    texts = [
        None,
        'model = "x"\n',
        'model = "x"\n[mcp_servers.a]\nurl = "http://h/mcp"\nbearer_token_env_var = "T"\n'
        '[mcp_servers.b]\ncommand = "c"\nargs = ["1", 2]\n[other]\nk = 1\n',
    ]
    for text in texts:
        if text is not None:
            (home / "config.toml").write_text(text)
        (theirs, _), (mine, _) = [await side.call("environmentConfig/read", params)
                                  for side in (up, ours)]
        for reply in (theirs, mine):
            for layer in reply["result"]["config"]["layers"]:
                layer["toml"] = tomllib.loads(layer["toml"])  # same TOML, any layout
        assert mine["result"] == theirs["result"], text
    for bad in ({**params, "configPaths": [], "requirementsPaths": []},
                {**params, "configPaths": [[]]}):
        (theirs, _), (mine, _) = [await side.call("environmentConfig/read", bad)
                                  for side in (up, ours)]
        assert mine["error"] == theirs["error"]
