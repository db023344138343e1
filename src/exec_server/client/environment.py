"""Where an agent's commands run: a remote exec-server or this machine (PROTOCOL.md §13).
:class:`EnvironmentManager` normalises the URL (§13.1) and lazily creates one shared
:class:`Environment`; only :meth:`EnvironmentManager.from_env` reads the environment."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, final

from exec_server.client._opening import AsyncClosing
from exec_server.client.backend import ExecBackend, LocalExecBackend, RemoteExecBackend
from exec_server.client.connection import ExecServerClient
from exec_server.client.errors import ClientClosedError
from exec_server.config import ServerConfig

if TYPE_CHECKING:
    from exec_server.client.fs import LocalFileSystem, RemoteFileSystem

__all__ = [
    "DISABLED_VALUE",
    "ENVIRONMENT_CLIENT_NAME",
    "TOKEN_ENV_VAR",
    "URL_ENV_VARS",
    "Environment",
    "EnvironmentManager",
    "RuntimePaths",
    "normalize_exec_server_url",
]

#: The first one set wins.
URL_ENV_VARS: Final = ("EXEC_SERVER_URL", "CODEX_EXEC_SERVER_URL")
#: the remote server's ``--ws-auth`` token (Codex 0.163 reads it from environments.toml).
TOKEN_ENV_VAR: Final = "EXEC_SERVER_TOKEN"
#: disables execution (case-insensitive).
DISABLED_VALUE: Final = "none"
#: PROTOCOL.md §13.2: the client name a remote environment announces.
ENVIRONMENT_CLIENT_NAME: Final = "codex-environment"


def normalize_exec_server_url(value: str | None) -> tuple[str | None, bool]:
    """§13.1 as ``(url, disabled)``: blank is local, ``none`` disabled, else remote."""
    if value is None:
        return None, False
    trimmed = value.strip()
    if not trimmed:
        return None, False
    if trimmed.lower() == DISABLED_VALUE:
        return None, True
    return trimmed, False


@dataclass(frozen=True, slots=True)
class RuntimePaths:
    """PROTOCOL.md §12.1: executables a local environment needs for sandboxed helpers."""

    self_exe: str
    linux_sandbox_exe: str | None = None

    def __post_init__(self) -> None:
        for path in (self.self_exe, self.linux_sandbox_exe):
            if path is not None and not os.path.isabs(path):
                raise ValueError("path must be absolute")


@final
class Environment(AsyncClosing):
    """One execution environment: an :class:`ExecBackend` plus its filesystem, which
    :meth:`aclose` closes. Build with :meth:`create`."""

    def __init__(
        self,
        backend: ExecBackend,
        *,
        url: str | None,
        runtime_paths: RuntimePaths | None = None,
        local_config: ServerConfig | None = None,
    ) -> None:
        self.exec_backend = backend
        self.url = url
        self.runtime_paths = runtime_paths
        self._local_config = local_config
        self._local_fs: LocalFileSystem | None = None
        self._closed = False

    @classmethod
    async def create(
        cls,
        url: str | None,
        *,
        runtime_paths: RuntimePaths | None = None,
        local_config: ServerConfig | None = None,
        token: str | None = None,
    ) -> Environment:
        """A remote environment for ``url`` (connects as ``codex-environment``), or a
        local one for None/blank; ``ValueError`` for ``none``."""
        normalized, disabled = normalize_exec_server_url(url)
        if disabled:
            raise ValueError("disabled mode does not create an Environment")
        if normalized is None:
            backend = LocalExecBackend(local_config)
            return cls(backend, url=None, runtime_paths=runtime_paths, local_config=local_config)
        client = await ExecServerClient.connect(
            normalized, token=token, client_name=ENVIRONMENT_CLIENT_NAME
        )
        return cls(RemoteExecBackend(client), url=normalized, runtime_paths=runtime_paths)

    @property
    def is_remote(self) -> bool:
        return self.url is not None

    @property
    def remote_client(self) -> ExecServerClient | None:
        backend = self.exec_backend
        return backend.client if isinstance(backend, RemoteExecBackend) else None

    def get_filesystem(self) -> LocalFileSystem | RemoteFileSystem:
        """``fs/*`` over the client, or locally one :meth:`LocalFileSystem.with_sandbox`
        the environment owns."""
        from exec_server.client.fs import LocalFileSystem, RemoteFileSystem

        client = self.remote_client
        if client is not None:
            return RemoteFileSystem(client)
        if self._closed:
            raise ClientClosedError("environment closed")
        if self._local_fs is None:
            self._local_fs = LocalFileSystem.with_sandbox(self._local_config)
        return self._local_fs

    async def aclose(self) -> None:
        self._closed = True
        local_fs, self._local_fs = self._local_fs, None
        try:
            if local_fs is not None:
                await local_fs.aclose()
        finally:
            await self.exec_backend.aclose()

    def __repr__(self) -> str:
        return f"<Environment {'remote ' + self.url if self.url else 'local'}>"


@final
class EnvironmentManager:
    """Chooses local, remote or disabled once; creates one shared :class:`Environment`."""

    def __init__(
        self,
        exec_server_url: str | None = None,
        *,
        runtime_paths: RuntimePaths | None = None,
        local_config: ServerConfig | None = None,
        token: str | None = None,
    ) -> None:
        #: the normalised remote URL (None when local or disabled)
        self.url, self.disabled = normalize_exec_server_url(exec_server_url)
        self._token = token
        self.runtime_paths = runtime_paths
        self._local_config = local_config
        self._current: Environment | None = None
        self._lock = asyncio.Lock()

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, runtime_paths: RuntimePaths | None = None
    ) -> EnvironmentManager:
        """From ``EXEC_SERVER_URL``, else ``CODEX_EXEC_SERVER_URL``, and the token from
        ``EXEC_SERVER_TOKEN``, in ``environ`` (default ``os.environ``)."""
        env = os.environ if environ is None else environ
        value = next((env[name] for name in URL_ENV_VARS if name in env), None)
        token = env.get(TOKEN_ENV_VAR, "").strip() or None
        return cls(value, runtime_paths=runtime_paths, token=token)

    @classmethod
    def from_environment(cls, environment: Environment | None) -> EnvironmentManager:
        """A manager with ``environment``'s URL and runtime paths; None -> disabled."""
        if environment is None:
            return cls(DISABLED_VALUE)
        return cls(environment.url, runtime_paths=environment.runtime_paths)

    @property
    def is_remote(self) -> bool:
        return self.url is not None

    async def current(self) -> Environment | None:
        """The shared environment (created on first call), or None when disabled."""
        if self.disabled:
            return None
        if self._current is None:
            async with self._lock:
                if self._current is None:
                    self._current = await Environment.create(
                        self.url,
                        runtime_paths=self.runtime_paths,
                        local_config=self._local_config,
                        token=self._token,
                    )
        return self._current

    async def aclose(self) -> None:
        if self._current is not None:
            env, self._current = self._current, None
            await env.aclose()

    def __repr__(self) -> str:
        mode = "disabled" if self.disabled else f"remote {self.url}" if self.url else "local"
        return f"<EnvironmentManager {mode}>"
