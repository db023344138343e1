"""apply_patch: the Codex patch format, applied through a (sandboxable) file system
(docs/apply-patch.md)."""

from exec_server.patch.apply import AffectedPaths as AffectedPaths
from exec_server.patch.apply import apply_hunks as apply_hunks
from exec_server.patch.apply import apply_patch as apply_patch
from exec_server.patch.diff import unified_diff as unified_diff
from exec_server.patch.diff import unified_diff_from_chunks as unified_diff_from_chunks
from exec_server.patch.errors import ApplyError as ApplyError
from exec_server.patch.errors import CorrectnessError as CorrectnessError
from exec_server.patch.errors import ParseError as ParseError
from exec_server.patch.errors import PatchError as PatchError
from exec_server.patch.fs import PatchFileSystem as PatchFileSystem
from exec_server.patch.invocation import maybe_parse_apply_patch as maybe_parse_apply_patch
from exec_server.patch.invocation import (
    maybe_parse_apply_patch_verified as maybe_parse_apply_patch_verified,
)
from exec_server.patch.parse import ParsedPatch as ParsedPatch
from exec_server.patch.parse import parse_patch as parse_patch

__all__ = [
    "AffectedPaths",
    "ApplyError",
    "CorrectnessError",
    "ParseError",
    "ParsedPatch",
    "PatchError",
    "PatchFileSystem",
    "apply_hunks",
    "apply_patch",
    "maybe_parse_apply_patch",
    "maybe_parse_apply_patch_verified",
    "parse_patch",
    "unified_diff",
    "unified_diff_from_chunks",
]
