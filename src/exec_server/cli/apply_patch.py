"""The ``apply_patch`` program (alias form, hidden-flag form, ``exec-server apply-patch``):
APPLY_PATCH.md §10-§11, on the local file system with no sandbox context (§14)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from exec_server.cli.args import is_utf8
from exec_server.cli.main import APPLY_PATCH_FLAG
from exec_server.client.fs import LocalFileSystem
from exec_server.exceptions import os_error_message
from exec_server.patch.apply import apply_patch
from exec_server.patch.errors import PatchError

__all__ = ["APPLY_PATCH_FLAG", "console_main", "hidden_flag_main", "register", "run_patch"]

_USAGE = "Usage: apply_patch 'PATCH'\n       echo 'PATCH' | apply_patch\n"


def run_patch(patch: str, *, stdout: TextIO, stderr: TextIO) -> int:
    """Apply ``patch`` in the current directory on the local file system; return the exit code."""
    try:
        cwd = Path(os.getcwd())
    except OSError as exc:
        stderr.write(f"Error: Failed to determine current directory.\n{os_error_message(exc)}\n")
        return 1
    try:
        affected = asyncio.run(apply_patch(patch, cwd, LocalFileSystem()))
    except PatchError as exc:
        stderr.write(f"{exc}\n")
        stderr.flush()
        return 1
    stdout.write(affected.summary())
    stdout.flush()
    return 0


def _from_argument_or_stdin(patch: str | None) -> int:
    if patch is not None and not is_utf8(patch):
        sys.stderr.write("Error: apply_patch requires a UTF-8 PATCH argument.\n")
        return 1
    if patch is None:
        try:
            data = sys.stdin.buffer.read()
        except KeyboardInterrupt:  # ^C while waiting for a patch on a terminal
            sys.stderr.write("\n")
            return 130
        try:
            patch = data.decode("utf-8")
        except UnicodeDecodeError:
            sys.stderr.write("Error: Failed to read PATCH from stdin.\n"
                             "stream did not contain valid UTF-8\n")
            return 1
        if not patch:
            sys.stderr.write(_USAGE)
            return 2
    return run_patch(patch, stdout=sys.stdout, stderr=sys.stderr)


def hidden_flag_main(args: Sequence[str]) -> int:
    """``<exe> --codex-run-as-apply-patch PATCH``: stdin is never read, extra arguments
    are ignored (§11)."""
    if not args or not is_utf8(args[0]):
        sys.stderr.write(f"Error: {APPLY_PATCH_FLAG} requires a UTF-8 PATCH argument.\n")
        return 1
    return run_patch(args[0], stdout=sys.stdout, stderr=sys.stderr)


def console_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``apply_patch`` / ``applypatch`` console scripts (alias form);
    ``argv`` defaults to ``sys.argv[1:]``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args in (["--version"], ["-V"]):  # never a patch: one starts "*** Begin Patch"
        from exec_server import __version__

        prog = os.path.basename(sys.argv[0]) if argv is None else "apply_patch"
        sys.stdout.write(f"{prog} (exec-server) {__version__}\n")
        return 0
    if len(args) > 1:
        sys.stderr.write("Error: apply_patch accepts exactly one argument.\n")
        return 2
    return _from_argument_or_stdin(args[0] if args else None)


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Apply a Codex-format patch (*** Begin Patch ... *** End Patch) to files under the "
        "current directory. The patch is the argument, or stdin when omitted."
    )
    parser.add_argument("patch", nargs="?", metavar="PATCH", help="the patch text")
    parser.set_defaults(func=lambda ns: _from_argument_or_stdin(ns.patch))
