"""exec-server: run processes and filesystem operations for coding agents, sandboxed."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
