"""The ``exec-server`` command line: arg0 dispatch, hidden helper modes (recognised before
argparse, PROTOCOL.md §12.2), subcommands (each module's ``register(parser)`` adds its
arguments and sets ``func``, an ``(argparse.Namespace) -> int``)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import cast

__all__ = ["main"]

#: ``(command, module, help)`` in ``--help`` order. Only the chosen command's
#: module is imported: ``serve`` does not pay for the client, patch and
#: sandbox-runner modules (~2 MB of RSS).
_SUBCOMMANDS: tuple[tuple[str, str, str], ...] = (
    ("serve", "serve", "serve the exec-server protocol over WebSocket or stdio"),
    ("exec", "exec_cmd", "run a command on a remote exec-server"),
    ("run", "run", "run a local command under the sandbox (try a policy)"),
    ("apply-patch", "apply_patch", "apply a Codex-format patch in the current directory"),
)

#: argv[1] flags that switch the executable into a hidden helper mode.
FS_HELPER_FLAG = "--codex-run-as-fs-helper"
APPLY_PATCH_FLAG = "--codex-run-as-apply-patch"


def _build_parser(command: str | None) -> argparse.ArgumentParser:
    """The top-level parser; only ``command``'s subparser gets its arguments."""
    from exec_server import __version__

    parser = argparse.ArgumentParser(
        prog="exec-server",
        description="Run processes and filesystem operations for coding agents, sandboxed.",
    )
    parser.add_argument("-V", "--version", action="version",
                        version=f"exec-server {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name, help_text in _SUBCOMMANDS:
        subparser = subparsers.add_parser(name, help=help_text)
        if name == command:
            importlib.import_module(f"exec_server.cli.{module_name}").register(subparser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``exec-server`` console script and ``python -m exec_server``."""
    args = list(sys.argv[1:] if argv is None else argv)
    prog = os.path.basename(sys.argv[0]) if argv is None else "exec-server"
    if prog in ("apply_patch", "applypatch"):
        from exec_server.cli.apply_patch import console_main

        return console_main(args)
    if args and args[0] == FS_HELPER_FLAG:
        from exec_server.fs.helper.oneshot import helper_main

        return helper_main(args[1:])
    if args and args[0] == APPLY_PATCH_FLAG:
        from exec_server.cli.apply_patch import hidden_flag_main

        return hidden_flag_main(args[1:])
    # The subcommand is the first non-option word.
    parser = _build_parser(next((a for a in args if not a.startswith("-")), None))
    ns = parser.parse_args(args)
    func = getattr(ns, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return cast(Callable[[argparse.Namespace], int], func)(ns)
    except KeyboardInterrupt:  # ^C outside a command's own handling: no traceback
        return 130
