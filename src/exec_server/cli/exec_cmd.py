"""``exec-server exec``: run one command on a remote exec-server and mirror it locally.

Streams the remote output to our stdout/stderr, forwards stdin in ``--tty`` mode and
exits with the remote exit code. The work is in ``exec_server.client``; this module
only parses arguments and wires the terminal.
"""

from __future__ import annotations

import argparse

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``exec`` subcommand."""
    p = subparsers.add_parser(
        "exec",
        help="run a command on a remote exec-server",
        description="Run CMD on the exec-server at --url, stream its output, exit with its code.",
    )
    p.add_argument("--url", required=True, help="ws://HOST:PORT of the exec-server")
    p.add_argument("--tty", action="store_true", help="run on a PTY and forward stdin")
    p.add_argument("--cwd", default=None, help="remote working directory (default: ours)")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="K=V",
        help="set a variable in the remote environment (repeatable)",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ARGS...")
    p.set_defaults(func=_run)


def _run(ns: argparse.Namespace) -> int:
    from exec_server.client._exec_main import exec_main

    return exec_main(ns)
