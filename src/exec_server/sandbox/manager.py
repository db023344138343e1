"""Select a sandbox (PROTOCOL.md §7.3) and confine a launch; unconfined only when the operator
allowed it (``allow_unsandboxed``) and the client did not ``require`` confinement."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import replace

from exec_server.config import ServerConfig
from exec_server.process.spec import LaunchSpec
from exec_server.protocol.types.sandbox import SandboxContext
from exec_server.sandbox.access import includes_platform_defaults
from exec_server.sandbox.convert import Generation, LaunchSandboxRequest, launch_request
from exec_server.sandbox.errors import SandboxError, SandboxLaunchError
from exec_server.sandbox.linux.base import LinuxBackend
from exec_server.sandbox.macos import seatbelt
from exec_server.sandbox.plan import SandboxPlan, SandboxType
from exec_server.sandbox.platform import PLATFORM_SANDBOX, platform_default_read_roots
from exec_server.sandbox.select import select_backend

__all__ = ["NETWORK_DISABLED_ENV", "SandboxLaunchError", "SandboxManager", "select_sandbox_type"]

logger = logging.getLogger("exec_server.sandbox")

#: PROTOCOL.md §7.5.
NETWORK_DISABLED_ENV = "CODEX_SANDBOX_NETWORK_DISABLED"


def select_sandbox_type(request: LaunchSandboxRequest, platform: SandboxType) -> SandboxType:
    """``select_initial`` (PROTOCOL.md §7.3) on the effective policies (``require`` without a
    platform sandbox gives ``none``: the manager refuses it)."""
    if request.generation is None:
        return SandboxType.NONE
    if request.forced_type is not None:
        return request.forced_type
    if request.preference == "forbid":
        return SandboxType.NONE
    if request.preference == "require":
        return platform
    return platform if request.needs_platform_sandbox else SandboxType.NONE


class SandboxManager:
    """Selects and applies the platform sandbox (``platform``, ``selector``: for tests)."""

    def __init__(self, config: ServerConfig, *, platform: SandboxType = PLATFORM_SANDBOX,
                 selector: Callable[..., LinuxBackend | None] = select_backend) -> None:
        self._config = config
        self._platform = platform
        self._selector = selector
        self._warmed = False

    @property
    def warmed(self) -> bool:
        return self._warmed

    async def warm(self) -> None:
        """Run the backend probes (50-100 ms, blocking) in a thread now, so no launch pays for
        them on the loop; a failing probe is reported per launch by :meth:`prepare`."""
        if self._warmed:
            return
        if self._platform is SandboxType.LINUX_SECCOMP:
            await asyncio.to_thread(self._probe)
        self._warmed = True

    def _probe(self) -> None:
        with contextlib.suppress(SandboxError, ImportError, ValueError, OSError):
            self._select_backend(required=False)

    async def aprepare(self, spec: LaunchSpec, sandbox: SandboxContext | None) -> LaunchSpec:
        """:meth:`prepare` for coroutines: probes still to do run in a thread."""
        await self.warm()
        return self.prepare(spec, sandbox)

    def prepare(self, spec: LaunchSpec, sandbox: SandboxContext | None) -> LaunchSpec:
        """A copy of ``spec`` confined per ``process/start.sandbox``; its ``sandbox_type`` says
        what was applied. SandboxPolicyError (-32602), SandboxLaunchError (-32603)."""
        request = launch_request(sandbox, command_cwd=spec.cwd, tmpdir=spec.env.get("TMPDIR"))
        return self.prepare_request(spec, request)

    def prepare_request(self, spec: LaunchSpec, request: LaunchSandboxRequest) -> LaunchSpec:
        selected = select_sandbox_type(request, self._platform)
        # §7.5: legacy servers mark a restricted network; the current client sets
        # the variable itself and upstream 0.163.0 adds nothing (CLIENT_COMPAT §4).
        legacy_off = request.generation is Generation.LEGACY and request.network_restricted
        out = _unconfined(spec, network_off=legacy_off)
        if selected is SandboxType.NONE:
            if request.generation is not None and request.preference == "require":
                raise SandboxLaunchError(
                    "sandboxPreference is `require` but this platform has no sandbox"
                )
            return out
        if selected is not self._platform:
            raise SandboxLaunchError(_unavailable_message(selected))
        with _as_launch_error():
            plan = request.plan(tmpdir=out.env.get("TMPDIR"),
                                platform_defaults=platform_default_read_roots(self._platform))
        required = request.preference == "require" or request.forced_type is not None
        return self._wrap(out, plan, required=required,
                          include_platform_defaults=includes_platform_defaults(request.fs_policy))

    def wrap_plan(self, spec: LaunchSpec, plan: SandboxPlan, *,
                  include_platform_defaults: bool = True) -> LaunchSpec:
        """Confine the sandboxed fs helper, which must never run unconfined (§10.4)."""
        if self._platform is SandboxType.NONE:
            raise SandboxLaunchError("this platform has no sandbox")
        return self._wrap(_unconfined(spec, network_off=not plan.network), plan, required=True,
                          include_platform_defaults=include_platform_defaults)

    def _wrap(self, spec: LaunchSpec, plan: SandboxPlan, *, required: bool,
              include_platform_defaults: bool) -> LaunchSpec:
        if self._platform is SandboxType.MACOS_SEATBELT:
            return seatbelt.wrap(spec, plan, include_platform_defaults=include_platform_defaults)
        if self._platform is not SandboxType.LINUX_SECCOMP:
            raise SandboxLaunchError(_unavailable_message(self._platform))
        with _as_launch_error():
            backend = self._select_backend(required=required)
        if backend is None:
            if not (self._config.allow_unsandboxed and not required):
                raise SandboxLaunchError("no usable Linux sandbox backend")
            logger.warning(
                "no usable Linux sandbox; running %r unconfined (allow_unsandboxed)", spec.argv[:1]
            )
            return spec
        with _as_launch_error():
            wrapped = backend.wrap(spec, plan)
        return replace(wrapped, sandbox_type=SandboxType.LINUX_SECCOMP)

    def _select_backend(self, *, required: bool) -> LinuxBackend | None:
        allow = self._config.allow_unsandboxed and not required
        return self._selector(self._config.sandbox_backend, allow_unsandboxed=allow)


@contextlib.contextmanager
def _as_launch_error() -> Iterator[None]:
    try:
        yield
    except SandboxError as exc:
        raise SandboxLaunchError(exc.message) from exc
    except (ImportError, ValueError, OSError) as exc:  # ValueError: an env execve cannot carry
        raise SandboxLaunchError(str(exc)) from exc


def _unconfined(spec: LaunchSpec, *, network_off: bool) -> LaunchSpec:
    """``spec`` marked unconfined; ``network_off``: ``CODEX_SANDBOX_NETWORK_DISABLED=1`` (§7.5)."""
    env = dict(spec.env)
    if network_off:
        env[NETWORK_DISABLED_ENV] = "1"
    return replace(spec, env=env, sandbox_type=SandboxType.NONE)


_UNAVAILABLE = {
    SandboxType.MACOS_SEATBELT: "seatbelt sandbox is only available on macOS",
    SandboxType.LINUX_SECCOMP: "linux-seccomp sandbox is only available on Linux",
}


def _unavailable_message(kind: SandboxType) -> str:
    return _UNAVAILABLE.get(kind, f"{kind.value} sandbox is not supported by this server")
