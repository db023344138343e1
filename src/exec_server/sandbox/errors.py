"""Errors the sandbox package raises: the client's text, no wire code.

``exceptions.from_domain_error`` assigns the codes: a policy value the wire
structs cannot refuse is -32602, anything else -32603.
"""

from __future__ import annotations

__all__ = ["SandboxError", "SandboxLaunchError", "SandboxPolicyError", "SandboxUnavailableError"]


class SandboxError(Exception):
    """Base of the sandbox package's errors; ``message`` is the text the client sees."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class SandboxPolicyError(SandboxError):
    """A policy value the wire structs cannot refuse (a subpath leaving its root…);
    the message names the field."""


class SandboxLaunchError(SandboxError):
    """The launch could not be confined: ``failed to build sandbox launch: <reason>``."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"failed to build sandbox launch: {reason}")
        self.reason = reason


class SandboxUnavailableError(SandboxError):
    """No usable sandbox backend where one is required (fail closed)."""
