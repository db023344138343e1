"""Decoded ``fs/*`` sandbox contexts: route, server-side check, helper plan.

PROTOCOL.md §9.1 (routing), §10.1 (policies and cwd), §10.2-§10.3 (the
pre-check's access rule), §10.4 (the helper's confinement); CLIENT_COMPAT.md
§1.4-§1.6 and §6.5 for the current client's contexts.
"""

from __future__ import annotations

import os
import stat
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

import msgspec

from exec_server.exceptions import InternalError, InvalidParamsError, os_error_message
from exec_server.protocol import sandbox_types as wire
from exec_server.sandbox._decode import (
    LAUNCH_KEYS,
    Generation,
    current_scope,
    extra_permissions,
    legacy_policy_from_wire,
    object_keys,
    permissions_policy,
)
from exec_server.sandbox.access import (
    PROTECTED_NAMES_ALWAYS,
    ResolvedPolicy,
    has_full_disk_read,
    has_full_disk_write,
)
from exec_server.sandbox.plan import SandboxPlan
from exec_server.sandbox.platform import platform_default_read_roots
from exec_server.sandbox.policy import (
    Access,
    ExtraPermissions,
    FileSystemPolicy,
    FsEntry,
    FsKind,
    FsProbe,
    LegacyPolicy,
    Network,
    OsProbe,
    PolicyScope,
    ReadOnly,
    ReadOnlyAccess,
    SpecialKind,
    SpecialTarget,
    WorkspaceWrite,
    effective_fs_policy,
    effective_legacy_policy,
    fs_policy_from_legacy,
    helper_legacy_policy,
    legacy_network,
    normalize,
)

__all__ = [
    "FsRouteDecision",
    "FsSandboxRequest",
    "cached_fs_route",
    "fs_context_from_wire",
    "fs_route_from_wire",
    "root_alias_normalize",
]


def _symlink_preserving_canonical(path: str) -> str:
    parts = [p for p in path.split("/") if p]
    for i in range(2, len(parts) + 1):
        if os.path.islink("/" + "/".join(parts[:i])):
            return path
    return os.path.realpath(path)


class _Canonical:
    """"Resolve existing prefix" (PROTOCOL.md §10.3), memoised component by component.

    The rule check paths are computed with: the deepest existing ancestor is
    canonicalised (every symlink followed), missing components are re-appended
    lexically (a dangling symlink counts as missing). One instance serves one
    request, so a policy's entries, its protected subpaths and the candidate's
    directory share their prefixes: one ``lstat`` per new component, a full
    ``realpath`` only for components that are symlinks.
    """

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: dict[str, str] = {"/": "/"}

    def __call__(self, path: str) -> str:
        seen = self._seen
        found = seen.get(path)
        if found is not None:
            return found
        if not path.startswith("/"):
            return path
        names: list[str] = []
        lexical = path
        base = None
        while base is None:
            lexical, name = os.path.split(lexical)
            names.append(name)
            base = seen.get(lexical)
        missing = False
        for name in reversed(names):
            lexical = os.path.join(lexical, name)
            child = os.path.join(base, name)
            if not missing:
                try:
                    st = os.lstat(child)
                except OSError:
                    missing = True
                else:
                    if stat.S_ISLNK(st.st_mode):
                        if os.path.exists(child):
                            child = os.path.realpath(child)
                        else:
                            missing = True
            seen[lexical] = base = child
        return base


def root_alias_normalize(path: str) -> str:
    """Resolve top-level system aliases (``/var`` → ``/private/var``) only (PROTOCOL.md §10.1)."""
    current = path
    while True:
        if os.path.lexists(current):
            canonical = _symlink_preserving_canonical(current)
            if canonical != current:
                rest = path[len(current) :] if current != "/" else path[1:]
                return normalize(canonical + "/" + rest.lstrip("/"))
        if current == "/":
            return path
        current = os.path.dirname(current)


def _alias_access(access: ReadOnlyAccess) -> ReadOnlyAccess:
    if access.full:
        return access
    return replace(access, readable_roots=tuple(map(root_alias_normalize, access.readable_roots)))


def _alias_policy(policy: LegacyPolicy) -> LegacyPolicy:
    if isinstance(policy, ReadOnly):
        return replace(policy, access=_alias_access(policy.access))
    if isinstance(policy, WorkspaceWrite):
        return replace(
            policy,
            writable_roots=tuple(map(root_alias_normalize, policy.writable_roots)),
            read_only_access=_alias_access(policy.read_only_access),
        )
    return policy


