"""Server-wide services shared by every connection and session.

Built once by ``server/app.py`` from the :class:`ServerConfig`; handlers
reach it as ``ctx.services``. The sandbox manager and the sandboxed
filesystem belong to other areas; this object only owns their lifetime.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from exec_server.config import ServerConfig
from exec_server.protocol.messages import EnvironmentInfo
from exec_server.sandbox.manager import SandboxManager

# Interim: the sandboxed filesystem area has not landed yet; replaced by a
# plain import of ``exec_server.fs.sandboxed.SandboxedFileSystem`` once it exists.
SandboxedFileSystem = Any

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

    @classmethod
    def create(cls, config: ServerConfig) -> ServerServices:
        """Build the default services for ``config``."""
        sandbox = SandboxManager(config)
        try:
            fs_mod = importlib.import_module("exec_server.fs.sandboxed")
        except ImportError:
            return cls(config, sandbox)
        return cls(config, sandbox, fs_mod.SandboxedFileSystem(config, sandbox))

    async def aclose(self) -> None:
        """Release helpers (zygotes, probes) at server shutdown."""
        for service in (self.fs_sandbox, self.sandbox):
            if service is None:
                continue
            try:
                await service.aclose()
            except Exception:
                logger.exception("closing %r failed", service)
