"""``exec-server run``: a local command confined end to end, its status passed through."""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from exec_server.sandbox.select import SandboxUnavailableError, select_backend


def _exec_server(args: list[str], cwd: Path, tmpdir: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "TMPDIR": str(tmpdir)}
    return subprocess.run([sys.executable, "-m", "exec_server", "run", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=60, check=False,
                          stdin=subprocess.DEVNULL)


@pytest.fixture(params=["bwrap", "landlock"])
def backend_name(request: pytest.FixtureRequest) -> str:
    try:
        select_backend(request.param)
    except SandboxUnavailableError as exc:
        pytest.skip(str(exc))
    return str(request.param)


@pytest.fixture
def dirs(tmp_path: Path) -> Iterator[tuple[Path, Path, Path]]:
    """(cwd, a directory outside every writable root, $TMPDIR).

    workspace-write makes /tmp writable, so "outside" lives under /var/tmp.
    """
    work, tmpdir = tmp_path / "work", tmp_path / "tmp"
    work.mkdir()
    tmpdir.mkdir()
    outside = Path(tempfile.mkdtemp(prefix="exec-server-test-", dir="/var/tmp"))
    try:
        yield work, outside, tmpdir
    finally:
        shutil.rmtree(outside, ignore_errors=True)


def test_workspace_write_confines_and_passes_status(backend_name: str,
                                                     dirs: tuple[Path, Path, Path]) -> None:
    work, outside, tmpdir = dirs
    (work / ".git").mkdir()
    script = f"echo in > inside; echo out > {outside}/x; echo c > .git/config; exit 7"
    res = _exec_server(["--backend", backend_name, "--sandbox", "workspace-write", "--",
                        "sh", "-c", script], work, tmpdir)
    assert res.returncode == 7, res.stderr
    assert (work / "inside").read_text() == "in\n"
    assert not (outside / "x").exists()
    assert not (work / ".git" / "config").exists()


def test_writable_root_flag_grants_writes(backend_name: str,
                                          dirs: tuple[Path, Path, Path]) -> None:
    work, outside, tmpdir = dirs
    res = _exec_server(["--backend", backend_name, "--sandbox", "workspace-write",
                        "--writable-root", str(outside), "--", "sh", "-c",
                        f"echo ok > {outside}/granted"], work, tmpdir)
    assert res.returncode == 0, res.stderr
    assert (outside / "granted").read_text() == "ok\n"


def test_read_only_denies_cwd_writes(backend_name: str, dirs: tuple[Path, Path, Path]) -> None:
    work, _, tmpdir = dirs
    res = _exec_server(["--backend", backend_name, "--", "touch", "nope"], work, tmpdir)
    assert res.returncode != 0
    assert not (work / "nope").exists()


def test_signal_death_reported_as_128_plus_signal(backend_name: str,
                                                  dirs: tuple[Path, Path, Path]) -> None:
    work, _, tmpdir = dirs
    res = _exec_server(["--backend", backend_name, "--", "sh", "-c", "kill -TERM $$"], work,
                       tmpdir)
    assert res.returncode == 128 + 15


def test_missing_program_is_127(backend_name: str, dirs: tuple[Path, Path, Path]) -> None:
    work, _, tmpdir = dirs
    res = _exec_server(["--backend", backend_name, "--", "no-such-program-xyz"], work, tmpdir)
    assert res.returncode == 127


def test_relative_writable_root_is_refused(dirs: tuple[Path, Path, Path]) -> None:
    work, _, tmpdir = dirs
    res = _exec_server(["--sandbox", "workspace-write", "--writable-root", "rel", "--",
                        "true"], work, tmpdir)
    assert res.returncode == 125
    assert "writable-root" in res.stderr


def test_missing_command_is_usage_error(dirs: tuple[Path, Path, Path]) -> None:
    work, _, tmpdir = dirs
    res = _exec_server([], work, tmpdir)
    assert res.returncode == 2
    assert "missing command" in res.stderr


def test_danger_full_access_runs_directly(dirs: tuple[Path, Path, Path]) -> None:
    work, outside, tmpdir = dirs
    res = _exec_server(["--sandbox", "danger-full-access", "--", "sh", "-c",
                        f"echo y > {outside}/free"], work, tmpdir)
    assert res.returncode == 0, res.stderr
    assert (outside / "free").exists()


def test_probe_reports_backends(dirs: tuple[Path, Path, Path]) -> None:
    work, _, tmpdir = dirs
    res = _exec_server(["--probe"], work, tmpdir)
    assert res.returncode == 0
    assert '"bwrap"' in res.stdout and '"landlock"' in res.stdout
    assert os.path.isdir(work)


def _on_terminal(args: list[str], cwd: Path, tmpdir: Path, *, keys: bytes,
                 ready: bytes = b"ready") -> tuple[int, bytes]:
    """Run ``exec-server run ARGS`` as a terminal's foreground job; type ``keys``
    once it printed ``ready``; return (exit status, everything it printed).

    The terminal line discipline turns ^C into SIGINT for the whole foreground
    process group, exactly as for a user at a shell prompt.
    """
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "TMPDIR": str(tmpdir)}
    master, slave = os.openpty()
    try:
        proc = subprocess.Popen(
            ["setsid", "--ctty", sys.executable, "-m", "exec_server", "run", *args],
            cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave)
    finally:
        os.close(slave)
    out = b""
    sent = False
    try:
        deadline = 60.0
        while True:
            ready_fds, _, _ = select.select([master], [], [], deadline)
            assert ready_fds, f"no output in time: {out!r}"
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: every holder of the terminal is gone
                break
            if not chunk:
                break
            out += chunk
            if not sent and ready in out:
                os.write(master, keys)
                sent = True
        return proc.wait(timeout=60), out
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs util-linux setsid")
def test_ctrl_c_interrupts_the_command(backend_name: str,
                                       dirs: tuple[Path, Path, Path]) -> None:
    work, _, tmpdir = dirs
    # "ready" only once SIGINT has its default action: a shell's fork-to-exec window
    # (its own handler still installed in the child) would lose a ^C typed right then.
    # (Python turns an inherited default into its KeyboardInterrupt handler and
    # leaves an inherited SIG_IGN alone: only the former goes back to the default.)
    script = ("import signal, time\n"
              "if signal.getsignal(signal.SIGINT) is signal.default_int_handler:\n"
              "    signal.signal(signal.SIGINT, signal.SIG_DFL)\n"
              "print('ready', flush=True); time.sleep(300); print('not-interrupted')")
    code, out = _on_terminal(["--backend", backend_name, "--", sys.executable, "-c", script],
                             work, tmpdir, keys=b"\x03")
    assert code == 130, out
    assert b"not-interrupted" not in out


