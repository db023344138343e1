"""Command-line arguments ``exec`` and ``run`` share: the sandbox flags and the command."""

from __future__ import annotations

import argparse

__all__ = ["SANDBOX_MODES", "add_sandbox_flags", "command_words", "is_utf8"]

SANDBOX_MODES = ("read-only", "workspace-write", "danger-full-access")


def add_sandbox_flags(parser: argparse.ArgumentParser, *, default: str | None,
                      sandbox_help: str) -> None:
    """``--sandbox MODE``, ``--writable-root DIR`` (repeatable), ``--network``."""
    parser.add_argument("--sandbox", choices=SANDBOX_MODES, default=default, help=sandbox_help)
    parser.add_argument("--writable-root", action="append", default=[], metavar="DIR",
                        help="extra writable root for workspace-write (absolute; repeatable)")
    parser.add_argument("--network", action="store_true",
                        help="allow network access in the sandbox")


def command_words(ns: argparse.Namespace) -> list[str]:
    """The command after ``--`` (argparse's REMAINDER keeps the ``--``)."""
    words: list[str] = list(ns.command)
    return words[1:] if words and words[0] == "--" else words


def is_utf8(text: str) -> bool:
    """Python decodes argv and environ with surrogateescape: lone surrogates are bytes
    that are not UTF-8, which the protocol's JSON strings cannot carry."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
