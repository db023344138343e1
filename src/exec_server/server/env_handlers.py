"""``environmentInfo``, ``environment/info``, ``environment/status`` and
``environmentConfig/read`` for the current client (CLIENT_COMPAT.md §2-§3).

Only the current generation reads these, so every path is a ``file://`` URI
(except ``shell.path``, a plain native path). All capabilities are advertised
``false``: none of the optional features behind them is implemented, and
false is what makes the client fall back to the base protocol.
``environmentConfig/read`` validates like upstream and reports no config
layers (we do not read Codex config files), which is a valid, empty answer.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Final

import msgspec

from exec_server.exceptions import InvalidParamsError
from exec_server.protocol.messages import EnvironmentCapabilities, EnvironmentInfo, ShellInfo
from exec_server.protocol.paths import PathForm, parse_wire_path, render_path
from exec_server.server.router import RequestContext, Router

__all__ = [
    "EnvironmentConfigReadParams",
    "EnvironmentConfigReadResult",
    "EnvironmentStatusResult",
    "NoParams",
    "cached_environment_info",
    "environment_info",
    "register",
]

_SHELLS: Final = (("bash", "/bin/bash"), ("zsh", "/bin/zsh"), ("sh", "/bin/sh"))


class NoParams(msgspec.Struct, frozen=True):
    """Params of methods that take none (``{}`` or ``null``)."""


class EnvironmentStatusResult(msgspec.Struct, frozen=True):
    status: str = "ready"


class EnvironmentConfigReadParams(msgspec.Struct, frozen=True, rename="camel"):
    cwd: str
    config_paths: list[list[str]]
    requirements_paths: list[list[str]]


class ConfigLayer(msgspec.Struct, frozen=True, rename="camel"):
    source: str
    base_dir: str
    toml: str


class ConfigLayers(msgspec.Struct, frozen=True, rename="camel"):
    layers: list[ConfigLayer] = msgspec.field(default_factory=list)
    cloud_insertion_index: int = 0


class EnvironmentConfigReadResult(msgspec.Struct, frozen=True, rename="camel"):
    user_home_dir: str | None
    codex_home_dir: str
    hostname: str | None
    config: ConfigLayers
    requirements: ConfigLayers


def _uri(path: str) -> str:
    return render_path(os.path.abspath(path), PathForm.URI)


def _platform_os() -> str:
    """Rust's ``std::env::consts::OS`` spelling."""
    return "macos" if sys.platform == "darwin" else sys.platform.rstrip("0123456789")


def _shell() -> ShellInfo:
    for name, path in _SHELLS:
        if os.access(path, os.X_OK):
            return ShellInfo(name, path)
    return ShellInfo("sh", "/bin/sh")


def environment_info() -> EnvironmentInfo:
    """Describe this server's host for the current client (built per call: cheap)."""
    tmpdir = os.environ.get("TMPDIR")
    home = os.path.expanduser("~")
    return EnvironmentInfo(
        shell=_shell(),
        cwd=_uri(os.getcwd()),
        user_home_dir=_uri(home) if home.startswith("/") else None,
        platform_os=_platform_os(),
        temporary_directories=[_uri(tmpdir)] if tmpdir else [],
        temp_dir=_uri(tmpdir or "/tmp"),
        capabilities=EnvironmentCapabilities(),
    )


def cached_environment_info(ctx: RequestContext) -> EnvironmentInfo:
    """The host description, computed once per server (it does not change)."""
    services = ctx.services
    info = services.environment_info
    if info is None:
        info = services.environment_info = environment_info()
    return info


def handle_environment_info(ctx: RequestContext, params: NoParams | None) -> EnvironmentInfo:
    return cached_environment_info(ctx)


def handle_environment_status(
    ctx: RequestContext, params: NoParams | None
) -> EnvironmentStatusResult:
    return EnvironmentStatusResult()


def handle_environment_config_read(
    ctx: RequestContext, params: EnvironmentConfigReadParams
) -> EnvironmentConfigReadResult:
    parse_wire_path(params.cwd)
    if not params.config_paths and not params.requirements_paths:
        raise InvalidParamsError("at least one config or requirements path is required")
    for key_path in (*params.config_paths, *params.requirements_paths):
        if not key_path:
            raise InvalidParamsError("TOML paths must contain at least one key segment")
    return _empty_config()


def _empty_config() -> EnvironmentConfigReadResult:
    home = os.path.expanduser("~")
    codex_home = os.environ.get("CODEX_HOME") or os.path.join(home, ".codex")
    return EnvironmentConfigReadResult(
        user_home_dir=_uri(home) if home.startswith("/") else None,
        codex_home_dir=_uri(codex_home),
        hostname=socket.gethostname() or None,
        config=ConfigLayers(),
        requirements=ConfigLayers(),
    )


def register(router: Router) -> None:
    """Add the environment methods (ungated, like upstream's)."""
    router.add_now("environment/info", NoParams | None, handle_environment_info, None)
    router.add_now("environment/status", NoParams | None, handle_environment_status, None)
    router.add_now(
        "environmentConfig/read",
        EnvironmentConfigReadParams,
        handle_environment_config_read,
        None,
    )
