"""The ``exec-server`` command line: arg0 dispatch, hidden helper modes, subcommands.

Each subcommand lives in its own module under ``exec_server.cli`` exposing
``register(subparsers)``, which adds a parser whose ``func`` default is a
``(argparse.Namespace) -> int`` callable. Start-up order follows PROTOCOL.md
§12.2: hidden modes are recognised before argparse runs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import cast

__all__ = ["main"]

#: subcommand modules, in the order they appear in ``--help``.
_SUBCOMMANDS = ("serve", "exec_cmd", "run", "apply_patch")

#: argv[1] flags that switch the executable into a hidden helper mode.
FS_HELPER_FLAG = "--codex-run-as-fs-helper"
APPLY_PATCH_FLAG = "--codex-run-as-apply-patch"


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="exec-server",
        description="Run processes and filesystem operations for coding agents, sandboxed.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _SUBCOMMANDS:
        module = importlib.import_module(f"exec_server.cli.{name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``exec-server`` console script and ``python -m exec_server``."""
    args = list(sys.argv[1:] if argv is None else argv)
    prog = os.path.basename(sys.argv[0]) if argv is None else "exec-server"
    if prog in ("apply_patch", "applypatch"):
        from exec_server.cli.apply_patch import console_main

        return console_main(args)
    if args and args[0] == FS_HELPER_FLAG:
        from exec_server.fs.helper_main import helper_main

        return helper_main(args[1:])
    if args and args[0] == APPLY_PATCH_FLAG:
        from exec_server.cli.apply_patch import hidden_flag_main

        return hidden_flag_main(args[1:])
    parser = _build_parser()
    ns = parser.parse_args(args)
    func = getattr(ns, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    return cast(Callable[[argparse.Namespace], int], func)(ns)