@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs util-linux setsid")
def test_command_has_the_terminal(backend_name: str, dirs: tuple[Path, Path, Path]) -> None:
    """The command keeps our session: /dev/tty opens, nothing is ignored."""
    work, _, tmpdir = dirs
    code, out = _on_terminal(["--backend", backend_name, "--", "sh", "-c",
                              "echo ready; grep SigIgn /proc/self/status; echo tty > /dev/tty"],
                             work, tmpdir, keys=b"")
    assert code == 0, out
    assert b"SigIgn:\t0000000000000000" in out
    assert b"tty" in out.split(b"SigIgn")[1]


@pytest.mark.parametrize(("command", "code", "message"), [
    (["no-such-program-xyz"], 127, "no-such-program-xyz: command not found"),
    (["./missing"], 127, "./missing: No such file or directory"),
    (["/etc/passwd"], 126, "/etc/passwd: Permission denied"),
    (["/etc"], 126, "/etc: Is a directory"),
    ([""], 127, "empty command name"),
])
def test_unrunnable_command_one_message(backend_name: str, dirs: tuple[Path, Path, Path],
                                        command: list[str], code: int, message: str) -> None:
    work, _, tmpdir = dirs
    res = _exec_server(["--backend", backend_name, "--", *command], work, tmpdir)
    assert (res.returncode, res.stderr) == (code, f"exec-server run: {message}\n")


def test_missing_writable_root_is_refused(dirs: tuple[Path, Path, Path]) -> None:
    work, outside, tmpdir = dirs
    res = _exec_server(["--sandbox", "workspace-write", "--writable-root",
                        str(outside / "nonexistent"), "--", "true"], work, tmpdir)
    assert res.returncode == 125
    assert res.stderr == (f"exec-server run: --writable-root {outside}/nonexistent: "
                          "no such directory\n")


def test_deleted_cwd_is_one_line(dirs: tuple[Path, Path, Path]) -> None:
    work, _, tmpdir = dirs
    gone = work / "gone"
    gone.mkdir()
    script = (f"cd {gone} && rmdir {gone} && exec {sys.executable} -m exec_server run -- true")
    res = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60,
                         check=False, env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmpdir)})
    assert res.returncode == 125
    assert res.stderr.startswith("exec-server run: the current directory is gone")
    assert "Traceback" not in res.stderr


@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs util-linux setsid")
def test_terminal_injection_is_refused(backend_name: str,
                                       dirs: tuple[Path, Path, Path]) -> None:
    """The command shares our terminal (no --new-session), so TIOCSTI must be refused:
    the seccomp filter answers EPERM and nothing reaches the terminal's input."""
    work, _, tmpdir = dirs
    script = ("import fcntl, termios\n"
              "try:\n"
              "    fcntl.ioctl(0, termios.TIOCSTI, b'Z')\n"
              "    print('injected')\n"
              "except PermissionError:\n"
              "    print('refused')\n")
    code, out = _on_terminal(["--backend", backend_name, "--", sys.executable, "-c", script],
                             work, tmpdir, keys=b"")
    assert code == 0, out
    assert b"refused" in out and b"injected" not in out
