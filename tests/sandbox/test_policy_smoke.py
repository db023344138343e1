"""Smoke tests: a legacy launch config decodes and plans (fuller tables live beside this)."""

from __future__ import annotations

import msgspec

from exec_server.protocol.types.sandbox import decode_launch_sandbox
from exec_server.sandbox.convert import Generation, launch_request
from exec_server.sandbox.policy import FsKind, Network


def test_legacy_no_sandbox_config_decodes() -> None:
    raw = msgspec.Raw(
        b'{"sandboxPreference":"forbid","policy":{"type":"danger-full-access"},'
        b'"fileSystemPolicy":{"kind":"unrestricted"},"networkPolicy":"enabled",'
        b'"sandboxPolicyCwd":"/srv/proj","additionalPermissions":null,'
        b'"enforceManagedNetwork":false,"windowsSandboxLevel":"disabled",'
        b'"windowsSandboxPrivateDesktop":false,"useLegacyLandlock":false}'
    )
    req = launch_request(decode_launch_sandbox(raw), command_cwd="/srv/proj")
    assert req.generation is Generation.LEGACY
    assert req.preference == "forbid"
    assert req.fs_policy.kind is FsKind.UNRESTRICTED
    assert req.network is Network.ENABLED
    assert not req.needs_platform_sandbox
