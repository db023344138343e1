"""The real ``codex exec`` 0.163 with a fake model: MCP servers reached through the
remote environment complete their handshake through our ``http/request``
(PROTOCOL_CURRENT.md §9.5, §10).

Two fake Streamable-HTTP MCP servers: ``client_side`` is configured in the
client's config with ``environment_id = "remote"``, ``exec_side`` in the
exec-server's own ``$CODEX_HOME/config.toml`` (found through
``environmentConfig/read``). Each uses ``bearer_token_env_var`` naming a
variable that exists **only in the exec-server's environment**, so a request
carrying its value was sent by the executor (``valueEnvVar``), not by codex.
The fake model answers once; its request must list both servers' tools. The
same scenario runs against upstream's server as a control of the harness.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.upstream

_PROXY = "http://127.0.0.1:9"  # codex's own outside requests (plugin sync) go nowhere


class Fakes:
    """One HTTP/1.1 server: ``/v1/*`` is the model (Responses SSE), ``/<name>`` an MCP server."""

    def __init__(self) -> None:
        self.model_requests: list[Any] = []
        self.mcp: list[tuple[str, str, str | None, str | None]] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if line:
                        key, value = line.split(":", 1)
                        headers[key.strip().lower()] = value.strip()
                body = await self._body(reader, headers)
                if path.startswith("/v1/"):
                    self._model(body, writer)
                else:
                    self._mcp(method, path, headers, body, writer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @staticmethod
    async def _body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
        if headers.get("transfer-encoding") != "chunked":
            return await reader.readexactly(int(headers.get("content-length", 0)))
        body = b""
        while size := int((await reader.readline()).strip(), 16):
            body += await reader.readexactly(size)
            await reader.readline()
        await reader.readline()
        return body

    @staticmethod
    def _send(writer: asyncio.StreamWriter, status: int, body: bytes = b"",
              ctype: str = "application/json", extra: str = "") -> None:
        head = f"HTTP/1.1 {status} X\r\ncontent-length: {len(body)}\r\n"
        if body:
            head += f"content-type: {ctype}\r\n"
        writer.write((head + extra + "\r\n").encode() + body)

    def _model(self, body: bytes, writer: asyncio.StreamWriter) -> None:
        if body[:2] == b"\x1f\x8b":
            import gzip

            body = gzip.decompress(body)
        self.model_requests.append(json.loads(body))
        events = [
            {"type": "response.created", "response": {"id": "resp_1"}},
            {"type": "response.output_item.done", "output_index": 0, "item": {
                "type": "message", "role": "assistant", "id": "msg_1",
                "content": [{"type": "output_text", "text": "FAKE-MODEL-DONE"}]}},
            {"type": "response.completed", "response": {"id": "resp_1", "usage": {
                "input_tokens": 1, "input_tokens_details": None, "output_tokens": 1,
                "output_tokens_details": None, "total_tokens": 2}}},
        ]
        sse = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)
        self._send(writer, 200, sse.encode(), "text/event-stream")

    def _mcp(self, method: str, path: str, headers: dict[str, str], body: bytes,
             writer: asyncio.StreamWriter) -> None:
        name = path.strip("/")
        msg = json.loads(body) if body else {}
        self.mcp.append((method, name, headers.get("authorization"), msg.get("method")))
        if method == "GET":
            self._send(writer, 405)  # no server-sent stream; the client handles it
        elif method == "DELETE" or "id" not in msg:
            self._send(writer, 200 if method == "DELETE" else 202)
        elif msg["method"] == "initialize":
            result = {"protocolVersion": msg["params"]["protocolVersion"],
                      "capabilities": {"tools": {}},
                      "serverInfo": {"name": f"fake-{name}", "version": "1"}}
            self._send(writer, 200, json.dumps({"jsonrpc": "2.0", "id": msg["id"],
                                                "result": result}).encode(),
                       extra=f"mcp-session-id: s-{name}\r\n")
        elif msg["method"] == "tools/list":
            tool = {"name": f"{name}_tool", "description": "a fake tool",
                    "inputSchema": {"type": "object", "properties": {}}}
            self._send(writer, 200, json.dumps({"jsonrpc": "2.0", "id": msg["id"],
                                                "result": {"tools": [tool]}}).encode())
        else:
            error = {"code": -32601, "message": "not here"}
            self._send(writer, 200, json.dumps({"jsonrpc": "2.0", "id": msg["id"],
                                                "error": error}).encode())


@pytest.fixture
async def fakes() -> AsyncIterator[Fakes]:
    fake = Fakes()
    await fake.start()
    yield fake
    fake.close()


@contextlib.asynccontextmanager
async def _server(argv: list[str], env: dict[str, str], cwd: Path) -> AsyncIterator[str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL, env=env, cwd=cwd,
    )
    assert proc.stdout is not None
    try:
        match = re.search(rb"ws://\S+", await asyncio.wait_for(proc.stdout.readline(), 30))
        assert match
        yield match.group(0).decode()
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


@pytest.mark.parametrize("which", ["ours", "upstream"])
async def test_mcp_servers_handshake_through_the_remote_environment(
    which: str, codex_binary: str, fakes: Fakes, tmp_path: Path
) -> None:
    server_home, client_home, workspace = (tmp_path / n for n in ("srv", "cli", "ws"))
    for path in (server_home, client_home, workspace):
        path.mkdir()
    base = f"http://127.0.0.1:{fakes.port}"
    (server_home / "config.toml").write_text(
        f'[mcp_servers.exec_side]\nurl = "{base}/exec_side"\n'
        'bearer_token_env_var = "E2E_EXEC_TOKEN"\n'
    )
    server_env = {**os.environ, "CODEX_HOME": str(server_home),
                  "E2E_EXEC_TOKEN": "tok-exec", "E2E_CLIENT_TOKEN": "tok-client"}
    argv = (
        [sys.executable, "-m", "exec_server", "serve", "--listen", "ws://127.0.0.1:0"]
        if which == "ours"
        else [codex_binary, "exec-server", "--listen", "ws://127.0.0.1:0"]
    )
    async with _server(argv, server_env, tmp_path) as url:
        (client_home / "config.toml").write_text(f"""
model = "fake-model"
model_provider = "fake"
[model_providers.fake]
name = "fake"
base_url = "{base}/v1"
wire_api = "responses"
env_key = "FAKE_API_KEY"
[mcp_servers.client_side]
url = "{base}/client_side"
environment_id = "remote"
bearer_token_env_var = "E2E_CLIENT_TOKEN"
""")
        (client_home / "environments.toml").write_text(
            f'default = "remote"\ninclude_local = false\n'
            f'[[environments]]\nid = "remote"\nurl = "{url}"\n'
        )
        client_env = {k: v for k, v in os.environ.items()
                      if not k.startswith(("CODEX_", "OPENAI_", "E2E_"))}
        client_env.update(
            CODEX_HOME=str(client_home), HOME=str(tmp_path), FAKE_API_KEY="k",
            RUST_LOG="error", HTTPS_PROXY=_PROXY, HTTP_PROXY=_PROXY, ALL_PROXY=_PROXY,
            https_proxy=_PROXY, http_proxy=_PROXY, NO_PROXY="127.0.0.1,localhost",
            no_proxy="127.0.0.1,localhost",
        )
        codex = await asyncio.create_subprocess_exec(
            codex_binary, "exec", "--skip-git-repo-check", "-C", str(workspace), "say hi",
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=client_env,
        )
        try:
            out, err = await asyncio.wait_for(codex.communicate(), 120)
        finally:
            if codex.returncode is None:
                codex.kill()
                await codex.wait()
    assert codex.returncode == 0, err.decode()[-2000:]
    assert "FAKE-MODEL-DONE" in out.decode()
    for name, token in (("client_side", "tok-client"), ("exec_side", "tok-exec")):
        seen = [(method, rpc) for method, n, _, rpc in fakes.mcp if n == name]
        assert ("POST", "initialize") in seen, (name, fakes.mcp)
        assert ("POST", "notifications/initialized") in seen, (name, fakes.mcp)
        assert ("POST", "tools/list") in seen, (name, fakes.mcp)
        # Only the exec-server's environment has the token: every request was
        # sent by the executor, which resolved ``valueEnvVar`` itself.
        assert {auth for _, n, auth, _ in fakes.mcp if n == name} == {f"Bearer {token}"}
    (request,) = fakes.model_requests
    tools = json.dumps(request["tools"])
    assert "client_side_tool" in tools and "exec_side_tool" in tools, tools
