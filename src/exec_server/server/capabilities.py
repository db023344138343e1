"""The one place ``environmentInfo.capabilities`` is decided (PROTOCOL_CURRENT.md §3.3).

The client takes a true flag as a promise, so a flag is advertised only when its
router serves every method in :data:`REQUIRED_METHODS`; other flags stay false.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Final

from exec_server.protocol.messages import EnvironmentCapabilities

__all__ = ["REQUIRED_METHODS", "advertised_capabilities"]

#: capability attribute -> the methods that must be served for it to be true.
REQUIRED_METHODS: Final[Mapping[str, tuple[str, ...]]] = {
    # §10: real config layers of the executor host.
    "environment_config_read": ("environmentConfig/read",),
    # §9.6: header values from the executor's environment, deny list included.
    "http_header_env_vars": ("http/request",),
    # §4.6: fs/open honours sandbox contexts (confined in the fs helper).
    "sandboxed_file_streaming": ("fs/open", "fs/readBlock", "fs/close"),
    # §5: fs/open mode `replace` and fs/writeBlock.
    "file_write_streaming": ("fs/open", "fs/writeBlock", "fs/close"),
}


def advertised_capabilities(methods: Collection[str]) -> EnvironmentCapabilities:
    """The flags whose methods are all in ``methods`` (a router's method names)."""
    flags = {
        flag: True
        for flag, required in REQUIRED_METHODS.items()
        if all(method in methods for method in required)
    }
    return EnvironmentCapabilities(**flags)
