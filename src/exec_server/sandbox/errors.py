"""Errors the sandbox package raises (mapped to JSON-RPC in :mod:`exec_server.exceptions`)."""

from __future__ import annotations

from exec_server.exceptions import InternalError

__all__ = ["SandboxUnavailableError"]


class SandboxUnavailableError(InternalError):
    """No usable sandbox backend where one is required (fail closed)."""
