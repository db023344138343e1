"""Sandbox contexts as codex 0.163 builds them (CLIENT_COMPAT.md §1.4), for any workspace:
by hand the shape is easy to get wrong and still valid (no workspace roots: every write
refused; no read-only ``.git``/``.codex`` carve-outs: a sandboxed call may plant a git
hook). :func:`to_wire` gives the JSON for hand-written JSON-RPC."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import msgspec

from exec_server.protocol.types.sandbox import (
    AbsPath,
    CurrentSandboxContext,
    FileSystemAccess,
    FileSystemSandboxEntry,
    FileSystemSpecialPath,
    FileSystemSpecialPathEntry,
    ManagedPermissions,
    PermissionsDisabled,
    PolicyContext,
    RestrictedFileSystem,
    SpecialMinimal,
    SpecialProjectRoots,
    SpecialRoot,
    SpecialSlashTmp,
    SpecialTmpdir,
    encode_client_context,
)

__all__ = ["PROTECTED_SUBPATHS", "full_access", "read_only", "to_wire", "workspace_write"]

#: Names under every workspace root that stay read-only (skipped when missing), in
#: the order codex 0.163 lists them.
PROTECTED_SUBPATHS = (".git", ".agents", ".codex", ".aws")

StrPath = str | os.PathLike[str]


def workspace_write(
    workspace: StrPath,
    *,
    home: StrPath | None = None,
    full_read: bool = True,
    tmp: bool = True,
    network: bool = False,
    writable_roots: Sequence[StrPath] = (),
) -> CurrentSandboxContext:
    """``--sandbox workspace-write``: read everywhere (``full_read=False``: the platform's
    minimal set and the workspace), write in ``workspace``, ``writable_roots``, and ``/tmp``
    and ``$TMPDIR`` unless ``tmp`` is false; their protected names read-only."""
    entries = [_entry(SpecialRoot() if full_read else SpecialMinimal(), "read")]
    entries.append(_entry(SpecialProjectRoots(), "write"))
    if tmp:
        entries += [_entry(SpecialSlashTmp(), "write"), _entry(SpecialTmpdir(), "write")]
    entries += [
        FileSystemSandboxEntry(
            path=FileSystemSpecialPathEntry(value=SpecialProjectRoots(subpath=name)),
            access="read",
            missing_path_behavior="skip",
        )
        for name in PROTECTED_SUBPATHS
    ]
    return _managed(workspace, entries, home=home, network=network, extra_roots=writable_roots)


def read_only(
    workspace: StrPath,
    *,
    home: StrPath | None = None,
    full_read: bool = True,
    network: bool = False,
) -> CurrentSandboxContext:
    """``--sandbox read-only``: reads only (everywhere, or with ``full_read=False``
    the platform's minimal set and ``workspace``). Not recorded from codex: the
    workspace-write context without its write entries and carve-outs."""
    entries = [_entry(SpecialRoot(), "read")]
    if not full_read:
        entries = [_entry(SpecialMinimal(), "read"), _entry(SpecialProjectRoots(), "read")]
    return _managed(workspace, entries, home=home, network=network)


def full_access(workspace: StrPath, *, home: StrPath | None = None) -> CurrentSandboxContext:
    """``--sandbox danger-full-access``: permissions disabled (runs unconfined)."""
    root = _abs(workspace)
    return CurrentSandboxContext(
        permissions=PermissionsDisabled(),
        windows_sandbox_level="disabled",
        policy_context=PolicyContext(cwd=root, workspace_roots=[root]),
        user_home_dir=_home(home),
        temporary_directories=[],
    )


def to_wire(ctx: msgspec.Struct) -> dict[str, Any]:
    """The JSON object a client sends for ``ctx`` (``file://`` URIs, defaults left out)."""
    wire: dict[str, Any] = msgspec.json.decode(encode_client_context(ctx))
    return wire


def _entry(value: FileSystemSpecialPath, access: FileSystemAccess) -> FileSystemSandboxEntry:
    return FileSystemSandboxEntry(path=FileSystemSpecialPathEntry(value=value), access=access)


def _managed(
    workspace: StrPath,
    entries: list[FileSystemSandboxEntry],
    *,
    home: StrPath | None,
    network: bool,
    extra_roots: Sequence[StrPath] = (),
) -> CurrentSandboxContext:
    root = _abs(workspace)
    roots = list(dict.fromkeys([root, *(_abs(r) for r in extra_roots)]))
    return CurrentSandboxContext(
        permissions=ManagedPermissions(
            file_system=RestrictedFileSystem(entries=entries),
            network="enabled" if network else "restricted",
        ),
        windows_sandbox_level="disabled",
        cwd=root,
        workspace_roots=roots,
        policy_context=PolicyContext(cwd=root, workspace_roots=roots),
        user_home_dir=_home(home),
        temporary_directories=[],
    )


def _abs(path: StrPath) -> AbsPath:
    text = os.fspath(path)
    if not os.path.isabs(text):
        raise ValueError(f"sandbox context paths must be absolute: {text!r}")
    return AbsPath(os.path.normpath(text))


def _home(home: StrPath | None) -> AbsPath:
    return _abs(os.path.expanduser("~") if home is None else home)
