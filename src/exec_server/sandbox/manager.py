"""Sandbox manager: select a sandbox and turn a launch into a confined launch.

``process/start`` calls :meth:`SandboxManager.prepare` (or, from a coroutine,
:meth:`SandboxManager.aprepare`) with the request's ``LaunchSpec`` and its
decoded ``sandbox`` member. The manager converts the policy,
selects the sandbox type (PROTOCOL.md §7.3, on the *effective* policies),
resolves a :class:`SandboxPlan` and hands it to the platform mechanism
(Linux backend from :mod:`exec_server.sandbox.select`, or Seatbelt). It never
falls back to running unconfined unless the operator allowed it
(``ServerConfig.allow_unsandboxed``) and the client did not ``require`` it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import replace
from typing import Protocol

from exec_server.config import ServerConfig
from exec_server.exceptions import ExecServerError
from exec_server.process.spec import LaunchSpec
from exec_server.protocol.types.sandbox import SandboxContext
from exec_server.sandbox.convert import Generation, LaunchSandboxRequest, launch_request
from exec_server.sandbox.errors import SandboxError, SandboxLaunchError
from exec_server.sandbox.macos import seatbelt
from exec_server.sandbox.plan import SandboxPlan, SandboxType
from exec_server.sandbox.platform import PLATFORM_SANDBOX, platform_default_read_roots
from exec_server.sandbox.select import select_backend

__all__ = [
    "NETWORK_DISABLED_ENV",
    "SANDBOX_ENV",
    "SandboxLaunchError",
    "SandboxManager",
    "select_sandbox_type",
]

logger = logging.getLogger("exec_server.sandbox")

#: PROTOCOL.md §7.5.
NETWORK_DISABLED_ENV = "CODEX_SANDBOX_NETWORK_DISABLED"
SANDBOX_ENV = "CODEX_SANDBOX"


class _Backend(Protocol):
    name: str

    def wrap(self, spec: LaunchSpec, plan: SandboxPlan) -> LaunchSpec: ...


class _Selector(Protocol):
    def __call__(self, backend: str = ..., *, allow_unsandboxed: bool = ...) -> _Backend | None: ...


def select_sandbox_type(request: LaunchSandboxRequest, platform: SandboxType) -> SandboxType:
    """``select_initial`` (PROTOCOL.md §7.3) on the effective policies.

    ``require`` on a platform without a sandbox returns ``none`` here; the
    manager turns that into an error (never silently unconfined).
    """
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
    """Selects and applies the platform sandbox for launches.

    Args:
        config: server config (``sandbox_backend``, ``allow_unsandboxed``).
        platform: the platform sandbox (tests pretend to be another OS).
        selector: ``select_backend``-compatible callable (tests inject fakes).
    """

    def __init__(
        self,
        config: ServerConfig,
        *,
        platform: SandboxType = PLATFORM_SANDBOX,
        selector: _Selector = select_backend,
    ) -> None:
        self._config = config
        self._platform = platform
        self._selector = selector
        self._warmed = False

    @property
    def warmed(self) -> bool:
        """:meth:`warm` has run: selecting a backend no longer probes."""
        return self._warmed

    async def warm(self) -> None:
        """Run the backend probes now, in a thread, so no launch pays for them on the loop.

        The first backend selection probes the kernel and ``bwrap`` in child
        processes (50-100 ms, blocking) and caches the answer for the process.
        Call this once at server start; calling it again is free. A failing
        probe is not an error here: :meth:`prepare` reports it per launch.
        """
        if self._warmed:
            return
        if self._platform is SandboxType.LINUX_SECCOMP:
            await asyncio.to_thread(self._probe)
        self._warmed = True

    def _probe(self) -> None:
        with contextlib.suppress(ExecServerError, SandboxError, ImportError, ValueError, OSError):
            self._select_backend(required=False)

    async def aprepare(
        self,
        spec: LaunchSpec,
        sandbox: SandboxContext | None,
        *,
        enforce_managed_network: bool = False,
    ) -> LaunchSpec:
        """:meth:`prepare` for coroutines: the probes (if still to do) run in a thread."""
        await self.warm()
        return self.prepare(spec, sandbox, enforce_managed_network=enforce_managed_network)

    def prepare(
        self,
        spec: LaunchSpec,
        sandbox: SandboxContext | None,
        *,
        enforce_managed_network: bool = False,
    ) -> LaunchSpec:
        """Convert ``process/start.sandbox`` and return the launch to spawn.

        Cheap once :meth:`warm` has run; before that, the first sandboxed
        launch runs the backend probes here, blocking (use :meth:`aprepare`).

        Args:
            spec: the launch as requested (argv, cwd, final env, tty...).
            sandbox: the decoded ``sandbox`` member; None: no sandbox.
            enforce_managed_network: the current client's top-level flag.

        Returns:
            A new ``LaunchSpec`` (``spec`` is not modified) whose
            ``sandbox_type`` says what was applied; answer with
            ``.value`` (legacy ``sandbox``) or ``.camel`` (current ``sandboxType``).

        Raises:
            SandboxPolicyError: a sandbox value the structs cannot refuse (-32602).
            SandboxLaunchError: no way to confine it (-32603).
        """
        request = launch_request(
            sandbox,
            command_cwd=spec.cwd,
            enforce_managed_network=enforce_managed_network,
            tmpdir=spec.env.get("TMPDIR"),
        )
        return self.prepare_request(spec, request)

    def prepare_request(self, spec: LaunchSpec, request: LaunchSandboxRequest) -> LaunchSpec:
        """Confine ``spec`` per an already decoded request (also used by ``exec-server run``)."""
        selected = select_sandbox_type(request, self._platform)
        env = dict(spec.env)
        # §7.5: legacy servers mark a restricted network; the current client sets
        # the variable itself and upstream 0.163.0 adds nothing (CLIENT_COMPAT §4).
        if request.generation is Generation.LEGACY and request.network_restricted:
            env[NETWORK_DISABLED_ENV] = "1"
        out = replace(spec, env=env, sandbox_type=SandboxType.NONE)
        if selected is SandboxType.NONE:
            if request.generation is not None and request.preference == "require":
                raise SandboxLaunchError(
                    "sandboxPreference is `require` but this platform has no sandbox"
                )
            return out
        if selected is not self._platform:
            raise SandboxLaunchError(_unavailable_message(selected))
        try:
            plan = request.plan(
                tmpdir=out.env.get("TMPDIR"),
                platform_defaults=platform_default_read_roots(self._platform),
            )
        except (ExecServerError, SandboxError) as exc:
            raise SandboxLaunchError(exc.message) from exc
        required = request.preference == "require" or request.forced_type is not None
        return self._wrap(
            out,
            plan,
            required=required,
            include_platform_defaults=request.include_platform_defaults,
        )

    def wrap_plan(
        self,
        spec: LaunchSpec,
        plan: SandboxPlan,
        *,
        include_platform_defaults: bool = True,
    ) -> LaunchSpec:
        """Confine ``spec`` under an explicit plan (the sandboxed fs helper).

        Always requires a working platform sandbox: the helper must never run
        unconfined. Adds ``CODEX_SANDBOX_NETWORK_DISABLED=1`` when the plan has
        no network (PROTOCOL.md §10.4 step 3).
        """
        env = dict(spec.env)
        if not plan.network:
            env[NETWORK_DISABLED_ENV] = "1"
        out = replace(spec, env=env, sandbox_type=SandboxType.NONE)
        if self._platform is SandboxType.NONE:
            raise SandboxLaunchError("this platform has no sandbox")
        return self._wrap(
            out, plan, required=True, include_platform_defaults=include_platform_defaults
        )

    def _wrap(
        self,
        spec: LaunchSpec,
        plan: SandboxPlan,
        *,
        required: bool,
        include_platform_defaults: bool,
    ) -> LaunchSpec:
        if self._platform is SandboxType.MACOS_SEATBELT:
            return seatbelt.wrap(spec, plan, include_platform_defaults=include_platform_defaults)
        if self._platform is not SandboxType.LINUX_SECCOMP:
            raise SandboxLaunchError(_unavailable_message(self._platform))
        allow = self._config.allow_unsandboxed and not required
        try:
            backend = self._select_backend(required=required)
        except (ExecServerError, SandboxError) as exc:
            raise SandboxLaunchError(exc.message) from exc
        except (ImportError, ValueError, OSError) as exc:
            raise SandboxLaunchError(str(exc)) from exc
        if backend is None:
            if not allow:
                raise SandboxLaunchError("no usable Linux sandbox backend")
            logger.warning(
                "no usable Linux sandbox; running %r unconfined (allow_unsandboxed)", spec.argv[:1]
            )
            return spec
        try:
            wrapped = backend.wrap(spec, plan)
        except (ExecServerError, SandboxError) as exc:
            raise SandboxLaunchError(exc.message) from exc
        except (OSError, ValueError) as exc:  # ValueError: an env execve cannot carry
            raise SandboxLaunchError(str(exc)) from exc
        return replace(wrapped, sandbox_type=SandboxType.LINUX_SECCOMP)

    def _select_backend(self, *, required: bool) -> _Backend | None:
        """The configured Linux backend (probing on first use, cached per process)."""
        allow = self._config.allow_unsandboxed and not required
        return self._selector(self._config.sandbox_backend, allow_unsandboxed=allow)

    async def aclose(self) -> None:
        """Nothing to release yet: probes are cached per process by the backends."""


def _unavailable_message(kind: SandboxType) -> str:
    if kind is SandboxType.MACOS_SEATBELT:
        return "seatbelt sandbox is only available on macOS"
    if kind is SandboxType.LINUX_SECCOMP:
        return "linux-seccomp sandbox is only available on Linux"
    return f"{kind.value} sandbox is not supported by this server"
