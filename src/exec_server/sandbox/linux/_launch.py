"""Landlock launcher body (``launcher.py`` or a helper zygote child): confine this process,
then exec the command (docs/sandbox-linux.md). Stdlib only: start-up is the cost floor. It
runs unconfined until ``_confine`` returns, so the command's env reaches only the final
``execve``. Setup failures: a JSON line on the status fd, exit 125; exec: 127 or 126."""


import _signal  # type: ignore[import-not-found]  # builtin; ``signal`` costs more
import codecs
import os
import sys

EXIT_SETUP = 125
EXIT_NOEXEC = 126
EXIT_NOTFOUND = 127

_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_REMOUNT = 32
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 262144
_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_PR_SET_PDEATHSIG = 1
_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4


class _Args:
    """The parsed flags: the plan's fields ``landlock.restrict_self`` reads, and options."""

    full_read = full_write = network = probe = False
    status_fd = env_fd = -1
    command_cwd: str | None = None
    arg0: str | None = None

    def __init__(self) -> None:
        self.readable_roots: list[str] = []
        self.writable_roots: list[str] = []
        self.read_only_subpaths: list[str] = []
        self.denied_paths: list[str] = []
        self.command: list[str] = []


_SWITCHES = {"--full-read": "full_read", "--full-write": "full_write", "--network": "network",
             "--probe": "probe"}
_LISTS = {"--read": "readable_roots", "--write": "writable_roots", "--ro": "read_only_subpaths",
          "--deny": "denied_paths"}
_VALUES = {"--status-fd": ("status_fd", int), "--env-fd": ("env_fd", int),
           "--command-cwd": ("command_cwd", str), "--arg0": ("arg0", str)}


class _Setup(Exception):
    """A failed setup step: ``args`` are (stage, message)."""


def _json_str(text: str) -> str:
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _report(status_fd: int, kind: str, stage: str, message: str) -> None:
    if status_fd < 0:
        return
    line = f'{{"{kind}":{_json_str(message)},"stage":{_json_str(stage)}}}\n'
    try:  # noqa: SIM105 - contextlib costs start-up time here
        os.write(status_fd, line.encode("utf-8", "replace"))
    except OSError:
        pass


def _parse(argv: list[str]) -> _Args:
    args = _Args()
    i = 0
    while i < len(argv):
        flag = argv[i]
        if flag == "--":
            args.command = argv[i + 1:]
            break
        if flag in _SWITCHES:
            setattr(args, _SWITCHES[flag], True)
        elif flag in _LISTS:
            getattr(args, _LISTS[flag]).append(argv[i + 1])
            i += 1
        elif flag in _VALUES:
            name, kind = _VALUES[flag]
            setattr(args, name, kind(argv[i + 1]))
            i += 1
        else:
            raise _Setup("args", f"unknown launcher flag {flag!r}")
        i += 1
    return args


def _mount(source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    from exec_server._os.linux import c_ulong, call_syscall

    def enc(s: str | None) -> bytes | None:
        return None if s is None else os.fsencode(s)

    call_syscall("mount", enc(source), enc(target), enc(fstype), c_ulong(flags),
                 enc(data))


def _unshare(flags: int) -> None:
    """``unshare(flags)``, adding a user namespace that maps us to ourselves when not root."""
    from exec_server._os.linux import c_int, call_syscall

    uid, gid = os.getuid(), os.getgid()
    call_syscall("unshare", c_int(flags | (_CLONE_NEWUSER if uid != 0 else 0)))
    if uid != 0:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                           ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)


def _locked_flags(path: str) -> int:
    """Flags a remount must repeat or fail (EPERM); their ST_* bits equal the MS_* ones."""
    return os.statvfs(path).f_flag & (os.ST_NOSUID | os.ST_NODEV | os.ST_NOEXEC)


def _bind_read_only(src: str, target: str) -> None:
    _mount(src, target, None, _MS_BIND | _MS_REC)
    _mount(None, target, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _locked_flags(target))


def _placeholder_for(path: str, writable: list[str]) -> str | None:
    """``knobs.placeholder_for``, made an empty dir to mount over."""
    from exec_server.sandbox.linux.knobs import placeholder_for

    missing = placeholder_for(path, writable)
    if missing is None:
        return None
    try:  # noqa: SIM105 - contextlib costs start-up time here
        os.mkdir(missing, 0o555)
    except FileExistsError:  # a concurrent launch made it first: protect it all the same
        pass
    return missing


def _bind_read_only_tree(path: str) -> None:
    """``path`` and every mount below it read-only (``/sys/fs/cgroup``, ``binfmt_misc``...)."""
    _bind_read_only(path, path)
    prefix = path.rstrip("/") + "/"
    with open("/proc/self/mountinfo", "rb") as f:
        mountinfo = f.read()
    for line in mountinfo.splitlines():
        fields = line.split(b" ")
        if len(fields) > 4:
            point = os.fsdecode(codecs.escape_decode(fields[4])[0])  # undo \040 escapes
            if point.startswith(prefix):
                _mount(None, point, None,
                       _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _locked_flags(point))


