"""The command-line program, run as subprocesses (§10, §11).

Forms: the ``apply_patch``/``applypatch`` console scripts, an argv[0] alias
(a symlink named ``apply_patch`` to the ``exec-server`` script), the hidden
``--codex-run-as-apply-patch`` flag and ``exec-server apply-patch``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
PATCH = (
    "*** Begin Patch\n*** Add File: hello.txt\n+hi\n*** Update File: a\n@@\n-x\n+y\n*** End Patch"
)
SUCCESS = "Success. Updated the following files:\nA hello.txt\nM a\n"
USAGE = "Usage: apply_patch 'PATCH'\n       echo 'PATCH' | apply_patch\n"


def run(
    argv: Sequence[str | bytes], cwd: Path, stdin: bytes | None = b""
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(argv, cwd=cwd, input=stdin, capture_output=True, timeout=60)


def script(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.skip(f"console script {name} is not installed next to {sys.executable}")
    return str(path)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "a").write_text("x\n")
    return tmp_path


def forms() -> list[tuple[str, list[str]]]:
    return [
        ("apply_patch", [script("apply_patch")]),
        ("applypatch", [script("applypatch")]),
        ("hidden flag", [sys.executable, "-m", "exec_server", "--codex-run-as-apply-patch"]),
        ("subcommand", [sys.executable, "-m", "exec_server", "apply-patch"]),
    ]


@pytest.mark.parametrize("form", ["apply_patch", "applypatch", "hidden flag", "subcommand"])
def test_patch_argument(work: Path, form: str) -> None:
    prefix = dict(forms())[form]
    proc = run([*prefix, PATCH], work)
    assert (proc.returncode, proc.stdout.decode(), proc.stderr.decode()) == (0, SUCCESS, "")
    assert (work / "hello.txt").read_text() == "hi\n"
    assert (work / "a").read_text() == "y\n"


@pytest.mark.parametrize("form", ["apply_patch", "applypatch", "subcommand"])
def test_patch_on_stdin(work: Path, form: str) -> None:
    prefix = dict(forms())[form]
    proc = run(prefix, work, stdin=PATCH.encode())
    assert (proc.returncode, proc.stdout.decode(), proc.stderr.decode()) == (0, SUCCESS, "")
    assert (work / "a").read_text() == "y\n"


def test_argument_preferred_to_stdin(work: Path) -> None:
    proc = run([script("apply_patch"), PATCH], work, stdin=b"garbage")
    assert proc.returncode == 0
    assert proc.stdout.decode() == SUCCESS


def test_argv0_alias_symlink(work: Path, tmp_path: Path) -> None:
    """A symlink named apply_patch to the exec-server executable enters the patch tool."""
    alias_dir = tmp_path / "aliases"
    alias_dir.mkdir()
    (alias_dir / "apply_patch").symlink_to(script("exec-server"))
    proc = run([str(alias_dir / "apply_patch"), PATCH], work)
    assert (proc.returncode, proc.stdout.decode(), proc.stderr.decode()) == (0, SUCCESS, "")
    (alias_dir / "apply-patch").symlink_to(script("exec-server"))
    hyphen = run([str(alias_dir / "apply-patch"), PATCH], work)
    assert hyphen.returncode == 2  # not an alias: argparse rejects the stray argument


@pytest.mark.parametrize(
    ("form", "stdin", "code", "stderr"),
    [
        ("apply_patch", b"", 2, USAGE),
        ("applypatch", b"", 2, USAGE),
        ("subcommand", b"", 2, USAGE),
        ("apply_patch", b"\xff", 1,
         "Error: Failed to read PATCH from stdin.\nstream did not contain valid UTF-8\n"),
        ("apply_patch", b"\n", 1,
         "Invalid patch: The last line of the patch must be '*** End Patch'\n"),
        ("hidden flag", PATCH.encode(), 1,
         "Error: --codex-run-as-apply-patch requires a UTF-8 PATCH argument.\n"),
    ],
)  # fmt: skip
def test_stdin_and_usage(work: Path, form: str, stdin: bytes, code: int, stderr: str) -> None:
    proc = run(dict(forms())[form], work, stdin=stdin)
    assert (proc.returncode, proc.stdout.decode(), proc.stderr.decode()) == (code, "", stderr)
    assert (work / "a").read_text() == "x\n"


def test_argument_errors(work: Path) -> None:
    two = run([script("apply_patch"), PATCH, "extra"], work)
    assert (two.returncode, two.stdout, two.stderr.decode()) == (
        2,
        b"",
        "Error: apply_patch accepts exactly one argument.\n",
    )
    bad = run([script("apply_patch"), b"x\xff"], work)
    assert (bad.returncode, bad.stderr.decode()) == (
        1,
        "Error: apply_patch requires a UTF-8 PATCH argument.\n",
    )
    hidden = [sys.executable, "-m", "exec_server", "--codex-run-as-apply-patch"]
    bad_hidden = run([*hidden, b"x\xff"], work)
    assert (bad_hidden.returncode, bad_hidden.stderr.decode()) == (
        1,
        "Error: --codex-run-as-apply-patch requires a UTF-8 PATCH argument.\n",
    )
    # extra arguments after the hidden flag's PATCH are ignored
    extra = run([*hidden, PATCH, "ignored"], work)
    assert (extra.returncode, extra.stdout.decode()) == (0, SUCCESS)
    assert (work / "a").read_text() == "y\n"


def test_failure_output_and_exit_code(work: Path) -> None:
    patch = (
        "*** Begin Patch\n*** Add File: made.txt\n+1\n*** Update File: nope\n@@\n-a\n+b\n"
        "*** End Patch"
    )
    proc = run([script("applypatch"), patch], work)
    assert proc.returncode == 1
    assert proc.stdout == b""
    nope = Path(os.path.realpath(work)) / "nope"
    assert proc.stderr.decode() == (
        f"Failed to read file to update {nope}: No such file or directory (os error 2)\n"
    )
    assert (work / "made.txt").read_text() == "1\n"  # no rollback


def test_parse_error_and_no_hunks(work: Path) -> None:
    proc = run([script("apply_patch"), "*** Begin Patch\n*** End Patch"], work)
    assert (proc.returncode, proc.stdout, proc.stderr.decode()) == (
        1,
        b"",
        "No files were modified.\n",
    )
    bad = run([script("apply_patch"), "nonsense"], work)
    assert (bad.returncode, bad.stderr.decode()) == (
        1,
        "Invalid patch: The first line of the patch must be '*** Begin Patch'\n",
    )


def test_current_directory_gone(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    shell = f'cd "{gone}" && rmdir "{gone}" && exec "$0" "$1"'
    proc = run(["sh", "-c", shell, script("apply_patch"), PATCH], tmp_path)
    assert (proc.returncode, proc.stdout, proc.stderr.decode()) == (
        1,
        b"",
        "Error: Failed to determine current directory.\nNo such file or directory (os error 2)\n",
    )


@pytest.mark.skipif(not Path("/usr/bin/setsid").exists(), reason="needs util-linux setsid")
def test_ctrl_c_while_waiting_on_a_terminal(work: Path) -> None:
    """Bare ``apply_patch`` on a terminal waits for a patch; ^C ends it with 130, no traceback."""
    import select
    import time

    master, slave = os.openpty()
    try:
        proc = subprocess.Popen(["/usr/bin/setsid", "--ctty", script("apply_patch")], cwd=work,
                                stdin=slave, stdout=slave, stderr=slave)
    finally:
        os.close(slave)
    try:
        deadline = time.monotonic() + 30
        # blocked in read(0, ...): /proc/PID/syscall starts with "0 0x0" (x86_64 and aarch64
        # number read differently, so match the fd argument after the number)
        while True:
            child = [int(p) for p in (Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
                                      .read_text().split())]
            target = child[0] if child else proc.pid
            with open(f"/proc/{target}/syscall") as f:
                fields = f.read().split()
            if len(fields) > 1 and fields[0] in ("0", "63") and fields[1] == "0x0":
                break
            assert time.monotonic() < deadline, fields
            select.select([], [], [], 0.02)
        os.write(master, b"\x03")
        out = b""
        while True:
            ready, _, _ = select.select([master], [], [], 30)
            assert ready
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        assert proc.wait(timeout=30) == 130, out
        assert b"Traceback" not in out
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
