"""Sandbox errors (``message``: the client's text); ``exceptions.from_domain_error`` maps
policy errors to -32602, the rest to -32603."""

from __future__ import annotations

__all__ = ["SandboxError", "SandboxLaunchError", "SandboxPolicyError", "SandboxUnavailableError"]


class SandboxError(Exception):

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class SandboxPolicyError(SandboxError):
    """A policy value the wire structs cannot refuse; the message names the field."""


class SandboxLaunchError(SandboxError):

    def __init__(self, reason: str) -> None:
        super().__init__(f"failed to build sandbox launch: {reason}")


class SandboxUnavailableError(SandboxError):
    """No usable sandbox backend where one is required (fail closed)."""