def _read_only_tree(writable: list[str]) -> None:
    """Every mount read-only but the writable roots: Landlock has no metadata right (chmod,
    utime, xattr). As mountpoints the roots cannot be renamed away and replaced (EBUSY)."""
    from exec_server._os.linux import mount_setattr, move_mount, open_tree

    roots = sorted((r for r in writable if os.path.exists(r)), key=lambda p: p.count("/"))
    clones: list[tuple[str, int]] = []
    try:
        for root in roots:
            clones.append((root, open_tree(root)))
        mount_setattr("/", read_only=True)
        for root, fd in clones:
            move_mount(fd, root)
    finally:
        for _, fd in clones:
            os.close(fd)


#: host device nodes bound into the private ``/dev`` (read-only mounts: no chmod of the host's).
_DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")
_DEV_LINKS = (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
              ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2"), ("ptmx", "pts/ptmx"))


def _own_pty() -> int | None:
    """The launch's PTY (stdin), a detached mount for ``/dev/console`` (``ttyname`` needs it)."""
    from exec_server._os.linux import open_tree

    try:
        if not os.isatty(0):
            return None
        path = os.readlink("/proc/self/fd/0")
        if not path.startswith("/dev/pts/") or os.stat(path).st_rdev != os.fstat(0).st_rdev:
            return None
        return open_tree(path)
    except OSError:
        return None


def _private_dev() -> None:
    """A fresh read-only ``/dev``: ``_DEV_NODES``, private ``shm`` and PTY instance, no more."""
    from exec_server._os.linux import mount_setattr, move_mount, open_tree

    nodes: list[tuple[str, int]] = []
    try:
        for name in _DEV_NODES:
            try:
                nodes.append((name, open_tree("/dev/" + name)))
            except FileNotFoundError:
                continue
        pty = _own_pty()
        if pty is not None:
            nodes.append(("console", pty))
        _mount("tmpfs", "/dev", "tmpfs", _MS_NOSUID | _MS_NOEXEC, "mode=755,size=64k")
        for name, fd in nodes:
            path = "/dev/" + name
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
            move_mount(fd, path)
    finally:
        for _, fd in nodes:
            os.close(fd)
    for name, target in _DEV_LINKS:
        os.symlink(target, "/dev/" + name)
    os.mkdir("/dev/shm")
    os.mkdir("/dev/pts")
    mount_setattr("/dev", read_only=True)
    _mount("tmpfs", "/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777")
    _mount("devpts", "/dev/pts", "devpts", _MS_NOSUID | _MS_NOEXEC,
           "newinstance,ptmxmode=0666,mode=620")


def _apply_mounts(args: _Args) -> None:
    """Pid 1's mount work in the launch's fresh mount namespace (SANDBOX.md §1.10)."""
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    if not args.full_write:
        if "/" not in args.writable_roots:  # else nothing lies outside the writable roots
            _read_only_tree(args.writable_roots)
        for path in args.read_only_subpaths:
            if os.path.lexists(path):
                _bind_read_only(path, path)
            else:
                made = _placeholder_for(path, args.writable_roots)
                if made is not None:
                    _bind_read_only(made, made)
    for path in args.denied_paths:
        if os.path.isdir(path):
            _mount("tmpfs", path, "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
                   "mode=000,size=4k")
            _mount(None, path, None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV
                   | _MS_NOEXEC, "mode=000,size=4k")
        elif os.path.lexists(path):
            _bind_read_only("/dev/null", path)
    _private_dev()
    try:
        # this process is pid 1 of the new PID namespace: its /proc lists only the launch
        _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC | _MS_RDONLY)
    except OSError as exc:
        _report(args.status_fd, "warning", "proc", f"private /proc unavailable: {exc}")
    if os.getuid() == 0:
        # only root passes the permission check of these host-wide knobs (knobs.py)
        from exec_server.sandbox.linux.knobs import read_only_knobs

        for path in read_only_knobs(full_write=args.full_write,
                                    writable_roots=args.writable_roots):
            _bind_read_only_tree(path)


# Signals a monitor ignores: they reach the command through the process group. Job-control
# stops keep their default, so ^Z stops the monitor with the command (a shell sees its job stop).
_MONITOR_IGNORES = ("SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2",
                    "SIGALRM", "SIGPIPE", "SIGXFSZ")


