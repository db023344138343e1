"""``environmentConfig/read``: the host's config layers cut to the selected keys
(PROTOCOL_CURRENT.md §10)."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from exec_server.hostconfig import read_host_config, select_keys

_CONFIG = """\
model = "gpt-x"
[mcp_servers.docs]
url = "http://127.0.0.1:9/mcp"
bearer_token_env_var = "DOCS_TOKEN"
[mcp_servers.docs.env_http_headers]
X = "Y"
[mcp_servers.local]
command = "foo"
args = ["a", 1, true]
[other]
a = 1
"""


@pytest.fixture
async def client(
    inprocess_server: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Any:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("CODEX_HOME", str(home))
    conn = await inprocess_server().connect()
    await conn.call("initialize", {"clientName": "t"})
    await conn.notify("initialized", {})
    conn.home = home
    return conn


def _params(cwd: Path, config: Any, requirements: Any = ()) -> dict[str, Any]:
    return {"cwd": cwd.as_uri(), "configPaths": list(config),
            "requirementsPaths": list(requirements)}


async def test_user_layer_holds_only_the_selected_keys(client: Any, tmp_path: Path) -> None:
    (client.home / "config.toml").write_text(_CONFIG)
    result = await client.call(
        "environmentConfig/read", _params(tmp_path, [["mcp_servers"]], [["mcp_servers"]])
    )
    assert result["codexHomeDir"] == client.home.as_uri()
    assert result["requirements"] == {"layers": [], "cloudInsertionIndex": 0}
    assert result["config"]["cloudInsertionIndex"] == 0
    (layer,) = result["config"]["layers"]
    path = client.home / "config.toml"
    assert layer["source"] == f"user ({path})"
    assert layer["baseDir"] == client.home.as_uri()
    full = tomllib.loads(_CONFIG)
    assert tomllib.loads(layer["toml"]) == {"mcp_servers": full["mcp_servers"]}


async def test_several_and_nested_paths(client: Any, tmp_path: Path) -> None:
    (client.home / "config.toml").write_text(_CONFIG)
    result = await client.call(
        "environmentConfig/read",
        _params(tmp_path, [["model"], ["mcp_servers", "docs"], ["absent"], ["model", "x"]]),
    )
    (layer,) = result["config"]["layers"]
    full = tomllib.loads(_CONFIG)
    assert tomllib.loads(layer["toml"]) == {
        "model": "gpt-x",
        "mcp_servers": {"docs": full["mcp_servers"]["docs"]},
    }


@pytest.mark.parametrize("text", [None, 'model = "only"\n'])
async def test_no_file_or_no_selected_key_gives_no_layer(
    client: Any, tmp_path: Path, text: str | None
) -> None:
    if text is not None:
        (client.home / "config.toml").write_text(text)
    result = await client.call("environmentConfig/read", _params(tmp_path, [["mcp_servers"]]))
    assert result["config"]["layers"] == []


async def test_invalid_toml_is_an_error(client: Any, tmp_path: Path) -> None:
    (client.home / "config.toml").write_text("[mcp_servers\n")
    reply = await client.request("environmentConfig/read", _params(tmp_path, [["mcp_servers"]]))
    assert reply["error"]["code"] == -32603
    assert reply["error"]["message"].startswith(
        f"failed to read config file {client.home / 'config.toml'}: "
    )


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"configPaths": [], "requirementsPaths": []},
         "at least one config or requirements path is required"),
        ({"configPaths": [[]], "requirementsPaths": []},
         "TOML paths must contain at least one key segment"),
        ({"configPaths": [["a"]]}, "missing field `requirementsPaths`"),
    ],
)
async def test_validation(client: Any, tmp_path: Path, params: Any, message: str) -> None:
    reply = await client.request("environmentConfig/read", {"cwd": tmp_path.as_uri(), **params})
    assert reply["error"] == {"code": -32602, "message": message}


async def test_before_initialize(inprocess_server: Callable[..., Any], tmp_path: Path) -> None:
    conn = await inprocess_server().connect()
    reply = await conn.request("environmentConfig/read", _params(tmp_path, [["mcp_servers"]]))
    assert reply["error"] == {
        "code": -32600,
        "message": "client must call initialize before using environment config methods",
    }


def test_system_layers_come_first(tmp_path: Path) -> None:
    system = tmp_path / "system.toml"
    system.write_text('[mcp_servers.sys]\nurl = "http://h/"\n')
    requirements = tmp_path / "requirements.toml"
    requirements.write_text('[mcp_servers.docs]\nenabled = false\n')
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text(_CONFIG)
    host = read_host_config(
        [["mcp_servers"]],
        [["mcp_servers"]],
        {"CODEX_HOME": str(home)},
        system_config=str(system),
        system_requirements=str(requirements),
    )
    assert [layer.source for layer in host.config] == [
        f"system ({system})",
        f"user ({home / 'config.toml'})",
    ]
    (req,) = host.requirements
    assert req.source == f"system ({requirements})"
    assert tomllib.loads(req.toml) == {"mcp_servers": {"docs": {"enabled": False}}}


def test_select_keys() -> None:
    doc = {"a": {"b": 1, "c": 2}, "d": [1]}
    assert select_keys(doc, [["a", "b"], ["d"], ["x"], ["d", "e"]]) == {"a": {"b": 1}, "d": [1]}