def _with_minimal(policy: FileSystemPolicy) -> FileSystemPolicy:
    """Platform-default reads for the helper when reads are restricted (§10.1 step 3)."""
    if policy.kind is not FsKind.RESTRICTED or has_full_disk_read(policy):
        return policy
    minimal = FsEntry(SpecialTarget(SpecialKind.MINIMAL), Access.READ)
    if minimal in policy.entries:
        return policy
    return replace(policy, entries=(*policy.entries, minimal))


@dataclass(frozen=True)
class FsSandboxRequest:
    """A decoded ``fs/*`` sandbox context.

    Attributes:
        generation: who asked.
        direct: run the operation in the server (full access, external,
            disabled); otherwise it needs the confined helper.
        cwd: policy cwd (legacy: the server's canonical cwd, §10.1).
        roots: workspace roots.
        policy: request filesystem policy: the server-side pre-check (§10.2).
        network: the request's network policy (informational: the helper never
            gets network).
        helper_policy: filesystem policy of the helper (platform-default reads
            on, additional filesystem grants merged; network grants stripped).
        tmpdir: ``$TMPDIR`` used for ``tmpdir`` entries (the server's).
    """

    generation: Generation
    direct: bool
    cwd: str
    roots: tuple[str, ...]
    policy: FileSystemPolicy
    network: Network
    helper_policy: FileSystemPolicy
    tmpdir: str | None = None
    home: str | None = None
    legacy_policy: LegacyPolicy | None = None
    helper_legacy_policy: LegacyPolicy | None = None
    probe: FsProbe = field(default_factory=OsProbe, compare=False, repr=False)

    @property
    def scope(self) -> PolicyScope:
        return PolicyScope(cwd=self.cwd, roots=self.roots, tmpdir=self.tmpdir, home=self.home)

    @cached_property
    def resolved(self) -> ResolvedPolicy:
        """Request policy pinned to paths, protected subpaths included.

        Current-client contexts resolve further than §6.11 (docs/sandbox-policy.md,
        "Pre-check for current contexts"); legacy ones keep PROTOCOL.md §10.
        """
        if self.generation is Generation.CURRENT:
            return ResolvedPolicy(
                self.policy,
                self.scope,
                probe=self.probe,
                canonicalize=self._canonical,
                protect_names=PROTECTED_NAMES_ALWAYS,
                default_read_roots=platform_default_read_roots(),
            )
        return ResolvedPolicy(self.policy, self.scope, probe=self.probe)

    @cached_property
    def _canonical(self) -> Callable[[str], str]:
        """Canonicaliser shared by this request's pre-check and helper plan."""
        return _Canonical()

    def resolve_access(self, path: str) -> Access:
        """§6.11 for ``path`` (relative joins ``cwd``) with protected subpaths read-only."""
        return self.resolved.resolve_access(path)

    def can_read(self, path: str) -> bool:
        return self.resolve_access(path) is not Access.NONE

    def can_write(self, path: str) -> bool:
        return self.resolve_access(path) is Access.WRITE

    def copy_conflict(self, source: str, destination: str) -> str | None:
        """The first path a recursive ``fs/copy`` would write that the pre-check refuses.

        ``fs/copy`` of a directory merges its entries into ``destination``: it
        writes ``destination/<rel>`` for every ``<rel>`` in the source tree. Only
        rules strictly below ``destination`` (read-only holes such as a missing
        ``.git`` of a writable root, ``none`` entries) can be hit, so each is
        looked up in the source (``lstat``-cheap, no walk). Both arguments are
        check paths (PROTOCOL.md §10.3). Returns None when nothing conflicts;
        the caller refuses the copy with ``NOT_PERMITTED`` for the returned path
        before anything is written.
        """
        for hole, rel in self.resolved.holes_below(destination):
            if os.path.lexists(os.path.join(source, rel)):
                return hole
        return None

    def helper_plan(
        self,
        *,
        runtime_read_roots: Sequence[str] = (),
        platform_defaults: Sequence[str] | None = None,
    ) -> SandboxPlan:
        """The helper's :class:`SandboxPlan` (§10.4): network always off.

        Args:
            runtime_read_roots: what the helper's interpreter must read when
                reads are restricted (``sys.prefix``, the package directory…).
            platform_defaults: override the platform's default read roots.
        """
        defaults = platform_default_read_roots() if platform_defaults is None else platform_defaults
        if self.generation is Generation.CURRENT:
            # Same resolution as the pre-check: the confined child's guard then
            # also refuses creating a missing `.git` & co. under a writable root.
            resolved = ResolvedPolicy(
                self.helper_policy,
                self.scope,
                probe=self.probe,
                canonicalize=self._canonical,
                protect_names=PROTECTED_NAMES_ALWAYS,
            )
        else:
            resolved = ResolvedPolicy(self.helper_policy, self.scope, probe=self.probe)
        return resolved.plan(
            Network.RESTRICTED,
            platform_defaults=defaults,
            extra_read_roots=runtime_read_roots,
            probe=self.probe,
        )