def _exit_like(status: int) -> None:
    """Exit the way a child with raw wait ``status`` ended (re-raising its signal)."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            _signal.signal(sig, _signal.SIG_DFL)
            _signal.pthread_sigmask(_signal.SIG_UNBLOCK, (sig,))
            os.kill(os.getpid(), sig)
        except (OSError, ValueError):
            pass
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else EXIT_SETUP)


def _wait_for(pid: int) -> int:
    """Reap children until ``pid`` exits (pid 1 also reaps adopted orphans); its raw status."""
    while True:
        try:
            found, status = os.waitpid(-1, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            return EXIT_SETUP << 8
        if found == pid:
            return status


def _split_monitor() -> int:
    """Fork pid 1 of the new PID namespace, stay outside as its monitor (never returns; ends
    as the command did). Killing it kills pid 1 (PDEATHSIG), and so the whole namespace."""
    relay_r, relay_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        # No handler on pid 1 (the launcher's interpreter installed one for SIGINT):
        # the kernel then drops what the group receives from outside.
        _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
        os.close(relay_r)
        from exec_server._os.linux import call_prctl

        call_prctl(_PR_SET_PDEATHSIG, 9)
        return relay_w
    try:
        for name in _MONITOR_IGNORES:
            _signal.signal(getattr(_signal, name), _signal.SIG_IGN)
        os.close(relay_w)
        status = _wait_for(pid)
        data = os.read(relay_r, 4)
        if len(data) == 4:
            status = int.from_bytes(data, "little", signed=True)
        _exit_like(status)
    except BaseException:  # never return into the launch
        os._exit(EXIT_SETUP)
    os._exit(EXIT_SETUP)  # pragma: no cover - _exit_like does not return


def _split_init(relay_w: int) -> None:
    """Pid 1: fork the command's process (which returns) and reap until it exits."""
    pid = os.fork()
    if pid == 0:
        os.close(relay_w)
        return
    try:
        status = _wait_for(pid)
        os.write(relay_w, status.to_bytes(4, "little", signed=True))
    except BaseException:  # never return into the launch
        os._exit(EXIT_SETUP)
    os._exit(0)


def _isolate(args: _Args) -> None:
    """Become the command's process under pid 1 of new PID + mount namespaces; without them
    the launch goes on with Landlock and seccomp only, with a warning."""
    try:
        _unshare(_CLONE_NEWNS | _CLONE_NEWPID)
    except OSError as exc:
        _report(args.status_fd, "warning", "namespaces", f"namespaces unavailable: {exc}")
        return
    relay_w = _split_monitor()
    try:
        _apply_mounts(args)
    except OSError as exc:
        _report(args.status_fd, "warning", "mounts", f"read-only mounts unavailable: {exc}")
    _split_init(relay_w)


