"""bubblewrap backend: plan → ``bwrap`` argv (SANDBOX.md §3.2-§3.4, §8), plus a fresh
``/proc`` with the kernel knobs read-only and our seccomp BPF. bwrap starts with
``WRAPPER_ENV``; the command's env travels as ``--setenv`` options in an ``--args`` memfd."""

from __future__ import annotations

import os
import shutil

from exec_server.process.spec import LaunchSpec
from exec_server.sandbox.errors import SandboxUnavailableError
from exec_server.sandbox.linux import seccomp
from exec_server.sandbox.linux.base import (
    WRAPPER_ENV,
    LinuxBackend,
    PlaceholderRegistry,
    env_entries,
    finish_spec,
    memfd_holding,
)
from exec_server.sandbox.linux.knobs import first_missing_component, is_inside, read_only_knobs
from exec_server.sandbox.plan import SandboxPlan
from exec_server.sandbox.policy import depth

__all__ = ["BwrapBackend", "build_args"]

#: bwrap refuses more arguments than this (its cmdline and ``--args`` together).
_MAX_ARGS = 9000
#: room kept for our own options (namespaces, binds, knobs, protected paths).
_OWN_ARGS_ALLOWANCE = 1000


def build_args(plan: SandboxPlan, cwd: str, *, proc: bool = True,
               seccomp_fd: int | None = None,
               new_session: bool = True) -> tuple[list[str], list[str]]:
    """bwrap options, and the placeholders it will create on the host (remove after the run).
    ``new_session=False`` (PTY): the only TIOCSTI target is the launch's own PTY."""
    args = ["--new-session", "--die-with-parent"] if new_session else ["--die-with-parent"]
    placeholders: list[str] = []
    if plan.full_write:
        args += ["--bind", "/", "/", "--dev", "/dev"]
    else:
        if plan.full_read:
            args += ["--ro-bind", "/", "/"]
        else:
            args += ["--tmpfs", "/"]
            for root in plan.readable_roots:
                if os.path.exists(root):
                    args += ["--ro-bind", root, root]
        args += ["--dev", "/dev"]
        writable = sorted((w for w in plan.writable_roots if os.path.isdir(w)), key=depth)
        for root in writable:
            args += ["--bind", root, root]
            for sub in plan.read_only_subpaths:
                if not is_inside(sub, root) or sub == root:
                    continue
                # a deeper writable root that also holds `sub` re-protects it later
                missing = first_missing_component(sub)
                if missing is None:
                    args += ["--ro-bind", sub, sub]
                elif is_inside(missing, root) and missing != root:
                    args += ["--perms", "555", "--tmpfs", missing, "--remount-ro", missing]
                    placeholders.append(missing)
    for denied in plan.denied_paths:
        if os.path.isdir(denied):
            args += ["--perms", "000", "--tmpfs", denied, "--remount-ro", denied]
        elif os.path.lexists(denied):
            args += ["--ro-bind", "/dev/null", denied]
    args += ["--unshare-user", "--unshare-pid", "--unshare-ipc"]
    if not plan.network:
        args.append("--unshare-net")
    if proc:
        args += ["--proc", "/proc"]
    # Global kernel knobs stay read-only even for (mapped) root: see knobs.py.
    for knob in read_only_knobs(full_write=plan.full_write, writable_roots=plan.writable_roots,
                                fresh_proc=proc):
        args += ["--ro-bind", knob, knob]
    args += ["--cap-drop", "ALL"]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    if cwd:
        args += ["--chdir", cwd]
    return args, placeholders


def _resolvable(program: str, search_path: str, cwd: str) -> bool:
    if "/" in program:
        return os.access(os.path.join(cwd, program), os.X_OK)
    return shutil.which(program, path=search_path) is not None


class BwrapBackend(LinuxBackend):

    name = "bwrap"

    def __init__(self, path: str, *, proc: bool, argv0: bool, version: str,
                 fallback: LinuxBackend | None) -> None:
        self.path = path
        self.proc = proc
        self.argv0 = argv0
        self.version = version
        self._fallback = fallback
        self._placeholders = PlaceholderRegistry()

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "path": self.path, "proc": self.proc, "version": self.version}

    def wrap(self, spec: LaunchSpec, plan: SandboxPlan) -> LaunchSpec:
        if not plan.full_write and any(is_inside(self.path, w) for w in plan.writable_roots):
            # a bwrap the sandboxed command could replace is no boundary (SANDBOX.md §9.17)
            if self._fallback is not None:
                return self._fallback.wrap(spec, plan)
            raise SandboxUnavailableError(
                f"bwrap at {self.path} lies inside a writable root; refusing to use it")
        env = dict(spec.env)  # the policy layer already added what it adds (§7.5)
        entries = env_entries(env)
        if 3 * len(entries) + len(spec.argv) > _MAX_ARGS - _OWN_ARGS_ALLOWANCE:
            raise ValueError(f"too many environment variables for bwrap ({len(entries)}; it "
                             f"parses at most {_MAX_ARGS} arguments, three per variable)")
        env_args = b"".join(b"--setenv\0" + name + b"\0" + value + b"\0"
                            for name, value in entries)
        mode = seccomp.MODE_RESTRICTED if not plan.network else seccomp.MODE_VSOCK
        fd = memfd_holding("exec-server-seccomp", seccomp.build_filter(mode))
        fds = [fd]
        try:
            args, placeholders = build_args(plan, spec.cwd, proc=self.proc, seccomp_fd=fd,
                                            new_session=not spec.tty)
            if env_args:
                fds.append(memfd_holding("exec-server-env", env_args))
                args += ["--args", str(fds[-1])]
        except BaseException:
            for opened in fds:
                os.close(opened)
            raise
        command = list(spec.argv)
        if not _resolvable(command[0], env.get("PATH", os.defpath), spec.cwd):
            # bwrap reports exec failures as exit 1; let a shell give the usual 126/127
            command = ["/bin/sh", "-c", 'exec "$0" "$@"', *command]
        if spec.arg0 is not None and spec.arg0 != command[0]:
            if self.argv0:
                args += ["--argv0", spec.arg0]
            elif os.path.exists("/bin/bash"):
                command = ["/bin/bash", "--norc", "--noprofile", "-c", 'exec -a "$0" "$@"',
                           spec.arg0, *command]
        argv = [self.path, *args, "--", *command]
        release = self._placeholders.acquire(placeholders)
        return finish_spec(spec, argv=argv, env=dict(WRAPPER_ENV), arg0=None,
                           pass_fds=tuple(fds), cleanup=release)