class _RequestCache:
    """Bounded LRU of decoded current-client contexts, keyed by the exact raw bytes.

    Codex sends the identical context on every fs call. Only the pure part is
    cached: decoding, validation and the wire → model conversion of a
    ``permissions`` context depend on nothing but the bytes, the server's
    canonical cwd and ``$TMPDIR`` (all in the key). Everything that depends on
    the filesystem (protected subpaths, deny-glob expansion, check paths, the
    helper plan) lives in :attr:`FsSandboxRequest.resolved` / ``helper_plan``,
    so a hit returns a *fresh copy* whose lazily resolved policy is
    recomputed per request: a ``.git`` created between two calls is protected
    on the second. Legacy contexts are not cached (their conversion probes
    the filesystem: root aliases, existing roots).
    """

    def __init__(self, maxsize: int) -> None:
        self._maxsize = maxsize
        self._items: OrderedDict[tuple[bytes, str, str | None], FsSandboxRequest] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[bytes, str, str | None]) -> FsSandboxRequest | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                return None
            self._items.move_to_end(key)
        # A new instance: ``resolved`` (filesystem-dependent) is never shared.
        return replace(hit)

    def put(self, key: tuple[bytes, str, str | None], request: FsSandboxRequest) -> None:
        pristine = replace(request)
        with self._lock:
            self._items[key] = pristine
            self._items.move_to_end(key)
            while len(self._items) > self._maxsize:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


_CURRENT_CACHE = _RequestCache(64)


#: (``getcwd()``, its ``realpath``) from the last call of :func:`_server_cwd`.
_last_cwd: tuple[str, str] | None = None


def _server_cwd() -> str:
    """The server's canonical cwd (PROTOCOL.md §10.1 step 1).

    ``realpath`` (an ``lstat`` per component, ~30 µs) runs only when
    ``getcwd()`` changes: the kernel's ``getcwd`` names the directory itself,
    so the same text resolves the same way (fs calls with a context pay for
    this on every call).
    """
    global _last_cwd
    try:
        cwd = os.getcwd()
        last = _last_cwd
        if last is not None and last[0] == cwd:
            return last[1]
        real = os.path.realpath(cwd)
    except OSError as exc:
        raise InternalError(f"failed to read current dir: {os_error_message(exc)}") from exc
    _last_cwd = (cwd, real)
    return real


def fs_context_from_wire(
    raw: msgspec.Raw | None,
    *,
    server_cwd: str | None = None,
    tmpdir: str | None = None,
    probe: FsProbe | None = None,
) -> FsSandboxRequest | None:
    """Decode ``fs/*.sandbox``; None when absent or ``null`` (direct route).

    Args:
        raw: the raw member.
        server_cwd: the server's canonical cwd (default: ``realpath(getcwd())``).
        tmpdir: ``$TMPDIR`` that ``tmpdir`` entries mean (default: the server's).
        probe: filesystem probe (tests).

    Raises:
        InvalidParamsError: malformed object; the message names the field.
    """
    if raw is None:
        return None
    cwd = server_cwd if server_cwd is not None else _server_cwd()
    tmp = tmpdir if tmpdir is not None else os.environ.get("TMPDIR")
    key = (bytes(raw), cwd, tmp) if probe is None else None
    if key is not None:
        cached = _CURRENT_CACHE.get(key)
        if cached is not None:
            return cached
    keys = object_keys(raw, "sandbox")
    if keys is None:
        return None
    if "permissions" in keys:
        request = _current_fs_request(
            wire.decode_sandbox(raw, wire.CurrentSandboxContext), cwd, tmp, probe or OsProbe()
        )
        if key is not None:
            _CURRENT_CACHE.put(key, request)
        return request
    probe = probe or OsProbe()
    if "sandboxPolicy" in keys:
        ctx = wire.decode_sandbox(raw, wire.FileSystemSandboxContext)
        policy, extra = ctx.sandbox_policy, extra_permissions(ctx.additional_permissions)
    elif LAUNCH_KEYS & keys.keys():
        launch = wire.decode_sandbox(raw, wire.SandboxLaunchConfig)
        policy, extra = launch.policy, extra_permissions(launch.additional_permissions)
    else:
        raise InvalidParamsError("sandbox: missing field `permissions`")
    return _legacy_fs_request(legacy_policy_from_wire(policy), extra, cwd, tmp, probe)


