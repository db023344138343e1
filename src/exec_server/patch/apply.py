"""Applying parsed hunks through a `PatchFileSystem` (APPLY_PATCH.md §6, §7, §10), in patch
order with no rollback: the first failure stops the run, earlier hunks stay applied (§7.1).
An Update hunk's chunks are all resolved before anything is written, so a failing chunk
leaves that file untouched."""

from __future__ import annotations

import errno
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from exec_server.exceptions import ExecServerError, NotFoundError, os_error_message
from exec_server.patch.content import derive_new_contents
from exec_server.patch.errors import ApplyError
from exec_server.patch.fs import PatchFileSystem, SandboxT
from exec_server.patch.parse import AddFile, DeleteFile, Hunk, UpdateChunk, parse_patch
from exec_server.protocol.paths import normalize_lexical

__all__ = [
    "AffectedPaths",
    "apply_hunks",
    "apply_patch",
    "read_text",
    "resolve_path",
    "updated_contents",
]

#: errors a file-system call may raise; anything else is a bug and propagates.
_FS_ERRORS = (ExecServerError, OSError)


@dataclass
class AffectedPaths:
    """Paths as the patch spelled them, per kind, in patch order (§10)."""

    added: list[str] = field(default_factory=list)
    modified: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """The success text printed to stdout, every line ending in ``\\n``."""
        kinds = (("A", self.added), ("M", self.modified), ("D", self.deleted))
        lines = [f"{kind} {path}" for kind, paths in kinds for path in paths]
        return "\n".join(["Success. Updated the following files:", *lines]) + "\n"


def resolve_path(cwd: Path, path: str) -> Path:
    """Join ``path`` to ``cwd`` (absolute paths win), normalised lexically (§6)."""
    return Path(normalize_lexical(path if path.startswith("/") else f"{cwd}/{path}"))


async def read_text(fs: PatchFileSystem[SandboxT], path: Path, sandbox: SandboxT | None) -> str:
    """Read a regular file as strict UTF-8; ``ValueError`` carries the cause as upstream
    prints it (``<strerror> (os error N)``, ``path `…` is not a file``, a ``Utf8Error``)."""
    try:
        meta = await fs.get_metadata(path, sandbox=sandbox)
        if not meta.is_file:
            raise ValueError(f"path `{path}` is not a file")
        data = await fs.read_file(path, sandbox=sandbox)
    except _FS_ERRORS as exc:
        text = exc.message if isinstance(exc, ExecServerError) else os_error_message(exc)
        raise ValueError(text) from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.reason == "unexpected end of data":
            raise ValueError(f"incomplete utf-8 byte sequence from index {exc.start}") from None
        raise ValueError(
            f"invalid utf-8 sequence of {exc.end - exc.start} bytes from index {exc.start}"
        ) from None


async def _write(
    fs: PatchFileSystem[SandboxT],
    path: Path,
    data: bytes,
    sandbox: SandboxT | None,
    *,
    create_parents: bool,
) -> None:
    """Write; with ``create_parents``, create parents once on *not found* and retry (§7.2)."""
    try:
        await fs.write_file(path, data, sandbox=sandbox)
        return
    except _FS_ERRORS as exc:
        enoent = isinstance(exc, OSError) and exc.errno == errno.ENOENT
        not_found = enoent or isinstance(exc, NotFoundError)
        if not (create_parents and not_found):
            raise ApplyError(f"Failed to write file {path}") from exc
    try:
        await fs.create_directory(path.parent, recursive=True, sandbox=sandbox)
    except _FS_ERRORS as exc:
        raise ApplyError(f"Failed to create parent directories for {path}") from exc
    await _write(fs, path, data, sandbox, create_parents=False)


async def _remove_file(
    fs: PatchFileSystem[SandboxT], path: Path, sandbox: SandboxT | None, message: str
) -> None:
    """Remove a non-directory, failing on a missing path or a directory (§7.3)."""
    try:
        meta = await fs.get_metadata(path, sandbox=sandbox)
        if meta.is_directory:
            raise ApplyError(message)
        await fs.remove(path, recursive=False, force=False, sandbox=sandbox)
    except _FS_ERRORS as exc:
        raise ApplyError(message) from exc


async def updated_contents(
    fs: PatchFileSystem[SandboxT],
    path: Path,
    chunks: Sequence[UpdateChunk],
    sandbox: SandboxT | None,
) -> tuple[str, str]:
    """``(original, new)`` text of ``path``; ApplyError when the read failed (§7.4) or a
    chunk did not match (§8.6)."""
    try:
        original = await read_text(fs, path, sandbox)
    except ValueError as exc:
        raise ApplyError(f"Failed to read file to update {path}: {exc}") from exc
    return original, derive_new_contents(original, chunks, str(path))


async def apply_hunks(
    hunks: Sequence[Hunk], cwd: Path, fs: PatchFileSystem[SandboxT], sandbox: SandboxT | None = None
) -> AffectedPaths:
    """Apply hunks in order; ApplyError (the message to print) stops the run, and hunks
    before the failing one stay applied (no rollback)."""
    if not hunks:
        raise ApplyError("No files were modified.")
    affected = AffectedPaths()
    for hunk in hunks:
        path = resolve_path(cwd, hunk.path)
        if isinstance(hunk, AddFile):
            await _write(fs, path, hunk.contents.encode("utf-8"), sandbox, create_parents=True)
            affected.added.append(hunk.path)
        elif isinstance(hunk, DeleteFile):
            await _remove_file(fs, path, sandbox, f"Failed to delete file {path}")
            affected.deleted.append(hunk.path)
        else:
            _, new = await updated_contents(fs, path, hunk.chunks, sandbox)
            dest = path if hunk.move_path is None else resolve_path(cwd, hunk.move_path)
            # A move onto itself is an in-place update (later upstream; 0.163.0 lost the file).
            moved = dest != path
            await _write(fs, dest, new.encode("utf-8"), sandbox, create_parents=moved)
            if moved:
                await _remove_file(fs, path, sandbox, f"Failed to remove original {path}")
            affected.modified.append(hunk.move_path if hunk.move_path is not None else hunk.path)
    return affected


async def apply_patch(
    patch: str, cwd: Path, fs: PatchFileSystem[SandboxT], sandbox: SandboxT | None = None
) -> AffectedPaths:
    """Parse and apply patch text against ``cwd``; the result's ``.summary()`` is for stdout.
    ParseError: nothing was touched; ApplyError: earlier hunks stay applied."""
    return await apply_hunks(parse_patch(patch).hunks, cwd, fs, sandbox)
