"""``environmentInfo``, ``environment/info``, ``environment/status``, ``environmentConfig/read``
(CLIENT_COMPAT.md §2-§3, PROTOCOL_CURRENT.md §3, §10).

Only the current client reads these, so paths are ``file://`` URIs (``shell.path``
excepted); ``prependPathDirs`` is empty: the server prepends nothing to ``PATH``.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
import socket
import sys
from pathlib import Path
from typing import Final

import msgspec

from exec_server import __version__
from exec_server.exceptions import InvalidParamsError
from exec_server.hostconfig import ConfigLayer as HostConfigLayer
from exec_server.hostconfig import read_host_config
from exec_server.protocol.messages import EnvironmentCapabilities, EnvironmentInfo, ShellInfo
from exec_server.protocol.paths import PathForm, parse_wire_path, render_path
from exec_server.server.router import RequestContext, Router

__all__ = ["cached_environment_info", "environment_info", "provider_id", "register"]

_SHELLS: Final = (("bash", "/bin/bash"), ("zsh", "/bin/zsh"), ("sh", "/bin/sh"))


class NoParams(msgspec.Struct, frozen=True):
    pass


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


@functools.cache
def provider_id() -> str:
    """``sha256:<hex>`` over this package's source files: names the build, as upstream's
    digest of its binary."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes())
    return f"sha256:{digest.hexdigest()}"


def environment_info(capabilities: EnvironmentCapabilities) -> EnvironmentInfo:
    tmpdir = os.environ.get("TMPDIR")
    home = os.path.expanduser("~")
    shells = (ShellInfo(name, path) for name, path in _SHELLS if os.access(path, os.X_OK))
    # Rust's ``std::env::consts::OS`` spelling
    platform_os = "macos" if sys.platform == "darwin" else sys.platform.rstrip("0123456789")
    return EnvironmentInfo(
        shell=next(shells, ShellInfo("sh", "/bin/sh")),
        executor_version=__version__,
        provider_id=provider_id(),
        cwd=_uri(os.getcwd()),
        user_home_dir=_uri(home) if home.startswith("/") else None,
        platform_os=platform_os,
        temporary_directories=[_uri(tmpdir)] if tmpdir else [],
        temp_dir=_uri(tmpdir or "/tmp"),
        prepend_path_dirs=[],
        capabilities=capabilities,
    )


async def cached_environment_info(
    ctx: RequestContext, params: NoParams | None = None
) -> EnvironmentInfo:
    """Computed once per server, in a thread (it looks for the shell on disk)."""
    services = ctx.services
    info = services.environment_info
    if info is None:
        info = await asyncio.to_thread(environment_info, services.capabilities)
        services.environment_info = info
    return info


async def handle_environment_status(
    ctx: RequestContext, params: NoParams | None
) -> EnvironmentStatusResult:
    return EnvironmentStatusResult()


async def handle_environment_config_read(
    ctx: RequestContext, params: EnvironmentConfigReadParams
) -> EnvironmentConfigReadResult:
    parse_wire_path(params.cwd)
    if not params.config_paths and not params.requirements_paths:
        raise InvalidParamsError("at least one config or requirements path is required")
    for key_path in (*params.config_paths, *params.requirements_paths):
        if not key_path:
            raise InvalidParamsError("TOML paths must contain at least one key segment")
    host = await asyncio.to_thread(
        read_host_config, params.config_paths, params.requirements_paths, os.environ
    )
    home = os.environ.get("HOME") or os.path.expanduser("~")  # noqa: ASYNC240 (no I/O with HOME set)
    return EnvironmentConfigReadResult(
        user_home_dir=_uri(home) if home.startswith("/") else None,
        codex_home_dir=_uri(host.codex_home),
        hostname=socket.gethostname() or None,
        config=_wire_layers(host.config),
        requirements=_wire_layers(host.requirements),
    )


def _wire_layers(layers: list[HostConfigLayer]) -> ConfigLayers:
    return ConfigLayers(
        layers=[ConfigLayer(layer.source, _uri(layer.base_dir), layer.toml) for layer in layers]
    )


def register(router: Router) -> None:
    """Ungated, like upstream's."""
    router.add("environment/info", NoParams | None, cached_environment_info, None)
    router.add("environment/status", NoParams | None, handle_environment_status, None)
    router.add(
        "environmentConfig/read",
        EnvironmentConfigReadParams,
        handle_environment_config_read,
        "environment config",
    )
