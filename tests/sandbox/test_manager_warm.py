"""SandboxManager.warm / aprepare: the backend probes run off the event loop, once."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from typing import Any

import msgspec
import pytest

from exec_server.config import ServerConfig
from exec_server.process.spec import LaunchSpec
from exec_server.protocol.types.sandbox import decode_launch_sandbox
from exec_server.sandbox.errors import SandboxUnavailableError
from exec_server.sandbox.manager import SandboxLaunchError, SandboxManager
from exec_server.sandbox.plan import SandboxPlan, SandboxType

# A legacy request that needs the platform sandbox (network restricted).
NEEDS_SANDBOX = msgspec.Raw(
    json.dumps(
        {
            "sandboxPreference": "auto",
            "policy": {"type": "danger-full-access"},
            "fileSystemPolicy": {"kind": "unrestricted"},
            "networkPolicy": "restricted",
            "sandboxPolicyCwd": "/srv/proj",
            "additionalPermissions": None,
            "enforceManagedNetwork": False,
            "windowsSandboxLevel": "disabled",
            "windowsSandboxPrivateDesktop": False,
            "useLegacyLandlock": False,
        }
    ).encode()
)


class Backend:
    name = "fake"

    def wrap(self, spec: LaunchSpec, plan: SandboxPlan) -> LaunchSpec:
        return replace(spec, argv=["/fake/wrapper", "--", *spec.argv])


class RecordingSelector:
    """Records the thread of every selection (the real one probes on its first call)."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.threads: list[threading.Thread] = []

    def __call__(self, backend: str = "auto", *, allow_unsandboxed: bool = False) -> Any:
        self.threads.append(threading.current_thread())
        if self.error is not None:
            raise self.error
        return Backend()


def spec() -> LaunchSpec:
    return LaunchSpec(argv=["/bin/true"], cwd="/srv/proj", env={})


def manager(
    selector: RecordingSelector, platform: SandboxType = SandboxType.LINUX_SECCOMP
) -> SandboxManager:
    return SandboxManager(ServerConfig(), platform=platform, selector=selector)


async def test_warm_probes_in_a_worker_thread_once() -> None:
    selector = RecordingSelector()
    mgr = manager(selector)
    assert not mgr.warmed
    await mgr.warm()
    await mgr.warm()
    assert mgr.warmed
    assert len(selector.threads) == 1
    assert selector.threads[0] is not threading.current_thread()


async def test_warm_on_a_platform_without_linux_backends_selects_nothing() -> None:
    selector = RecordingSelector()
    mgr = manager(selector, platform=SandboxType.NONE)
    await mgr.warm()
    assert mgr.warmed and selector.threads == []


async def test_warm_swallows_probe_failure_and_prepare_still_fails_closed() -> None:
    error = SandboxUnavailableError("no usable Linux sandbox (auto): nothing works")
    selector = RecordingSelector(error)
    mgr = manager(selector)
    await mgr.warm()
    assert mgr.warmed
    with pytest.raises(SandboxLaunchError, match="nothing works"):
        mgr.prepare(spec(), decode_launch_sandbox(NEEDS_SANDBOX))


async def test_aprepare_probes_off_the_loop_before_preparing() -> None:
    selector = RecordingSelector()
    mgr = manager(selector)
    out = await mgr.aprepare(spec(), decode_launch_sandbox(NEEDS_SANDBOX))
    assert out.argv == ["/fake/wrapper", "--", "/bin/true"]
    assert out.sandbox_type is SandboxType.LINUX_SECCOMP
    # The first selection (the probing one) ran in a worker thread; the
    # launch's own selection then hits the cache on the loop.
    assert selector.threads[0] is not threading.current_thread()
    assert len(selector.threads) == 2
    assert mgr.warmed