def drop_capabilities(*, now: bool = False) -> None:
    """Root: empty the bounding, ambient and inheritable sets (SANDBOX.md §1.11); ``now``:
    effective and permitted too, for a process that will not ``execve`` (helper zygote)."""
    from exec_server._os.linux import byref, c_uint32, call_prctl, call_syscall

    try:
        with open("/proc/sys/kernel/cap_last_cap", "rb") as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = 63
    for cap in range(last + 1):
        try:
            call_prctl(_PR_CAPBSET_DROP, cap)
        except OSError as exc:
            if exc.errno != 22:  # EINVAL: cap unknown to this kernel
                raise
    call_prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)
    header = (c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (c_uint32 * 6)()  # {effective, permitted, inheritable} x 2 words
    call_syscall("capget", byref(header), byref(data))
    for word in range(6) if now else (2, 5):
        data[word] = 0
    call_syscall("capset", byref(header), byref(data))


def _confine(args: _Args) -> None:
    """The command's process: Landlock, capability drop, seccomp (after ``_isolate``)."""
    from exec_server.sandbox.linux import landlock, seccomp

    try:
        landlock.restrict_self(args, required=not (args.full_read and args.full_write))  # type: ignore[arg-type]
    except OSError as exc:
        raise _Setup("landlock", str(exc)) from exc
    if os.getuid() == 0:
        try:
            drop_capabilities()
        except OSError as exc:
            raise _Setup("capabilities", f"dropping capabilities: {exc}") from exc
    try:
        if not args.network:
            seccomp.install_network_filter(seccomp.MODE_RESTRICTED)
        elif not (args.full_write and args.full_read):
            seccomp.install_network_filter(seccomp.MODE_VSOCK)
    except OSError as exc:
        raise _Setup("seccomp", str(exc)) from exc


def _probe() -> int:
    """Report what this kernel lets a fresh process do, as one JSON line on stdout."""
    import json
    import tempfile

    from exec_server._os import linux as _libc
    from exec_server.sandbox.linux import landlock, seccomp

    result: dict[str, object] = {"arch": _libc.machine, "uid": os.getuid(),
                                 "landlock_abi": landlock.abi_version()}
    try:
        with tempfile.TemporaryDirectory(prefix="exec-server-probe-") as tmp:
            try:
                # what a launch's _isolate and _apply_mounts need
                _unshare(_CLONE_NEWNS | _CLONE_NEWPID)
                _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
                _bind_read_only(tmp, tmp)
                os.close(_libc.open_tree(tmp))
                _libc.mount_setattr(tmp, read_only=True)
                result["mount_ns"] = True
                _libc.call_syscall("umount2", os.fsencode(tmp), _libc.c_int(2))  # MNT_DETACH
            except OSError as exc:
                result["mount_ns"] = False
                result["mount_ns_error"] = str(exc)
    except OSError:
        pass
    plan = _Args()
    plan.full_read = True
    plan.writable_roots = ["/tmp"]
    try:
        status = landlock.restrict_self(plan, required=True)  # type: ignore[arg-type]
        result["landlock"] = status.as_dict()
    except OSError as exc:
        result["landlock"] = None
        result["landlock_error"] = str(exc)
    try:
        seccomp.install_network_filter(seccomp.MODE_RESTRICTED)
        result["seccomp"] = True
    except OSError as exc:
        result["seccomp"] = False
        result["seccomp_error"] = str(exc)
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


def _execvp(program: str, argv: list[str], env: "dict[str, str] | os._Environ[str]") -> None:
    """``os.execvpe`` minus ``get_exec_path``, whose ``warnings`` import Landlock may refuse."""
    if "/" in program:
        os.execve(program, argv, env)
    saved: OSError | None = None
    last: OSError | None = None
    for directory in (env.get("PATH") or os.defpath).split(os.pathsep):
        try:
            os.execve(os.path.join(directory or ".", program), argv, env)
        except OSError as exc:
            last = exc
            if saved is None and not isinstance(exc, FileNotFoundError | NotADirectoryError):
                saved = exc
    raise saved or last or FileNotFoundError(2, "No such file or directory", program)


def _read_env(fd: int) -> dict[str, str]:
    """The command's environment from ``--env-fd``; closes ``fd``."""
    try:
        with open(fd, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise _Setup("env", f"reading the command environment: {exc.strerror}") from exc
    env = {}
    for item in data.split(b"\0"):
        if item:
            name, _, value = item.partition(b"=")
            env[os.fsdecode(name)] = os.fsdecode(value)
    return env


def main(argv: list[str], env: dict[str, str] | None = None) -> int:
    """Confine this process and exec the command; returns an exit code only on failure.
    ``env``: the command's (zygote child), else from ``--env-fd``, else the launcher's."""
    status_fd = -1
    try:
        args = _parse(argv)
        status_fd = args.status_fd
        if status_fd >= 0:
            os.set_inheritable(status_fd, False)
        if args.probe:
            return _probe()
        if not args.command:
            raise _Setup("args", "no command given after --")
        if args.env_fd >= 0:
            env = _read_env(args.env_fd)
        from exec_server._os.linux import call_prctl

        parent = os.getppid()
        call_prctl(_PR_SET_PDEATHSIG, 9)
        if os.getppid() != parent:  # the parent died before the prctl
            os._exit(EXIT_SETUP)
        # without --command-cwd, re-resolve the inherited cwd after the mounts: the old
        # reference would still point below the read-only rebinds (SANDBOX.md §1.10)
        cwd = args.command_cwd or os.getcwd()
        import resource

        try:
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        except (OSError, ValueError) as exc:
            raise _Setup("rlimit", f"setting RLIMIT_CORE: {exc}") from exc
        _isolate(args)
        _confine(args)
        try:
            os.chdir(cwd)
        except OSError as exc:
            raise _Setup("chdir", f"chdir {cwd}: {exc.strerror}") from exc
    except _Setup as exc:
        stage, message = exc.args
        _report(status_fd, "error", stage, message)
        sys.stderr.write(f"exec-server sandbox: {message}\n")
        return EXIT_SETUP
    except (ValueError, IndexError) as exc:
        _report(status_fd, "error", "args", f"bad launcher arguments: {exc}")
        sys.stderr.write(f"exec-server sandbox: bad launcher arguments: {exc}\n")
        return EXIT_SETUP
    # Python ignores SIGPIPE and SIGXFSZ; an ignored signal stays ignored across exec.
    for sig in (_signal.SIGPIPE, _signal.SIGXFSZ):
        _signal.signal(sig, _signal.SIG_DFL)
    program = args.command[0]
    visible = [args.arg0 if args.arg0 is not None else program, *args.command[1:]]
    try:
        _execvp(program, visible, os.environ if env is None else env)
    except OSError as exc:
        sys.stderr.write(f"exec-server sandbox: {program}: {exc.strerror}\n")
        return EXIT_NOTFOUND if isinstance(exc, FileNotFoundError) else EXIT_NOEXEC
    return EXIT_NOEXEC  # pragma: no cover - execvp does not return
