"""``exec-server run``: run one local command confined as the server would, exit with its
status (``128+N`` for signal N; 126/127 not executable/found; 125 not confined, never
silently unconfined). See docs/sandbox-linux.md."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
from typing import Any

from exec_server.cli.args import add_sandbox_flags, command_words
from exec_server.config import ServerConfig
from exec_server.exceptions import ExecServerError
from exec_server.process.spec import LaunchSpec
from exec_server.sandbox.convert import cli_launch_request
from exec_server.sandbox.errors import SandboxError
from exec_server.sandbox.manager import SandboxManager
from exec_server.sandbox.plan import SandboxType
from exec_server.sandbox.select import probe_report

__all__ = ["EXIT_NOT_EXECUTABLE", "EXIT_NOT_FOUND", "EXIT_SETUP", "register", "run"]

#: like ``env``/``timeout``: the wrapper itself failed, the command never ran.
EXIT_SETUP = 125
#: the shell's codes: found but not executable; not found.
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = "Run CMD confined by the kernel and exit with its status."
    add_sandbox_flags(parser, default="read-only", sandbox_help="policy (default: read-only)")
    parser.add_argument("--backend", choices=("auto", "bwrap", "landlock"), default="auto",
                        help="Linux mechanism (default: auto = bwrap if usable, else landlock)")
    parser.add_argument("--probe", action="store_true",
                        help="print what each Linux backend's probe found and exit")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ARGS",
                        help="the command to run")
    parser.set_defaults(func=run)


def _confine(ns: argparse.Namespace, spec: LaunchSpec) -> LaunchSpec:
    """Policy → plan → backend wrap, through the same manager the server uses."""
    request = cli_launch_request(ns.sandbox, cwd=spec.cwd, writable_roots=ns.writable_root,
                                 network=ns.network, tmpdir=os.environ.get("TMPDIR"))
    manager = SandboxManager(ServerConfig(sandbox_backend=ns.backend))
    wrapped: LaunchSpec = manager.prepare_request(spec, request)
    return wrapped


def _ignore_while_waiting() -> dict[int, Any]:
    """A terminal's ^C/^\\ reaches the command too: we outlive it and report how it ended.
    A handler, not ``SIG_IGN`` (``execve`` would pass that on); ignored ones stay ignored."""
    previous: dict[int, Any] = {}
    for sig in (signal.SIGINT, signal.SIGQUIT):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            previous[sig] = signal.signal(sig, lambda _sig, _frame: None)
    return previous


def _spawn_and_wait(spec: LaunchSpec) -> int:
    argv = list(spec.argv)
    program = argv[0]
    if spec.arg0 is not None:
        argv[0] = spec.arg0
    previous = _ignore_while_waiting()
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
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if spec.cleanup is not None:
            spec.cleanup()
    return 128 - code if code < 0 else code


def _unrunnable(program: str, cwd: str, path: str) -> tuple[int, str] | None:
    """Why ``program`` cannot be executed, as a shell says it: (126|127, message). Checked
    on the host, same for both backends: every CLI policy reads the whole filesystem."""
    if "/" not in program:
        if shutil.which(program, path=path) is not None:
            return None
        found = [os.path.join(d or ".", program) for d in path.split(os.pathsep)]
        if not any(os.path.isfile(os.path.join(cwd, f)) for f in found):
            return EXIT_NOT_FOUND, f"{program}: command not found"
        return EXIT_NOT_EXECUTABLE, f"{program}: Permission denied"
    target = os.path.join(cwd, program)
    if not os.path.exists(target):
        return EXIT_NOT_FOUND, f"{program}: No such file or directory"
    if os.path.isdir(target):
        return EXIT_NOT_EXECUTABLE, f"{program}: Is a directory"
    try:
        # root passes access(X_OK) for a file with any x bit; exec needs one.
        runnable = os.access(target, os.X_OK) and bool(os.stat(target).st_mode & 0o111)
    except OSError:
        runnable = False
    return None if runnable else (EXIT_NOT_EXECUTABLE, f"{program}: Permission denied")


def _fail(message: str, code: int) -> int:
    sys.stderr.write(f"exec-server run: {message}\n")
    return code


def run(ns: argparse.Namespace) -> int:
    if ns.probe:
        sys.stdout.write(json.dumps(probe_report(), indent=2) + "\n")
        return 0
    command = command_words(ns)
    if not command:
        return _fail("missing command (usage: exec-server run [OPTIONS] -- CMD ARGS...)", 2)
    try:
        cwd = os.getcwd()
    except OSError as exc:
        return _fail(f"the current directory is gone: {exc.strerror}", EXIT_SETUP)
    if not command[0]:
        return _fail("empty command name", EXIT_NOT_FOUND)
    for root in ns.writable_root:
        if os.path.isabs(root) and not os.path.isdir(root):
            return _fail(f"--writable-root {root}: no such directory", EXIT_SETUP)
    unrunnable = _unrunnable(command[0], cwd, os.environ.get("PATH", os.defpath))
    if unrunnable is not None:
        code, message = unrunnable
        return _fail(message, code)
    # tty: the command stays in our session and process group (bwrap without
    # --new-session), so the terminal's ^C, job control and /dev/tty reach it;
    # our seccomp filter refuses TIOCSTI/TIOCLINUX, which --new-session guards against.
    spec = LaunchSpec(argv=command, cwd=cwd, env=dict(os.environ), tty=True)
    try:
        wrapped = _confine(ns, spec)
    except (ExecServerError, SandboxError, ValueError) as exc:
        return _fail(str(exc), EXIT_SETUP)
    if wrapped.sandbox_type is SandboxType.NONE and ns.sandbox != "danger-full-access":
        return _fail("refusing to run unconfined", EXIT_SETUP)
    try:
        return _spawn_and_wait(wrapped)
    except FileNotFoundError as exc:
        return _fail(f"{command[0]}: {exc.strerror}", EXIT_NOT_FOUND)
    except OSError as exc:
        return _fail(f"{command[0]}: {exc.strerror}", EXIT_NOT_EXECUTABLE)
