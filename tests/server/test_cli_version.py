"""``--version`` / ``-V`` on every entry point."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from exec_server import __version__

BIN = Path(sys.executable).parent


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_exec_server(flag: str) -> None:
    res = subprocess.run([sys.executable, "-m", "exec_server", flag], capture_output=True,
                         timeout=60, check=False)
    assert (res.returncode, res.stdout, res.stderr) == (
        0, f"exec-server {__version__}\n".encode(), b"")


@pytest.mark.parametrize("name", ["apply_patch", "applypatch"])
@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_apply_patch_scripts(name: str, flag: str) -> None:
    script = BIN / name
    if not script.exists():
        pytest.skip(f"console script {name} is not installed next to {sys.executable}")
    res = subprocess.run([str(script), flag], capture_output=True, timeout=60, check=False,
                         stdin=subprocess.DEVNULL)
    assert (res.returncode, res.stdout, res.stderr) == (
        0, f"{name} (exec-server) {__version__}\n".encode(), b"")
