"""``exec-server`` imports only the chosen subcommand (serve's idle RSS), yet lists them all."""

from __future__ import annotations

import subprocess
import sys

_PROBE = """
import sys
from exec_server.cli.main import _build_parser
ns = _build_parser("serve").parse_args(["serve", "--listen", "stdio"])
assert ns.listen == "stdio"
import exec_server.server.app  # everything serve runs
loaded = [m for m in sys.modules if m.startswith(
    ("exec_server.cli.exec_cmd", "exec_server.cli.run", "exec_server.cli.apply_patch",
     "exec_server.client", "exec_server.patch", "websockets.asyncio",
     "httpx", "tomli_w", "jwt", "cryptography"))]
print(loaded)
"""


def test_serve_path_does_not_import_other_subcommands() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_help_lists_every_subcommand() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "exec_server", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    for name, helptext in (
        ("serve", "serve the exec-server protocol"),
        ("exec", "run a command on a remote exec-server"),
        ("run", "run a local command under the sandbox"),
        ("apply-patch", "apply a Codex-format patch"),
    ):
        assert name in out.stdout and helptext in out.stdout


def test_chosen_subcommand_gets_its_full_parser() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "exec_server", "apply-patch", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "usage: exec-server apply-patch" in out.stdout and "PATCH" in out.stdout
