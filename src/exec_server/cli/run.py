"""``exec-server run``: run one local command confined, exit with its status.

    exec-server run [--sandbox read-only|workspace-write|danger-full-access]
                    [--writable-root DIR]... [--network]
                    [--backend auto|bwrap|landlock] -- CMD ARGS...

The everyday way to try a policy: the plan comes from the policy layer
(the same conversion a legacy ``workspace-write`` request gets), the launch
from the Linux backend. Exit status: the command's own; ``128+N`` when it was
killed by signal N; 125 when it could not be confined or started (never
silently unconfined).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from typing import Any

from exec_server.process.spec import LaunchSpec
from exec_server.sandbox.plan import SandboxType

__all__ = ["EXIT_SETUP", "register", "run"]

#: like ``env``/``timeout``: the wrapper itself failed, the command never ran.
EXIT_SETUP = 125
_MODES = ("read-only", "workspace-write", "danger-full-access")


def register(subparsers: Any) -> None:
    """Add the ``run`` subcommand to ``exec-server``'s parser."""
    parser = subparsers.add_parser(
        "run",
        help="run a local command under the sandbox (try a policy)",
        description="Run CMD confined by the kernel and exit with its status.",
    )
    parser.add_argument("--sandbox", choices=_MODES, default="read-only",
                        help="policy (default: read-only)")
    parser.add_argument("--writable-root", action="append", default=[], metavar="DIR",
                        help="extra writable root for workspace-write (absolute; repeatable)")
    parser.add_argument("--network", action="store_true", help="allow network access")
    parser.add_argument("--backend", choices=("auto", "bwrap", "landlock"), default="auto",
                        help="Linux mechanism (default: auto = bwrap if usable, else landlock)")
    parser.add_argument("--probe", action="store_true",
                        help="print what each Linux backend's probe found and exit")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ARGS",
                        help="the command to run")
    parser.set_defaults(func=run)


def _plan_request(ns: argparse.Namespace, cwd: str) -> Any:
    from exec_server.sandbox.convert import cli_launch_request

    return cli_launch_request(ns.sandbox, cwd=cwd, writable_roots=ns.writable_root,
                              network=ns.network, tmpdir=os.environ.get("TMPDIR"))


def _confine(ns: argparse.Namespace, spec: LaunchSpec) -> LaunchSpec:
    """Policy → plan → backend wrap, through the same manager the server uses."""
    from exec_server.config import ServerConfig
    from exec_server.sandbox.manager import SandboxManager
    from exec_server.sandbox.select import select_backend

    request = _plan_request(ns, spec.cwd)
    manager = SandboxManager(ServerConfig(sandbox_backend=ns.backend), selector=select_backend)
    wrapped: LaunchSpec = manager.prepare_request(spec, request)
    return wrapped


def _spawn_and_wait(spec: LaunchSpec) -> int:
    argv = list(spec.argv)
    program = argv[0]
    if spec.arg0 is not None:
        argv[0] = spec.arg0
    # The terminal's ^C reaches the child (same process group); we just outlive it.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        try:
            proc = subprocess.Popen(argv, executable=program, cwd=spec.cwd, env=spec.env,
                                    pass_fds=spec.pass_fds, close_fds=True,
                                    restore_signals=True)
        finally:
            for fd in spec.pass_fds:
                os.close(fd)
        code = proc.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
        if spec.cleanup is not None:
            spec.cleanup()
    return 128 - code if code < 0 else code


def run(ns: argparse.Namespace) -> int:
    """Entry of ``exec-server run``; returns the exit status."""
    if ns.probe:
        import json

        from exec_server.sandbox.select import probe_report

        sys.stdout.write(json.dumps(probe_report(), indent=2) + "\n")
        return 0
    command = list(ns.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        sys.stderr.write("exec-server run: missing command (usage: exec-server run [OPTIONS] "
                         "-- CMD ARGS...)\n")
        return 2
    from exec_server.exceptions import ExecServerError

    spec = LaunchSpec(argv=command, cwd=os.getcwd(), env=dict(os.environ))
    try:
        wrapped = _confine(ns, spec)
    except (ExecServerError, ValueError) as exc:
        message = exc.message if isinstance(exc, ExecServerError) else str(exc)
        sys.stderr.write(f"exec-server run: {message}\n")
        return EXIT_SETUP
    if wrapped.sandbox_type is SandboxType.NONE and ns.sandbox != "danger-full-access":
        sys.stderr.write("exec-server run: refusing to run unconfined\n")
        return EXIT_SETUP
    try:
        return _spawn_and_wait(wrapped)
    except FileNotFoundError as exc:
        sys.stderr.write(f"exec-server run: {command[0]}: {exc.strerror}\n")
        return 127
    except OSError as exc:
        sys.stderr.write(f"exec-server run: {command[0]}: {exc.strerror}\n")
        return 126
