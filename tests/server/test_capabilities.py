"""``environmentInfo.capabilities``: a flag is advertised only for a feature that is
served, and each advertised flag is checked here against the real feature
(PROTOCOL_CURRENT.md §3.3)."""

from __future__ import annotations

import base64
import json
import tempfile
import tomllib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

import exec_server
from exec_server.protocol.messages import EnvironmentCapabilities
from exec_server.server.app import build_router
from exec_server.server.capabilities import REQUIRED_METHODS, advertised_capabilities

#: flags this server must never advertise: features it does not implement.
NOT_BUILT = (
    "networkProxyLaunch",
    "capabilityDiscoverySandbox",
    "capabilityDiscoveryV2",
    "shellSnapshotV2",
    "windowsMxc",
    "linuxRootWritePreservesDevices",
    "linuxApprovedRootWritePreservesRestrictions",
)


async def _check_environment_config_read(client: Any, tmp_path: Path, peer: Any) -> None:
    result = await client.call(
        "environmentConfig/read",
        {"cwd": tmp_path.as_uri(), "configPaths": [["mcp_servers"]], "requirementsPaths": []},
    )
    (layer,) = result["config"]["layers"]
    assert tomllib.loads(layer["toml"]) == {"mcp_servers": {"docs": {"url": peer.base + "/mcp"}}}


async def _check_http_header_env_vars(client: Any, tmp_path: Path, peer: Any) -> None:
    header = {"name": "authorization", "value": "Bearer ", "valueEnvVar": "E29_CAP_TOKEN"}
    params = {"method": "GET", "url": peer.base + "/echo", "headers": [header], "requestId": "c"}
    result = await client.call("http/request", params)
    echoed = json.loads(base64.b64decode(result["bodyBase64"]))
    assert ["authorization", "Bearer cap-token"] in echoed["headers"]
    denied = {**header, "valueEnvVar": "CODEX_API_KEY"}
    reply = await client.request("http/request", {**params, "headers": [denied]})
    assert reply["error"]["code"] == -32602


def _restricted_reads(workspace: Path) -> dict[str, Any]:
    """A current-client context that may read only ``workspace``."""
    from exec_server.client.sandbox_contexts import to_wire, workspace_write

    wire: dict[str, Any] = to_wire(workspace_write(str(workspace)))
    entries = wire["permissions"]["file_system"]["entries"]
    for entry in entries:
        if entry["path"].get("value", {}).get("kind") == "root":
            entry["access"] = "none"
    return wire


async def _check_sandboxed_file_streaming(client: Any, tmp_path: Path, peer: Any) -> None:
    inside = tmp_path / "ws"
    inside.mkdir(exist_ok=True)
    (inside / "in.txt").write_bytes(b"streamed")
    sandbox = _restricted_reads(inside)
    await client.call("fs/open", {"handleId": "h1", "path": (inside / "in.txt").as_uri(),
                                  "mode": "read", "sandbox": sandbox})
    block = await client.call("fs/readBlock", {"handleId": "h1", "offset": 0, "len": 1024})
    assert base64.b64decode(block["chunk"]) == b"streamed"
    await client.call("fs/close", {"handleId": "h1"})
    # outside every readable root (/tmp is writable, hence readable, in this context)
    with tempfile.TemporaryDirectory(dir="/var/tmp") as outside:
        secret = Path(outside) / "outside.txt"
        secret.write_bytes(b"secret")
        reply = await client.request("fs/open", {"handleId": "h2", "path": secret.as_uri(),
                                                 "mode": "read", "sandbox": sandbox})
    assert "error" in reply, reply


async def _check_file_write_streaming(client: Any, tmp_path: Path, peer: Any) -> None:
    target = tmp_path / "written.txt"
    await client.call("fs/open", {"handleId": "w1", "path": target.as_uri(), "mode": "replace"})
    for offset, piece in ((0, b"hello "), (6, b"blocks")):
        await client.call("fs/writeBlock", {"handleId": "w1", "offset": offset,
                                            "chunk": base64.b64encode(piece).decode()})
    await client.call("fs/close", {"handleId": "w1"})
    assert target.read_bytes() == b"hello blocks"


#: wire flag name -> a check that the feature behind it works.
CHECKS: dict[str, Callable[[Any, Path, Any], Awaitable[None]]] = {
    "environmentConfigRead": _check_environment_config_read,
    "httpHeaderEnvVars": _check_http_header_env_vars,
    "sandboxedFileStreaming": _check_sandboxed_file_streaming,
    "fileWriteStreaming": _check_file_write_streaming,
}


@pytest.fixture
def host_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, http_peer: Any) -> Path:
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(
        f'model = "m"\n[mcp_servers.docs]\nurl = "{http_peer.base}/mcp"\n'
    )
    monkeypatch.setenv("CODEX_HOME", str(home))
    monkeypatch.setenv("E29_CAP_TOKEN", "cap-token")
    return home


async def test_every_advertised_flag_is_served(
    inprocess_server: Callable[..., Any], host_config: Path, tmp_path: Path, http_peer: Any
) -> None:
    client = await inprocess_server(sandboxed=True).connect()
    result = await client.call("initialize", {"clientName": "t"})
    await client.notify("initialized", {})
    capabilities = result["environmentInfo"]["capabilities"]
    advertised = {flag for flag, value in capabilities.items() if value}
    assert advertised, capabilities
    assert advertised <= set(CHECKS), f"a flag without a check: {advertised - set(CHECKS)}"
    for flag in sorted(advertised):
        await CHECKS[flag](client, tmp_path, http_peer)


async def test_unbuilt_features_stay_false(inprocess_server: Callable[..., Any]) -> None:
    client = await inprocess_server().connect()
    info = (await client.call("initialize", {"clientName": "t"}))["environmentInfo"]
    for flag in NOT_BUILT:
        assert info["capabilities"].get(flag, False) is False, flag
    await client.notify("initialized", {})
    assert await client.call("environment/info", {}) == info


async def test_environment_info_fields(inprocess_server: Callable[..., Any]) -> None:
    client = await inprocess_server().connect()
    info = (await client.call("initialize", {"clientName": "t"}))["environmentInfo"]
    assert info["executorVersion"] == exec_server.__version__
    assert info["prependPathDirs"] == []
    provider = info["providerId"]
    assert provider.startswith("sha256:") and len(provider) == len("sha256:") + 64
    # the same build gives the same id (a second server in this process)
    other = await inprocess_server().connect()
    assert (await other.call("initialize", {"clientName": "t"}))["environmentInfo"][
        "providerId"
    ] == provider


def test_a_flag_needs_all_its_methods() -> None:
    assert advertised_capabilities([]) == EnvironmentCapabilities()
    served = build_router().methods
    caps = msgspec.to_builtins(advertised_capabilities(served))
    assert caps == {
        "environmentConfigRead": True,
        "httpHeaderEnvVars": True,
        "sandboxedFileStreaming": True,
        "fileWriteStreaming": True,
    }
    # take one method away: its flag goes
    for flag, methods in REQUIRED_METHODS.items():
        partial = [m for m in served if m != methods[0]]
        assert getattr(advertised_capabilities(partial), flag) is False
