"""The server settles its start-up heap (``gc.freeze``) before serving, in both modes."""

from __future__ import annotations

import subprocess
import sys
import textwrap

TIMEOUT = 30.0

#: Runs the real server with ``settle_startup_heap`` wrapped to report, on
#: stderr, how many objects it froze and whether the server had answered
#: anyone yet; then prints the URL (websocket) or reads stdin to EOF (stdio).
_PROBE = textwrap.dedent(
    """
    import asyncio, gc, sys
    from exec_server.config import ServerConfig
    from exec_server.server import app

    real = app.settle_startup_heap

    def settle():
        real()
        sys.stderr.write(f"frozen {gc.get_freeze_count()}\\n")
        sys.stderr.flush()

    app.settle_startup_heap = settle

    def announce(url):
        sys.stderr.write("announced\\n")
        sys.stderr.flush()
        import os, signal
        os.kill(os.getpid(), signal.SIGTERM)  # stop at once: this test only starts it

    asyncio.run(app.run_server(ServerConfig(listen=sys.argv[1]), announce=announce))
    """
)


def _run(listen: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, listen],
        input=b"",
        capture_output=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    return done.stderr.decode().splitlines()


def test_websocket_server_freezes_its_start_up_heap_before_announcing() -> None:
    lines = _run("ws://127.0.0.1:0")
    frozen = [line for line in lines if line.startswith("frozen ")]
    assert len(frozen) == 1
    assert int(frozen[0].split()[1]) > 10_000  # the imported modules' objects
    assert lines.index(frozen[0]) < lines.index("announced")


def test_stdio_server_freezes_its_start_up_heap() -> None:
    lines = _run("stdio")
    frozen = [line for line in lines if line.startswith("frozen ")]
    assert len(frozen) == 1
    assert int(frozen[0].split()[1]) > 10_000
    assert "announced" not in lines  # stdio has no URL to announce
