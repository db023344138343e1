"""Every C binding lives in ``exec_server._os``, loaded once, stdlib-only.

``_os.linux`` is the only module that loads a C library: a binding elsewhere
would be a second, differently typed copy of one (a ``prctl`` read as
``long`` misses its -1), and the ``ctypes`` package would cost the helpers
started as ``python -I -S`` its set-up time.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import exec_server
from exec_server._os import linux

PACKAGE = Path(exec_server.__file__).parent
FOREIGN = {"ctypes", "_ctypes"}


def _foreign_imports(path: Path, root: Path = PACKAGE) -> list[str]:
    """``file:line module`` of each import of a ctypes module in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id == "__import__" and node.args
              and isinstance(node.args[0], ast.Constant)):
            names = [str(node.args[0].value)]
        else:
            continue
        found += [f"{path.relative_to(root)}:{node.lineno} {name}"
                  for name in names if name.split(".")[0] in FOREIGN]
    return found


def test_only_the_os_package_imports_ctypes() -> None:
    offenders = [
        hit
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] != "_os"
        for hit in _foreign_imports(path)
    ]
    assert offenders == []


def test_the_check_finds_each_form_of_import(tmp_path: Path) -> None:
    """The check itself: every way of writing the import is caught."""
    sample = tmp_path / "sample.py"
    lines = ["import ctypes", "import os, ctypes.util", "from ctypes import CDLL",
             "from _ctypes import dlopen", "def f():\n    import ctypes as c",
             "x = __import__('ctypes')"]
    for line in lines:
        sample.write_text(line + "\n")
        assert len(_foreign_imports(sample, tmp_path)) == 1, line
    sample.write_text("import os\nfrom exec_server._os.linux import c_int\n")
    assert _foreign_imports(sample, tmp_path) == []


def test_the_bindings_load_under_isolated_mode_without_the_ctypes_package() -> None:
    """As the Landlock launcher and the fs helper load it: ``python -I -S``, the
    package's parent as the only extra path, no site-packages."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "import exec_server._os.linux as l, exec_server.fs.fdops, exec_server.process.tree;"
        "assert 'ctypes' not in sys.modules, 'ctypes package loaded';"
        "print(l.machine)"
    )
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(PACKAGE.parent)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == os.uname().machine


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux syscalls")
def test_rename_exchange_swaps_two_entries_and_reports_errors() -> None:
    with tempfile.TemporaryDirectory() as d:
        Path(d, "a").write_bytes(b"A")
        Path(d, "b").write_bytes(b"B")
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            linux.rename_exchange(fd, b"a", b"b")
            assert Path(d, "a").read_bytes() == b"B"
            assert Path(d, "b").read_bytes() == b"A"
            with pytest.raises(FileNotFoundError):
                linux.rename_exchange(fd, b"a", b"missing")
            assert Path(d, "a").read_bytes() == b"B"
        finally:
            os.close(fd)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux prctl")
def test_prctl_failure_raises_with_the_kernel_errno() -> None:
    """An ``int``-returning function's -1 is negative (not 4294967295 as ``long``)."""
    with pytest.raises(OSError) as info:
        linux.set_parent_death_signal(1000)  # no such signal
    assert info.value.errno == 22  # EINVAL


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux prctl")
def test_child_subreaper_and_death_signal_take_effect_in_a_child() -> None:
    """Set in a forked child, read back with the matching ``PR_GET_*``."""
    code = (
        "import sys, signal; sys.path.insert(0, sys.argv[1]);"
        "from exec_server._os import linux as l;"
        "l.set_child_subreaper(); l.set_parent_death_signal(signal.SIGTERM);"
        "v = l.c_int(0);"
        "l.call_prctl(37, l.addressof(v)); sub = v.value;"  # PR_GET_CHILD_SUBREAPER
        "l.call_prctl(2, l.addressof(v)); print(sub, v.value)"  # PR_GET_PDEATHSIG
    )
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(PACKAGE.parent)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "15"]
