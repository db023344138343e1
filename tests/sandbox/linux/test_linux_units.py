"""Unit-level checks of the Linux mechanism pieces (programs, argv, probes, launcher exits)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest

from exec_server.process.spec import LaunchSpec
from exec_server.sandbox.linux import seccomp
from exec_server.sandbox.linux.base import PlaceholderRegistry
from exec_server.sandbox.linux.bwrap import build_args
from exec_server.sandbox.linux.knobs import first_missing_component
from exec_server.sandbox.linux.landlock import LandlockError, abi_version, restrict_self
from exec_server.sandbox.linux.landlock_backend import LAUNCHER_PATH
from exec_server.sandbox.plan import SandboxPlan
from exec_server.sandbox.select import select_backend

# --------------------------------------------------------------------------- seccomp


def _insns(prog: bytes) -> list[tuple[int, int, int, int]]:
    return [struct.unpack("HBBI", prog[i:i + 8]) for i in range(0, len(prog), 8)]


def test_restricted_filter_layout_x86_64() -> None:
    prog = seccomp.build_filter(seccomp.MODE_RESTRICTED, "x86_64")
    insns = _insns(prog)
    assert len(insns) == 61  # SANDBOX.md §2.3's 55 + the 6-instruction TIOCSTI guard
    assert insns[0] == (0x20, 0, 0, 4)  # ld arch
    assert insns[1] == (0x15, 1, 0, 0xC000003E)
    assert insns[2] == (0x06, 0, 0, 0x80000000)  # foreign arch: kill
    assert insns[4] == (0x35, 0, 1, 0x40000000)  # x32 syscalls refused
    assert insns[-1] == (0x06, 0, 0, 0x7FFF0000)
    denied = {k for code, _, _, k in insns if code == 0x15}
    assert {42, 49, 50, 44, 425, 426, 427, 41, 53}.issubset(denied)


def test_aarch64_and_vsock_programs() -> None:
    assert len(_insns(seccomp.build_filter(seccomp.MODE_RESTRICTED, "aarch64"))) == 59
    vsock = _insns(seccomp.build_filter(seccomp.MODE_VSOCK, "x86_64"))
    assert (0x15, 0, 1, 40) in vsock  # AF_VSOCK refused
    assert not any(code == 0x15 and k == 42 for code, _, _, k in vsock)  # connect allowed


def test_unknown_mode_and_arch_refused() -> None:
    with pytest.raises(seccomp.SeccompError):
        seccomp.build_filter("bogus")
    with pytest.raises(seccomp.SeccompError):
        seccomp.build_filter(seccomp.MODE_RESTRICTED, "riscv64")
    assert not seccomp.supported("mips")


def _child(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh single-threaded interpreter (never confine the test process)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=30, check=False, cwd=tmp_path)


@pytest.mark.skipif(not seccomp.supported(), reason="no seccomp program for this arch")
def test_install_network_filter_in_child(tmp_path: Path) -> None:
    res = _child("""
        import socket
        from exec_server.sandbox.linux.seccomp import install_network_filter
        install_network_filter()
        a, b = socket.socketpair()
        try:
            socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        except PermissionError as exc:
            print("inet", exc.errno)
        print(open("/proc/self/status").read().count("Seccomp:\\t2"))
    """, tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["inet", "1", "1"]


# --------------------------------------------------------------------------- landlock


needs_landlock = pytest.mark.skipif(abi_version() <= 0, reason="Landlock not available")


@needs_landlock
def test_restrict_self_in_forked_child(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    res = _child(f"""
        import json
        from exec_server.sandbox.plan import SandboxPlan
        from exec_server.sandbox.linux.landlock import restrict_self
        plan = SandboxPlan(full_read=True, full_write=False, network=False, cwd={str(tmp_path)!r},
                           writable_roots=({str(allowed)!r},))
        status = restrict_self(plan)
        open({str(allowed / "ok")!r}, "w").write("x")
        try:
            open({str(tmp_path / "denied")!r}, "w")
        except PermissionError:
            print("denied")
        print(json.dumps(status.as_dict()))
    """, tmp_path)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "denied"
    status = json.loads(lines[1])
    assert status["fs"] is True and status["abi"] >= 1
    assert (allowed / "ok").exists()
    assert not (tmp_path / "denied").exists()


def test_restrict_self_required_without_landlock_raises() -> None:
    plan = SandboxPlan(full_read=True, full_write=False, network=False, cwd="/")
    with pytest.raises(LandlockError):
        restrict_self(plan, abi=0)
    assert restrict_self(plan, abi=0, required=False).enforced is False


# --------------------------------------------------------------------------- bwrap argv


def test_bwrap_args_order_and_placeholders(tmp_path: Path) -> None:
    w = tmp_path / "w"
    (w / ".git").mkdir(parents=True)
    plan = SandboxPlan(full_read=True, full_write=False, network=False, cwd=str(w),
                       writable_roots=(str(w),),
                       read_only_subpaths=(str(w / ".git"), str(w / ".codex")))
    args, placeholders = build_args(plan, str(w), seccomp_fd=7)
    assert args[:6] == ["--new-session", "--die-with-parent", "--ro-bind", "/", "/", "--dev"]
    i = args.index("--bind")
    assert args[i:i + 3] == ["--bind", str(w), str(w)]
    assert args[i + 3:i + 6] == ["--ro-bind", str(w / ".git"), str(w / ".git")]
    codex = str(w / ".codex")
    assert args[i + 6:i + 12] == ["--perms", "555", "--tmpfs", codex, "--remount-ro", codex]
    assert placeholders == [codex]
    for flag in ("--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-net"):
        assert flag in args
    assert args[args.index("--cap-drop") + 1] == "ALL"
    assert args[args.index("--seccomp") + 1] == "7"
    assert args[-2:] == ["--chdir", str(w)]


def test_bwrap_args_restricted_read_and_network(tmp_path: Path) -> None:
    plan = SandboxPlan(full_read=False, full_write=False, network=True, cwd=str(tmp_path),
                       readable_roots=("/usr", "/does/not/exist"),
                       writable_roots=(str(tmp_path),), denied_paths=(str(tmp_path),))
    args, _ = build_args(plan, str(tmp_path), proc=False)
    assert args[2:4] == ["--tmpfs", "/"]
    assert args[4:7] == ["--ro-bind", "/usr", "/usr"]
    assert "/does/not/exist" not in args
    assert "--unshare-net" not in args and "--proc" not in args
    assert "000" in args


def test_placeholder_registry_removes_after_last_release(tmp_path: Path) -> None:
    reg = PlaceholderRegistry()
    p = tmp_path / ".codex"
    first = reg.acquire([str(p)])
    second = reg.acquire([str(p)])
    assert first is not None and second is not None
    p.mkdir()
    first()
    assert p.exists()
    second()
    assert not p.exists()
    # a non-empty directory is never removed
    p.mkdir()
    (p / "keep").write_text("x")
    third = reg.acquire([str(p)])
    assert third is not None
    third()
    assert (p / "keep").exists()


def test_first_missing_component(tmp_path: Path) -> None:
    assert first_missing_component(str(tmp_path)) is None
    assert first_missing_component(str(tmp_path / "a" / "b")) == str(tmp_path / "a")


# --------------------------------------------------------------------------- select


def test_select_unknown_backend_and_cache() -> None:
    with pytest.raises(ValueError, match="unknown sandbox backend"):
        select_backend("chroot")


def test_select_is_cached(backend: Any) -> None:
    assert select_backend(backend.name) is getattr(backend, "inner", backend)


# --------------------------------------------------------------------------- launcher exits


def _launcher(args: list[str], cwd: Path, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-I", "-S", LAUNCHER_PATH, *args], cwd=cwd,
                          capture_output=True, text=True, timeout=30, check=False,
                          env={"PATH": "/usr/bin:/bin"}, **kw)


@needs_landlock
def test_launcher_exit_codes(tmp_path: Path) -> None:
    base = ["--full-read", "--write", str(tmp_path)]
    assert _launcher([*base, "--", "sh", "-c", "exit 9"], tmp_path).returncode == 9
    assert _launcher([*base, "--", "no-such-program-xyz"], tmp_path).returncode == 127
    script = tmp_path / "not-exec"
    script.write_text("#!/bin/sh\n")
    assert _launcher([*base, "--", str(script)], tmp_path).returncode == 126
    bad = _launcher(["--bogus-flag", "--", "true"], tmp_path)
    assert bad.returncode == 125 and "unknown launcher flag" in bad.stderr


@needs_landlock
def test_launcher_status_pipe_reports_setup_failure(tmp_path: Path) -> None:
    r, w = os.pipe()
    try:
        res = _launcher(["--status-fd", str(w), "--full-read", "--write", str(tmp_path),
                         "--command-cwd", str(tmp_path / "missing"), "--", "true"], tmp_path,
                        pass_fds=(w,))
        os.close(w)
        w = -1
        report = json.loads(os.read(r, 65536).decode())
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
    assert res.returncode == 125
    assert report["stage"] == "chdir"
    assert "No such file" in report["error"]


@needs_landlock
def test_launcher_status_pipe_empty_on_success(tmp_path: Path) -> None:
    r, w = os.pipe()
    try:
        res = _launcher(["--status-fd", str(w), "--full-read", "--write", str(tmp_path), "--",
                         "true"], tmp_path, pass_fds=(w,))
        os.close(w)
        w = -1
        assert os.read(r, 100) == b""
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
    assert res.returncode == 0


def test_wrapped_setup_failure_is_logged_by_cleanup(tmp_path: Path, caplog: Any,
                                                    run: Any) -> None:
    try:
        backend = select_backend("landlock")
    except Exception as exc:
        pytest.skip(str(exc))
    plan = SandboxPlan(full_read=True, full_write=False, network=False, cwd=str(tmp_path),
                       writable_roots=(str(tmp_path),))
    spec = LaunchSpec(argv=["true"], cwd=str(tmp_path), env={"PATH": "/usr/bin:/bin"})
    wrapped = backend.wrap(spec, plan)
    i = wrapped.argv.index("--command-cwd")
    wrapped.argv[i + 1] = str(tmp_path / "gone")
    with caplog.at_level(logging.WARNING, logger="exec_server.sandbox"):
        proc = subprocess.run(wrapped.argv, cwd=wrapped.cwd, env=wrapped.env,
                              pass_fds=wrapped.pass_fds, capture_output=True, check=False,
                              timeout=30)
        for fd in wrapped.pass_fds:
            os.close(fd)
        assert wrapped.cleanup is not None
        wrapped.cleanup()
    assert proc.returncode == 125
    assert any("chdir" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("tty", [False, True], ids=["pipes", "pty"])
def test_arg0_is_visible_to_the_command(backend: Any, run: Any, plan_for: Any, ws: Any,
                                        tty: bool) -> None:
    from exec_server.sandbox.linux.base import LinuxBackend

    assert isinstance(backend, LinuxBackend)
    spec_argv = ["sh", "-c", "tr '\\0' ' ' < /proc/$$/cmdline; echo"]

    class _Arg0:
        name = backend.name

        def wrap(self, spec: LaunchSpec, plan: SandboxPlan) -> LaunchSpec:
            spec.arg0 = "renamed-shell"
            return backend.wrap(spec, plan)

    res = run(_Arg0(), plan_for(ws), spec_argv, cwd=ws.root, tty=tty)
    assert res.code == 0, res.output
    assert res.output.startswith("renamed-shell -c"), res.output


@needs_landlock
def test_launcher_rebinds_apply_to_inherited_cwd(tmp_path: Path) -> None:
    """Without --command-cwd the launcher still re-resolves its cwd below the rebinds."""
    (tmp_path / ".git").mkdir()
    res = _launcher(["--full-read", "--write", str(tmp_path), "--ro", str(tmp_path / ".git"),
                     "--", "sh", "-c", "echo x > .git/config"], tmp_path)
    assert res.returncode != 0
    assert not (tmp_path / ".git" / "config").exists()


@needs_landlock
@pytest.mark.skipif(os.getuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv to become an unprivileged user")
def test_launcher_as_unprivileged_user() -> None:
    """Non-root path: user+mount namespace for the rebinds, then Landlock and seccomp."""
    base = Path(tempfile.mkdtemp(prefix="exec-server-nobody-", dir="/var/tmp"))
    try:
        work, out = base / "w", base / "out"
        (work / ".git").mkdir(parents=True)
        out.mkdir()
        for p in (base, work, work / ".git", out):
            os.chown(p, 65534, 65534)
        script = ("echo ok > f; echo x > .git/c; mkdir .codex/x; echo y > ../out/z; "
                  "grep -E 'CapEff|NoNewPrivs|Seccomp:' /proc/self/status")
        res = subprocess.run(
            ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
             sys.executable, "-I", "-S", LAUNCHER_PATH, "--full-read", "--write", str(work),
             "--ro", str(work / ".git"), "--ro", str(work / ".codex"), "--", "sh", "-c", script],
            cwd=work, capture_output=True, text=True, timeout=30, check=False,
            env={"PATH": "/usr/bin:/bin"})
        assert (work / "f").read_text() == "ok\n", res.stderr
        assert not (work / ".git" / "c").exists()
        assert not (out / "z").exists()
        assert not (work / ".codex" / "x").exists()
        assert "NoNewPrivs:\t1" in res.stdout and "Seccomp:\t2" in res.stdout
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_command_env_is_exactly_the_request(backend: Any, run: Any, plan_for: Any,
                                            ws: Any) -> None:
    """Nothing of the launcher's own interpreter (e.g. PEP 538's LC_CTYPE) leaks in."""
    if backend.name == "bwrap":
        pytest.skip("bwrap sets PWD itself (as upstream's does)")
    env = {"PATH": "/usr/bin:/bin", "ONLY": "x"}
    res = run(backend, plan_for(ws), ["env"], cwd=ws.root, env=env)
    assert res.code == 0
    assert sorted(res.output.splitlines()) == ["ONLY=x", "PATH=/usr/bin:/bin"]
    kept = run(backend, plan_for(ws), ["env"], cwd=ws.root, env={**env, "LC_CTYPE": "C"})
    assert "LC_CTYPE=C" in kept.output.splitlines()


def test_read_only_knobs_cover_what_a_plan_leaves_writable() -> None:
    from exec_server.sandbox.linux.knobs import KERNEL_KNOBS, PROC_KNOBS, read_only_knobs

    existing = [k for k in KERNEL_KNOBS if os.path.lexists(k)]
    assert read_only_knobs(full_write=False, writable_roots=("/work", "/tmp")) == []
    assert sorted(read_only_knobs(full_write=True, writable_roots=())) == sorted(existing)
    assert sorted(read_only_knobs(full_write=False, writable_roots=("/",))) == sorted(existing)
    assert read_only_knobs(full_write=False, writable_roots=("/proc",)) == [
        k for k in existing if k in PROC_KNOBS]
    fresh = read_only_knobs(full_write=False, writable_roots=("/work",), fresh_proc=True)
    assert fresh == [k for k in existing if k in PROC_KNOBS]
    if os.path.isdir("/sys/fs/cgroup"):  # a root inside a knob: protected itself
        assert read_only_knobs(full_write=False, writable_roots=("/sys/fs/cgroup",)) == [
            "/sys/fs/cgroup"]
    assert read_only_knobs(full_write=False, writable_roots=("/proc/sys/nope",)) == []
