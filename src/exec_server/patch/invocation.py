"""Recognising an apply_patch call inside a command's argv (APPLY_PATCH.md §12). Where
upstream parses shell scripts with tree-sitter-bash, a small scanner accepts exactly its
two whole-script shapes: ``apply_patch <<DELIM`` … ``DELIM`` and ``cd DIR && apply_patch
<<DELIM`` … ``DELIM`` (DIR a bare word, ``"…"`` or ``'…'``)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath

from exec_server.patch.apply import read_text, resolve_path
from exec_server.patch.diff import unified_diff_from_chunks
from exec_server.patch.errors import ApplyError, CorrectnessError, ParseError
from exec_server.patch.fs import PatchFileSystem, SandboxT
from exec_server.patch.parse import AddFile, DeleteFile, Hunk, parse_patch

__all__ = [
    "IMPLICIT_INVOCATION_MESSAGE",
    "AddChange",
    "ApplyPatchAction",
    "Body",
    "DeleteChange",
    "FileChange",
    "NotApplyPatch",
    "PatchParseFailure",
    "UpdateChange",
    "Verified",
    "VerifiedBody",
    "maybe_parse_apply_patch",
    "maybe_parse_apply_patch_verified",
]

APPLY_PATCH_COMMANDS = ("apply_patch", "applypatch")

IMPLICIT_INVOCATION_MESSAGE = (
    'patch detected without explicit call to apply_patch. Rerun as ["apply_patch", "<patch>"]'
)


@dataclass(frozen=True)
class Body:
    """argv is an apply_patch call: the parsed hunks, canonical text, optional ``cd`` dir."""

    hunks: tuple[Hunk, ...]
    patch: str
    workdir: str | None = None


@dataclass(frozen=True)
class PatchParseFailure:
    """argv is an apply_patch call, but the patch text does not parse."""

    error: ParseError


@dataclass(frozen=True)
class NotApplyPatch:
    """argv is something else: run it as a normal command."""


MaybeApplyPatch = Body | PatchParseFailure | NotApplyPatch


@dataclass(frozen=True)
class AddChange:
    content: str
    overwritten_content: str | None = None


@dataclass(frozen=True)
class DeleteChange:
    content: str


@dataclass(frozen=True)
class UpdateChange:
    unified_diff: str
    move_path: Path | None
    new_content: str
    old_content: str = ""


FileChange = AddChange | DeleteChange | UpdateChange


@dataclass(frozen=True)
class ApplyPatchAction:
    """A verified plan (changes keyed by absolute path): the host applies ``patch`` with
    ``cwd`` (`exec_server.patch.apply.apply_patch`)."""

    changes: dict[Path, FileChange]
    patch: str
    cwd: Path


@dataclass(frozen=True)
class VerifiedBody:
    action: ApplyPatchAction


Verified = VerifiedBody | CorrectnessError | NotApplyPatch


def _shell_script(argv: Sequence[str]) -> str | None:
    """The script of ``[shell, flag, script]`` or ``[pwsh, -NoProfile, -Command, script]``."""
    name = PurePath(argv[0].replace("\\", "/")).stem.lower() if argv else ""
    if name in ("bash", "zsh", "sh"):
        ok = len(argv) == 3 and argv[1] in ("-lc", "-c")
    elif name in ("pwsh", "powershell"):
        ok = [a.lower() for a in argv[1:-1]] in (["-command"], ["-noprofile", "-command"])
    else:
        ok = name == "cmd" and len(argv) == 3 and argv[1].lower() == "/c"
    return argv[-1] if ok else None


_BLANK = " \t"
_WORD = r"[^\s'\"`$;&|<>()\\#]+"
_CD_ARG = rf"(?P<cd_word>{_WORD})|\"(?P<cd_dq>[^\"$`\\]+)\"|'(?P<cd_sq>[^']*)'"
_START = re.compile(
    rf"^(?:cd[{_BLANK}]+(?:{_CD_ARG})[{_BLANK}]*&&[{_BLANK}]*)?"
    rf"(?P<cmd>apply_patch|applypatch)[{_BLANK}]*"
    rf"<<(?P<dash>-?)[{_BLANK}]*"
    r"(?:(?P<bare>[A-Za-z0-9_.\-]+)|'(?P<sq>[^'\n]+)'|\"(?P<dq>[^\"\n$`\\]+)\")"
    rf"[{_BLANK}]*$"
)


def _extract_heredoc(script: str) -> tuple[str, str | None] | None:
    """``(heredoc body without trailing newlines, cd dir or None)``, or None."""
    first, newline, rest = script.lstrip(" \t\n").partition("\n")
    match = _START.match(first)
    if match is None or not newline:
        return None
    delimiter = match["bare"] or match["sq"] or match["dq"]
    lines = rest.split("\n")
    for index, line in enumerate(lines):
        if (line.lstrip("\t") if match["dash"] else line) == delimiter:
            trailer = "\n".join(lines[index + 1 :])
            if trailer.strip(" \t\n"):
                return None  # something follows the heredoc
            body = "\n".join(lines[:index]).rstrip("\n")
            # cd_word and cd_dq are never empty; cd_sq ('') may be.
            return body, match["cd_word"] or match["cd_dq"] or match["cd_sq"]
    return None


def maybe_parse_apply_patch(argv: Sequence[str]) -> MaybeApplyPatch:
    """Classify argv as an apply_patch call (§12.1)."""
    workdir: str | None = None
    if len(argv) == 2 and argv[0] in APPLY_PATCH_COMMANDS:
        text = argv[1]
    else:
        script = _shell_script(argv)
        extracted = _extract_heredoc(script) if script is not None else None
        if extracted is None:
            return NotApplyPatch()
        text, workdir = extracted
    try:
        parsed = parse_patch(text)
    except ParseError as exc:
        return PatchParseFailure(exc)
    return Body(parsed.hunks, parsed.patch, workdir)


async def maybe_parse_apply_patch_verified(
    argv: Sequence[str], cwd: Path, fs: PatchFileSystem[SandboxT], sandbox: SandboxT | None = None
) -> Verified:
    """Turn an apply_patch call into a verified plan from the files before the patch, read
    through ``fs`` (§12.2); a later hunk on a path replaces an earlier one. Returns (not
    raises) `CorrectnessError` for an implicit invocation, a parse or a read/update error."""
    bare = argv[0] if len(argv) == 1 else _shell_script(argv)
    if bare is not None:
        with contextlib.suppress(ParseError):
            parse_patch(bare)
            return CorrectnessError("implicit_invocation", IMPLICIT_INVOCATION_MESSAGE)

    result = maybe_parse_apply_patch(argv)
    if isinstance(result, PatchParseFailure):
        return CorrectnessError("parse", str(result.error), result.error)
    if not isinstance(result, Body):
        return result
    effective_cwd = resolve_path(cwd, result.workdir) if result.workdir is not None else cwd
    changes: dict[Path, FileChange] = {}
    for hunk in result.hunks:
        path = resolve_path(effective_cwd, hunk.path)
        if isinstance(hunk, AddFile):
            try:
                overwritten: str | None = await read_text(fs, path, sandbox)
            except ValueError:
                overwritten = None
            changes[path] = AddChange(hunk.contents, overwritten)
        elif isinstance(hunk, DeleteFile):
            try:
                content = await read_text(fs, path, sandbox)
            except ValueError as exc:
                return CorrectnessError("io", f"Failed to read {path}: {exc}", exc)
            changes[path] = DeleteChange(content)
        else:
            move = None if hunk.move_path is None else resolve_path(effective_cwd, hunk.move_path)
            try:
                update = await unified_diff_from_chunks(path, hunk.chunks, fs, sandbox)
            except ApplyError as exc:
                return CorrectnessError("compute", str(exc), exc)
            changes[path] = UpdateChange(
                update.unified_diff, move, update.content, update.original_content
            )
    return VerifiedBody(ApplyPatchAction(changes, result.patch, effective_cwd))
