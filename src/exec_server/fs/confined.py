"""Sandboxed ``fs/*`` calls: server-side checks, then a kernel-confined helper.

Each call's paths are checked against the request's policy (PROTOCOL.md §10.2-§10.3)
and the operation runs in a helper confined with that request's plan: a zygote child
or the one-shot ``--codex-run-as-fs-helper`` (docs/sandboxed-fs.md).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import json
import logging
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Literal

import msgspec

from exec_server.config import ServerConfig
from exec_server.fs import direct as ops
from exec_server.fs.direct import Metadata
from exec_server.fs.errors import (
    FsError,
    FsFailedError,
    FsNotFoundError,
    FsRefusedError,
    fs_error_from_os,
)
from exec_server.fs.handles import Install, open_into
from exec_server.fs.handles import Mode as OpenMode
from exec_server.fs.helper.client import (
    HelperFailure,
    Zygote,
    ZygoteUnavailable,
    describe_wait_status,
    remove_temp,
    shared_zygote,
    write_temp,
)
from exec_server.fs.pool import shared_pool
from exec_server.fs.service import (
    NO_RUNTIME_PATHS,
    FsOperation,
    metadata_from_fields,
)
from exec_server.process.spec import LaunchSpec
from exec_server.sandbox.access import has_full_disk_read
from exec_server.sandbox.convert import FsSandboxRequest, Generation, root_alias_normalize
from exec_server.sandbox.errors import SandboxError
from exec_server.sandbox.manager import SandboxManager
from exec_server.sandbox.plan import SandboxPlan
from exec_server.sandbox.policy import Access

__all__ = ["SandboxedFileSystem", "check_path"]

logger = logging.getLogger("exec_server.fs.sandbox")

Mode = Literal["auto", "zygote", "helper"]

NOT_PERMITTED = "{} is not permitted by filesystem sandbox"
#: confined operations (one helper process each) allowed to run at once.
MAX_CONCURRENT = 64
BAD_MESSAGE = "failed to encode or decode fs sandbox helper message"
NEEDS_POLICY = "sandboxed filesystem operations require ReadOnly or WorkspaceWrite sandbox policy"
FS_HELPER_FLAG = "--codex-run-as-fs-helper"

_PRESERVE_OPS = frozenset({"fs/remove", "fs/copy"})
#: the codes ``helper.ops`` encodes its errors with (``exceptions.from_domain_error``).
_BY_CODE: dict[int, type[FsError]] = {
    -32004: FsNotFoundError,
    -32600: FsRefusedError,
    -32603: FsFailedError,
}


class _NoDescriptorPassing(Exception):
    """The one-shot helper cannot hand a descriptor back: open the check path here."""


@dataclass(frozen=True, slots=True)
class _Checked:
    path: str
    expect: str


def check_path(request: FsSandboxRequest, path: str, *, preserve: bool, write: bool) -> _Checked:
    """PROTOCOL.md §10.2-§10.3 for one path: the check path and its expected real parent;
    ``FsRefusedError`` when the policy refuses the access."""
    try:
        if preserve and os.path.islink(path):
            # The link itself is operated on; its directory must still be where
            # it is now when the helper opens it.
            checked = root_alias_normalize(path)
            expect = os.path.realpath(os.path.dirname(checked), strict=True)
        else:
            checked = ops.resolve_existing_prefix(path, strict=True)
            expect = os.path.dirname(checked)
    except OSError as exc:
        raise FsFailedError(fs_error_from_os(exc).message) from exc
    if not os.path.isabs(checked):
        raise FsRefusedError(f"resolved sandbox path is not absolute: {checked}")
    _require(request, checked, write=write)
    if expect != os.path.dirname(checked):
        # A preserved link whose directory is reached through a nested user
        # symlink really lives in ``expect``: that location must be allowed too
        # (stricter than §10.3, which leaves it to the platform sandbox).
        _require(request, os.path.join(expect, os.path.basename(checked)), write=write)
    return _Checked(checked, expect)


def _check_and_plan(
    op: FsOperation, request: FsSandboxRequest
) -> tuple[_Checked, _Checked | None, SandboxPlan]:
    """The check paths of ``op``'s source and destination and the helper's plan (one
    worker job: they look at the filesystem)."""
    src = check_path(request, op.path, preserve=op.method in _PRESERVE_OPS, write=op.writes)
    if op.no_follow:
        # The helper works on the path as spelled: both it and its resolution must be allowed.
        _require(request, op.path, write=op.writes)
    if op.method != "fs/copy" or op.destination is None:
        return src, None, request.helper_plan()
    dst = check_path(request, op.destination, preserve=False, write=True)
    # A tree copied in must not bring what the policy keeps read-only below the
    # destination (a `.git` planted in a writable root): refused before anything is written.
    conflict = request.copy_conflict(src.path, dst.path)
    if conflict is not None:
        raise FsRefusedError(NOT_PERMITTED.format(conflict))
    return src, dst, request.helper_plan()


def _require(request: FsSandboxRequest, path: str, *, write: bool) -> None:
    access = request.resolve_access(path)
    allowed = access is Access.WRITE if write else access is not Access.NONE
    if not allowed:
        raise FsRefusedError(NOT_PERMITTED.format(path))


def _runtime_read_roots() -> tuple[str, ...]:
    """What a fresh interpreter running the one-shot helper must be able to read."""
    import exec_server

    package_root = os.path.dirname(os.path.dirname(os.path.abspath(exec_server.__file__)))
    roots = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        os.path.dirname(os.path.realpath(sys.executable)),
        package_root,
        *(p for p in sys.path if p and os.path.isabs(p)),
    }
    return tuple(sorted(r for r in roots if os.path.exists(r)))


def _header(
    op: FsOperation,
    request: FsSandboxRequest,
    src: _Checked,
    dst: _Checked | None,
    plan: SandboxPlan,
) -> dict[str, object]:
    """The request both confinements run (``helper.ops.OpRequest.from_header``)."""
    header: dict[str, object] = {
        "op": op.method,
        "path": op.path if op.no_follow else src.path,
        "expect": src.expect,
        "recursive": op.recursive,
        "force": op.force,
        "plan": {
            "full_read": plan.full_read,
            "full_write": plan.full_write,
            "network": False,  # PROTOCOL.md §10.1 step 6: never for the helper
            "readable_roots": list(plan.readable_roots),
            "writable_roots": list(plan.writable_roots),
        },
        "writable": list(plan.writable_roots),
        "read_only": list(plan.read_only_subpaths),
        "denied": list(plan.denied_paths),
        "full_write": plan.full_write,
        "mode": op.mode,
    }
    if dst is not None:
        header["dest"] = dst.path
        header["dest_expect"] = dst.expect
    if op.method == "fs/open" or (
        op.method == "fs/readFile" and request.generation is Generation.CURRENT
    ):
        header["not_a_file"] = op.path
    if op.method == "fs/writeFile":
        header["tmp"] = os.urandom(6).hex()
    if op.walk is not None:
        # The walk's root as spelled: the child decides what it may see by real locations.
        w = op.walk
        header["walk"] = [op.path, w.max_depth, w.max_directories, w.max_entries,
                          w.follow_directory_symlinks, w.prune_hidden_directories]
    if op.no_follow:
        header["no_follow"] = True
    return header


class SandboxedFileSystem:
    """Runs ``fs/*`` operations under a request's sandbox policy; every method takes the
    decoded context (``sandbox.convert.FsSandboxRequest``) first. ``sandbox_manager`` wraps
    the one-shot helper (None: zygote only); ``mode``: ``auto`` (the zygote when Landlock
    works, else the one-shot helper), ``zygote`` or ``helper``."""

    def __init__(
        self,
        config: ServerConfig,
        sandbox_manager: SandboxManager | None = None,
        *,
        mode: Mode = "auto",
        zygote: Zygote | None = None,
    ) -> None:
        self._config = config
        self._manager = sandbox_manager
        self._mode: Mode = mode
        self._zygote = zygote if zygote is not None else shared_zygote()
        self._helpers: set[asyncio.subprocess.Process] = set()
        self._runtime_roots: tuple[str, ...] | None = None
        self._closed = False
        self._slots = asyncio.Semaphore(MAX_CONCURRENT)

    @property
    def zygote(self) -> Zygote:
        return self._zygote

    def __repr__(self) -> str:
        return f"<SandboxedFileSystem mode={self._mode} {self._zygote!r}>"

    async def aclose(self) -> None:
        """Kill and reap any one-shot helper; release the zygote (its last owner closes it)."""
        self._closed = True
        for proc in list(self._helpers):
            _kill_group(proc)
        for proc in list(self._helpers):
            await proc.wait()
        await self._zygote.release(self)

    def reads_directly(self, context: object) -> bool:
        """A read runs directly, as upstream's does, when that provably answers the same: the
        request policy (the pre-check) and the helper policy (the kernel's) read everything.
        The caller then runs it as the direct route does (one worker job)."""
        req = _request(context)
        if req.direct:
            return False
        return has_full_disk_read(req.policy) and has_full_disk_read(req.helper_policy)

    def reads_regular_only(self, context: object) -> bool:
        """Whether a direct ``fs/readFile`` under ``context`` refuses non-regular files."""
        return _request(context).generation is Generation.CURRENT

    async def get_metadata(self, context: object, path: str) -> Metadata:
        result, _ = await self.run(FsOperation("fs/getMetadata", path), context)
        meta = metadata_from_fields(result)
        # In a worker, as every look-up: the path may be on a hung mount.
        request = _request(context)
        if not meta.is_symlink and await shared_pool().run(_is_visible_link, request, path):
            meta = msgspec.structs.replace(meta, is_symlink=True)
        return meta

    async def open_handle(
        self, context: object, path: str, mode: OpenMode, install: Install
    ) -> None:
        """``fs/open`` (PROTOCOL_CURRENT §4.6): the confined child opens the file and
        passes the descriptor back; with the one-shot helper the check path is opened
        here, following no link."""
        try:
            result, _ = await self.run(FsOperation("fs/open", path, mode=mode), context)
        except _NoDescriptorPassing as exc:
            await shared_pool().run(open_into, install, exc.args[0], mode, no_follow=True)
            return
        fd = result.get("passed_fd")
        if not isinstance(fd, int) or isinstance(fd, bool):
            raise FsFailedError("unexpected fs sandbox helper response: no descriptor")
        install(fd)

    async def run(self, op: FsOperation, context: object) -> tuple[dict[str, object], bytes]:
        """Check ``op`` against the context and run it confined: the helper's result fields
        and raw payload; ``FsError`` for a denial, an fs error or a helper failure."""
        request = _request(context)
        if self._closed:
            raise FsFailedError("the filesystem sandbox is shut down")
        if request.direct:
            raise FsRefusedError(NEEDS_POLICY)
        if op.method == "fs/copy" and op.destination is None:
            raise FsRefusedError("fs/copy requires destinationPath")
        # In a worker: the checks look at the filesystem, which under a hung
        # network or FUSE mount would stall every connection.
        src, dst, plan = await shared_pool().run(_check_and_plan, op, request)
        header = _header(op, request, src, dst, plan)
        async with self._slots:
            if self._mode != "helper":
                try:
                    reply, payload = await self._zygote.run(
                        header, op.data, timeout=self._config.fs_helper_timeout, owner=self
                    )
                except HelperFailure as exc:
                    raise FsFailedError(str(exc)) from exc
                except ZygoteUnavailable as exc:
                    if self._mode == "zygote" or self._manager is None:
                        raise FsFailedError(f"failed to prepare fs sandbox: {exc}") from exc
                    logger.info("fs zygote unavailable (%s); using the one-shot helper", exc)
                    self._mode = "helper"
                else:
                    return _unpack(reply), payload
            if op.method == "fs/open":
                raise _NoDescriptorPassing(src.path)
            return await self._run_helper(op, request, header)

    async def _run_helper(
        self, op: FsOperation, request: FsSandboxRequest, header: dict[str, object]
    ) -> tuple[dict[str, object], bytes]:
        """``header`` in a one-shot helper process that the sandbox manager wraps with the
        request's plan plus what its interpreter must read."""
        if self._manager is None:
            raise FsRefusedError(NO_RUNTIME_PATHS)
        if self._runtime_roots is None:
            self._runtime_roots = await shared_pool().run(_runtime_read_roots)
        plan = await shared_pool().run(
            functools.partial(request.helper_plan, runtime_read_roots=self._runtime_roots)
        )
        spec = LaunchSpec(
            argv=[sys.executable, "-I", "-m", "exec_server", FS_HELPER_FLAG],
            # PROTOCOL.md §10.1: the helper runs in the server's canonical cwd.
            cwd=await shared_pool().run(lambda: os.path.realpath(os.getcwd())),
            env={},
        )
        await self._manager.warm()  # first use: backend probes off the loop
        try:
            wrapped = self._manager.wrap_plan(spec, plan)
        except SandboxError as exc:
            raise FsRefusedError(f"failed to prepare fs sandbox: {exc.message}") from exc
        if not wrapped.argv:
            raise FsRefusedError("fs sandbox command was empty")
        status = -1
        try:
            stdout, stderr, status = await self._spawn(wrapped, _helper_request(op, header))
        finally:
            if wrapped.cleanup is not None:
                with contextlib.suppress(OSError):
                    wrapped.cleanup()
            temp = write_temp(header)
            if temp is not None and status != 0:
                # Killed (timeout, cancelled caller) or crashed: no temp file left.
                await remove_temp(*temp)
        if status != 0:
            raise FsFailedError(
                f"fs sandbox helper failed with status {describe_wait_status(status)}: "
                f"{stderr.decode('utf-8', 'replace').strip()}"
            )
        return _parse_helper_response(op.method, stdout)

    async def _spawn(self, spec: LaunchSpec, message: bytes) -> tuple[bytes, bytes, int]:
        try:
            proc = await asyncio.create_subprocess_exec(
                spec.arg0 or spec.argv[0],
                *spec.argv[1:],
                executable=spec.argv[0],
                cwd=spec.cwd,
                env=spec.env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=spec.pass_fds,
                start_new_session=True,
            )
        except OSError as exc:
            raise FsFailedError(fs_error_from_os(exc).message) from exc
        finally:
            for fd in spec.pass_fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._helpers.add(proc)
        timeout = self._config.fs_helper_timeout
        try:
            async with asyncio.timeout(timeout):
                stdout, stderr = await proc.communicate(message)
        except BaseException as exc:
            _kill_group(proc)
            await proc.wait()
            if isinstance(exc, TimeoutError):
                raise FsFailedError(
                    f"fs sandbox helper timed out after {timeout:g}s and was killed"
                ) from None
            raise
        finally:
            self._helpers.discard(proc)
        code = proc.returncode if proc.returncode is not None else -1
        status = (-code) & 0x7F if code < 0 else (code & 0xFF) << 8
        return stdout, stderr, status


def _request(context: object) -> FsSandboxRequest:
    if isinstance(context, FsSandboxRequest):
        return context
    raise FsRefusedError(NEEDS_POLICY)


def _is_visible_link(request: FsSandboxRequest, path: str) -> bool:
    """Whether ``path`` is a symlink the policy lets the caller see where it lives: the
    helper stats the resolved path, ``isSymlink`` is of the path (CLIENT_COMPAT.md §6.1)."""
    if not os.path.islink(path):
        return False
    try:
        check_path(request, path, preserve=True, write=False)
    except (FsError, SandboxError):
        return False
    return True


def _unpack(reply: object) -> dict[str, object]:
    """A helper reply's result fields, or its error raised with the child's code."""
    if not isinstance(reply, dict) or reply.get("status") not in ("ok", "error"):
        raise FsFailedError(f"{BAD_MESSAGE}: not a reply object")
    if reply["status"] == "error":
        code = reply.get("code")
        message = reply.get("message")
        kind = _BY_CODE.get(code) if isinstance(code, int) else None
        if kind is None or not isinstance(message, str):
            raise FsFailedError(f"{BAD_MESSAGE}: bad error")
        raise kind(message)
    result = reply.get("result")
    if not isinstance(result, dict):
        raise FsFailedError(f"{BAD_MESSAGE}: no result")
    return result


def _helper_request(op: FsOperation, header: dict[str, object]) -> bytes:
    """PROTOCOL.md §10.5 request, with the zygote's header as an ``x-exec-server`` member:
    our helper runs the same strict checks from it (upstream's ignores unknown members)."""
    params: dict[str, object] = {"sandbox": None}
    if op.method == "fs/copy":
        params.update(sourcePath=header["path"], destinationPath=header["dest"],
                      recursive=op.recursive)
    else:
        params["path"] = header["path"]
    if op.method == "fs/writeFile":
        params["dataBase64"] = base64.b64encode(ops.payload_bytes(op.data)).decode("ascii")
    elif op.method == "fs/createDirectory":
        params["recursive"] = op.recursive
    elif op.method == "fs/remove":
        params.update(recursive=op.recursive, force=op.force)
    return json.dumps({"operation": op.method, "params": params, "x-exec-server": header}).encode()


def _parse_helper_response(method: str, stdout: bytes) -> tuple[dict[str, object], bytes]:
    try:
        msg = json.loads(stdout.strip() or b"null")
    except ValueError as exc:
        raise FsFailedError(f"{BAD_MESSAGE}: {exc}") from None
    if not isinstance(msg, dict) or msg.get("status") not in ("ok", "error"):
        raise FsFailedError(f"{BAD_MESSAGE}: not a helper response")
    payload = msg.get("payload")
    if not isinstance(payload, dict):
        raise FsFailedError(f"{BAD_MESSAGE}: no payload")
    if msg["status"] == "error":
        return _unpack({"status": "error", **payload}), b""
    got = payload.get("operation")
    if got != method:
        raise FsFailedError(f"unexpected fs sandbox helper response: expected {method}, got {got}")
    response = payload.get("response")
    if not isinstance(response, dict):
        raise FsFailedError(f"{BAD_MESSAGE}: no response")
    if method == "fs/readFile":
        try:
            data = base64.b64decode(str(response.get("dataBase64", "")), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise FsFailedError(f"fs/readFile returned invalid base64 dataBase64: {exc}") from None
        return {}, data
    return response, b""


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
