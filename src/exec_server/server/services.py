"""Server-wide services shared by every connection and session (``ctx.services``);
this object owns their lifetime."""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import TYPE_CHECKING

from exec_server.config import ServerConfig
from exec_server.fs.confined import SandboxedFileSystem
from exec_server.fs.service import FileSystemService
from exec_server.protocol.messages import EnvironmentCapabilities, EnvironmentInfo
from exec_server.sandbox.manager import SandboxManager

if TYPE_CHECKING:
    from exec_server.http.client import HttpClient

__all__ = ["ServerServices"]

logger = logging.getLogger("exec_server.server")


class ServerServices:
    """Config plus the long-lived helpers handlers need (the later ones made on first use)."""

    def __init__(
        self, config: ServerConfig, sandbox: SandboxManager | None = None,
        fs_sandbox: SandboxedFileSystem | None = None,
    ) -> None:
        self.config = config
        self.sandbox = sandbox
        self.fs_sandbox = fs_sandbox
        self.environment_info: EnvironmentInfo | None = None
        #: set by the server from its router's methods (``server/capabilities.py``).
        self.capabilities = EnvironmentCapabilities()
        self.http: HttpClient | None = None
        self._warming: asyncio.Task[None] | None = None

    @functools.cached_property
    def fs_service(self) -> FileSystemService:
        """The ``fs/*`` handlers' service over ``fs_sandbox``, made on first use."""
        return FileSystemService(self.fs_sandbox)

    @classmethod
    def create(cls, config: ServerConfig) -> ServerServices:
        sandbox = SandboxManager(config)
        return cls(config, sandbox, SandboxedFileSystem(config, sandbox))

    def start_warming(self) -> None:
        """Probe the sandbox backends now (50-100 ms), not on the first sandboxed launch."""
        if self.sandbox is not None and self._warming is None:
            self._warming = asyncio.create_task(self.sandbox.warm(), name="sandbox-warm")

    async def aclose(self) -> None:
        if self._warming is not None:
            self._warming.cancel()
            await asyncio.gather(self._warming, return_exceptions=True)
        for service in (self.http, self.fs_sandbox):
            if service is None:
                continue
            try:
                await service.aclose()
            except Exception:
                logger.exception("closing %r failed", service)
