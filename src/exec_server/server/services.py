"""Server-wide services shared by every connection and session.

Built once by ``server/app.py`` from the :class:`ServerConfig`; handlers
reach it as ``ctx.services``. The sandbox manager and the sandboxed
filesystem belong to other areas; this object only owns their lifetime.
"""

from __future__ import annotations

import asyncio
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
    """Config plus the long-lived helpers handlers need.

    Attributes:
        config: the server's frozen configuration.
        sandbox: selects and applies the platform sandbox for launches.
        fs_sandbox: runs filesystem operations inside the sandboxed helper.
    """

    def __init__(
        self,
        config: ServerConfig,
        sandbox: SandboxManager | None = None,
        fs_sandbox: SandboxedFileSystem | None = None,
    ) -> None:
        self.config = config
        self.sandbox = sandbox
        self.fs_sandbox = fs_sandbox
        #: cached ``environmentInfo`` (built on first ``initialize``).
        self.environment_info: EnvironmentInfo | None = None
        #: the ``fs/*`` handlers' service over ``fs_sandbox`` (built on first use).
        self.fs_service: FileSystemService | None = None
        #: what ``environmentInfo.capabilities`` advertises: set by the server
        #: from the methods its router serves (``server/capabilities.py``).
        self.capabilities = EnvironmentCapabilities()
        #: sends ``http/request`` requests (made on first use: httpx loads lazily).
        self.http: HttpClient | None = None
        self._warming: asyncio.Task[None] | None = None

    @classmethod
    def create(cls, config: ServerConfig) -> ServerServices:
        """Build the default services for ``config``."""
        sandbox = SandboxManager(config)
        return cls(config, sandbox, SandboxedFileSystem(config, sandbox))

    def start_warming(self) -> None:
        """Probe the sandbox backends in the background right after start-up.

        The probes spawn children and take 50-100 ms; doing them now keeps the
        first sandboxed launch from paying for them (``aprepare`` would
        otherwise run them on first use).
        """
        if self.sandbox is not None and self._warming is None:
            self._warming = asyncio.create_task(self.sandbox.warm(), name="sandbox-warm")

    async def aclose(self) -> None:
        """Release helpers (zygotes, probes) at server shutdown."""
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