@dataclass(frozen=True, slots=True)
class FsRouteDecision:
    """Where one ``fs/*`` call runs (duck-compatible with ``fs.service.FsRoute``).

    Attributes:
        confined: the call needs the sandboxed helper.
        context: the decoded :class:`FsSandboxRequest` (None when absent).
    """

    confined: bool
    context: FsSandboxRequest | None = None


def fs_route_from_wire(raw: bytes | msgspec.Raw | None) -> FsRouteDecision:
    """Route of an ``fs/*`` call from its raw ``sandbox`` member (PROTOCOL.md §9.1).

    Direct for absent/``null``, full access, external and disabled contexts;
    confined otherwise, carrying the decoded request.

    Raises:
        InvalidParamsError: malformed context; the message names the field.
    """
    request = fs_context_from_wire(None if raw is None else msgspec.Raw(raw))
    if request is None:
        return FsRouteDecision(confined=False)
    return FsRouteDecision(confined=not request.direct, context=request)


def cached_fs_route(raw: bytes) -> FsRouteDecision | None:
    """:func:`fs_route_from_wire` for a current-client context decoded before, else None.

    Never decodes: a cache hit only (a fresh copy, see :class:`_RequestCache`),
    so a caller that must not do expensive work (a request answered on
    arrival) can ask first and leave anything else to the full path.
    """
    request = _CURRENT_CACHE.get((raw, _server_cwd(), os.environ.get("TMPDIR")))
    if request is None:
        return None
    return FsRouteDecision(confined=not request.direct, context=request)


def _legacy_fs_request(
    base: LegacyPolicy,
    extra: ExtraPermissions | None,
    cwd: str,
    tmpdir: str | None,
    probe: FsProbe,
) -> FsSandboxRequest:
    """PROTOCOL.md §10.1 for a legacy ``sandboxPolicy``."""
    direct = not isinstance(base, ReadOnly | WorkspaceWrite)
    request = _alias_policy(base)
    helper = _alias_policy(helper_legacy_policy(base))
    scope = PolicyScope.legacy(cwd, tmpdir)
    request_fs = fs_policy_from_legacy(request, scope, probe)
    # Helper grants: the context's filesystem grants, network stripped (§10.4 step 1).
    helper_extra = (
        ExtraPermissions(read=extra.read, write=extra.write) if extra is not None else None
    )
    helper_fs = effective_fs_policy(fs_policy_from_legacy(helper, scope, probe), helper_extra)
    return FsSandboxRequest(
        Generation.LEGACY,
        direct,
        cwd,
        (cwd,),
        request_fs,
        legacy_network(request),
        helper_fs,
        tmpdir=tmpdir,
        legacy_policy=request,
        helper_legacy_policy=effective_legacy_policy(helper, helper_extra),
        probe=probe,
    )


def _current_fs_request(
    ctx: wire.CurrentSandboxContext, server_cwd: str, tmpdir: str | None, probe: FsProbe
) -> FsSandboxRequest:
    fs, network = permissions_policy(ctx.permissions)
    cwd, roots = current_scope(ctx, server_cwd)
    direct = fs.kind is not FsKind.RESTRICTED or has_full_disk_write(fs)
    return FsSandboxRequest(
        Generation.CURRENT,
        direct,
        cwd,
        roots,
        fs,
        network,
        _with_minimal(fs),
        tmpdir=tmpdir,
        home=str(ctx.user_home_dir) if ctx.user_home_dir is not None else None,
        probe=probe,
    )
