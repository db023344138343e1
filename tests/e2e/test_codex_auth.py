"""The real Codex CLI 0.163 reaching our authenticated server (issue 26).

codex is pointed at the server through ``environments.toml``'s
``auth_bearer_token`` (AUTH_AND_DISCOVERY.md §0) and at a scripted fake model
(``codex_harness``) whose first turn calls ``exec_command`` and whose second
turn ends the conversation. The command prints a value that exists only in the
server's environment and writes it to a marker file in the workspace, so its
output proves it ran as a child of our server. ``codex exec`` exits 0 even when
the server refuses it, so every test checks the tool call, not the exit status.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from codex_harness import (
    CodexRun,
    E2EDirs,
    FakeModel,
    ModelRequest,
    assistant_message,
    function_call,
    run_codex,
    write_codex_home,
)

pytestmark = [pytest.mark.upstream, pytest.mark.timeout(60)]

#: set only in the server's environment; the command echoes it.
PROOF_VAR = "EXEC_SERVER_E2E_PROOF"
MARKER = "e2e-marker.txt"
CALL_ID = "call_e2e_1"
FINAL = "fake model: the command has run"
REMOTE_TOOLS = {"exec_command", "write_stdin", "view_image"}


def _script() -> list[list[dict[str, Any]]]:
    command = f'printf "%s\\n" "${PROOF_VAR}" > {MARKER} && echo "ran:${PROOF_VAR}"'
    return [
        [function_call(CALL_ID, "exec_command", {"cmd": command, "yield_time_ms": 10000})],
        [assistant_message(FINAL)],
    ]


def _start(server_factory: Callable[..., Any], proof: str, *auth_args: str) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEX_")}
    env[PROOF_VAR] = proof
    return server_factory(*auth_args, "--log-level", "info", env=env)


def _drive(
    codex_binary: str, dirs: E2EDirs, server_url: str, token: str
) -> tuple[CodexRun, list[ModelRequest]]:
    with FakeModel(_script()) as model:
        write_codex_home(
            dirs.codex_home, model_url=model.base_url, exec_server_url=server_url, token=token
        )
        run = run_codex(
            codex_binary, codex_home=dirs.codex_home, workspace=dirs.workspace, prompt="run it"
        )
        return run, model.requests


def _assert_tool_ran_on_server(
    run: CodexRun, requests: list[ModelRequest], dirs: E2EDirs, proof: str
) -> None:
    assert run.returncode == 0, run
    assert len(requests) == 2, [r.body for r in requests]
    assert "exec_command" in requests[0].tool_names(), run
    output = requests[1].function_call_outputs()[CALL_ID]
    assert f"ran:{proof}" in output, output
    assert "Process exited with code 0" in output, output
    assert (dirs.workspace / MARKER).read_text() == proof + "\n"
    assert FINAL in run.stdout, run


def _write_secret(path: Path, value: str) -> Path:
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


def test_codex_with_the_token_runs_the_command_on_our_server(
    no_leaks: None, codex_binary: str, server_factory: Callable[..., Any], e2e_dirs: E2EDirs
) -> None:
    token = secrets.token_urlsafe(32)
    proof = secrets.token_hex(12)
    token_file = _write_secret(e2e_dirs.root / "ws-token", token)
    srv = _start(
        server_factory, proof, "--ws-auth", "capability-token", "--ws-token-file", str(token_file)
    )

    run, requests = _drive(codex_binary, e2e_dirs, srv.url, token)

    _assert_tool_ran_on_server(run, requests, e2e_dirs, proof)
    log = srv.stderr_text()
    assert "accepted (capability-token)" in log, log
    assert token not in log


def test_codex_with_a_wrong_token_is_refused_and_runs_nothing(
    no_leaks: None, codex_binary: str, server_factory: Callable[..., Any], e2e_dirs: E2EDirs
) -> None:
    token = secrets.token_urlsafe(32)
    wrong = secrets.token_urlsafe(32)
    proof = secrets.token_hex(12)
    token_file = _write_secret(e2e_dirs.root / "ws-token", token)
    srv = _start(
        server_factory, proof, "--ws-auth", "capability-token", "--ws-token-file", str(token_file)
    )

    run, requests = _drive(codex_binary, e2e_dirs, srv.url, wrong)

    # upstream's behaviour: the turn goes on without the environment's tools
    assert run.returncode == 0, run
    assert "turn environment `remote` failed to start" in run.stderr, run
    assert "401 Unauthorized" in run.stderr, run
    assert len(requests) == 2, [r.body for r in requests]
    for request in requests:
        assert not REMOTE_TOOLS & set(request.tool_names()), request.tool_names()
    # the model's call of a tool codex no longer offers is answered by codex itself
    assert requests[1].function_call_outputs() == {CALL_ID: "unsupported call: exec_command"}
    assert not (e2e_dirs.workspace / MARKER).exists()
    assert FINAL in run.stdout, run
    log = srv.stderr_text()
    assert "401 (invalid websocket bearer token)" in log, log
    assert "accepted" not in log, log
    assert wrong not in log and token not in log


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _hs256_jwt(secret: bytes, claims: dict[str, Any]) -> str:
    """An HS256 JWT made by hand (RFC 7519), independent of the server's library."""
    header = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    payload = _b64url(json.dumps(claims).encode())
    signing_input = f"{header}.{payload}".encode()
    signature = hmac.new(secret, signing_input, hashlib.sha256).digest()
    return f"{header}.{payload}.{_b64url(signature)}"


def test_codex_with_a_signed_jwt_runs_the_command_on_our_server(
    no_leaks: None, codex_binary: str, server_factory: Callable[..., Any], e2e_dirs: E2EDirs
) -> None:
    secret = secrets.token_urlsafe(48)
    proof = secrets.token_hex(12)
    secret_file = _write_secret(e2e_dirs.root / "ws-secret", secret)
    srv = _start(
        server_factory, proof,
        "--ws-auth", "signed-bearer-token",
        "--ws-shared-secret-file", str(secret_file),
        "--ws-issuer", "codex-e2e",
        "--ws-audience", "exec-server",
    )  # fmt: skip
    now = int(time.time())
    claims = {"iss": "codex-e2e", "aud": "exec-server", "sub": "e2e", "iat": now, "exp": now + 300}
    jwt = _hs256_jwt(secret.encode(), claims)

    run, requests = _drive(codex_binary, e2e_dirs, srv.url, jwt)

    _assert_tool_ran_on_server(run, requests, e2e_dirs, proof)
    log = srv.stderr_text()
    assert "accepted (signed-bearer-token)" in log, log
    assert jwt not in log and secret not in log
