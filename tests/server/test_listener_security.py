"""The trusted listener: Origin refusal, ``/readyz``, WebSocket auth, TLS, safe defaults.

AUTH_AND_DISCOVERY.md §1-§4. The HTTP answers are checked on raw sockets (so
any header can be sent, or left out) against our server and, where the
upstream binary is installed, against upstream 0.163 with the same flags: the
two must give the same status and body.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from exec_server.client import ExecServerClient
from exec_server.client.errors import HandshakeError

TIMEOUT = 10.0
TOKEN = "tok-" + "a1b2c3d4" * 6
SECRET = b"s" * 40
UPGRADE = {
    "Connection": "Upgrade",
    "Upgrade": "websocket",
    "Sec-WebSocket-Version": "13",
    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
}


@dataclass
class Listening:
    proc: subprocess.Popen[bytes]
    url: str
    stderr: Path

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def log(self) -> str:
        return self.stderr.read_text(errors="replace")


def _read_url(proc: subprocess.Popen[bytes]) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    line = b""
    os.set_blocking(proc.stdout.fileno(), False)
    while not line.endswith(b"\n"):
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"server printed no URL (exit {proc.poll()})")
        with contextlib.suppress(BlockingIOError, TypeError):
            chunk = os.read(proc.stdout.fileno(), 200)
            if chunk:
                line += chunk
                continue
        import select

        select.select([proc.stdout.fileno()], [], [], 0.5)
    return line.decode().strip()


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., Listening]]:
    """``launch(argv_prefix, *flags)``: start a server (ours or upstream), wait for its URL."""
    started: list[subprocess.Popen[bytes]] = []

    def start(prefix: list[str], *flags: str, listen: str = "ws://127.0.0.1:0") -> Listening:
        err = tmp_path / f"stderr-{len(started)}.log"
        with open(err, "wb") as f:
            proc = subprocess.Popen(
                [*prefix, "--listen", listen, *flags],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=f,
                cwd=tmp_path,
            )
        started.append(proc)
        return Listening(proc, _read_url(proc), err)

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


OURS = [sys.executable, "-m", "exec_server", "serve"]


@pytest.fixture(params=["ours", "upstream"])
def prefix(request: pytest.FixtureRequest) -> list[str]:
    """The ``serve`` command of each server under test."""
    if request.param == "ours":
        return OURS
    binary: str = request.getfixturevalue("codex_binary")
    return [binary, "exec-server"]


def http(
    port: int,
    path: str = "/",
    headers: dict[str, str] | None = None,
    raw_headers: list[tuple[str, str]] | None = None,
    method: str = "GET",
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 request on a raw socket: (status, headers lower-cased, body)."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    lines += [f"{k}: {v}" for k, v in (raw_headers or [])]
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        status = int(status_line.split()[1])
        hdrs = {}
        for line in header_lines:
            k, _, v = line.partition(":")
            hdrs[k.strip().lower()] = v.strip()
        if status != 101:
            want = int(hdrs.get("content-length", "0"))
            while len(body) < want:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                body += chunk
    return status, hdrs, body


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def mint(claims: dict[str, Any], *, secret: bytes = SECRET, alg: str = "HS256") -> str:
    """A compact JWS by hand (AUTH_AND_DISCOVERY.md §2.3)."""
    head = b64url(json.dumps({"alg": alg, "typ": "JWT"}).encode())
    body = b64url(json.dumps(claims).encode())
    digest = {"HS256": hashlib.sha256, "HS384": hashlib.sha384, "HS512": hashlib.sha512}
    signing = f"{head}.{body}".encode()
    if alg == "none":
        return f"{head}.{body}."
    sig = hmac.new(secret, signing, digest[alg]).digest()
    return f"{head}.{body}.{b64url(sig)}"


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "ws-token"
    path.write_text(f"  {TOKEN}\n")
    return path


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "ws-secret"
    path.write_bytes(SECRET + b"\n")
    return path


# ---------------------------------------------------------------------------
# Origin, paths, readiness (§2.4, §3)
# ---------------------------------------------------------------------------

ORIGINS = [
    "http://evil.example",
    "https://evil.example:8443",
    "null",
    "http://localhost",
    "http://localhost:3000",
    "http://127.0.0.1",
    "SAME_ORIGIN",
    "ws://127.0.0.1:SERVER_PORT",
    "http://[::1]:8080",
    "file://",
    "chrome-extension://abcdefghijklmnop",
    "vscode-webview://1234",
    "",
]


def test_every_origin_is_refused_on_every_path_even_with_a_valid_token(
    launch: Callable[..., Listening], prefix: list[str], token_file: Path
) -> None:
    srv = launch(prefix, "--ws-auth", "capability-token", "--ws-token-file", str(token_file))
    for origin in ORIGINS:
        value = (
            f"http://127.0.0.1:{srv.port}"
            if origin == "SAME_ORIGIN"
            else origin.replace("SERVER_PORT", str(srv.port))
        )
        for path in ("/", "/readyz", "/elsewhere"):
            headers = {**UPGRADE, "Authorization": f"Bearer {TOKEN}", "Origin": value}
            status, _, body = http(srv.port, path, headers)
            assert (status, body) == (403, b""), (origin, path)


def test_readyz_needs_no_auth_and_other_paths_are_404_before_auth(
    launch: Callable[..., Listening], prefix: list[str], token_file: Path
) -> None:
    srv = launch(prefix, "--ws-auth", "capability-token", "--ws-token-file", str(token_file))
    assert http(srv.port, "/readyz")[::2] == (200, b"")
    assert http(srv.port, "/nope", UPGRADE)[::2] == (404, b"")
    assert http(srv.port, "/", UPGRADE, method="POST")[::2] == (
        405,
        b"Request method must be `GET`",
    )
    status, _, body = http(srv.port, "/")
    assert status == 400
    assert b"upgrade" in body.lower()


def test_readyz_and_origin_without_auth(launch: Callable[..., Listening]) -> None:
    srv = launch(OURS)
    assert http(srv.port, "/readyz")[::2] == (200, b"")
    assert http(srv.port, "/", {**UPGRADE, "Origin": "https://evil.example"})[::2] == (403, b"")
    assert http(srv.port, "/", UPGRADE)[0] == 101


async def test_origin_refused_through_a_websocket_client(launch: Callable[..., Listening]) -> None:
    """What a browser page does: an upgrade with its Origin; nothing runs."""
    srv = launch(OURS)
    with pytest.raises(Exception) as info:
        async with connect(srv.url, origin="https://evil.example"):  # type: ignore[arg-type]
            pass
    assert "403" in str(info.value)


# ---------------------------------------------------------------------------
# Capability token (§2.1, §2.2, §2.4)
# ---------------------------------------------------------------------------

CAPABILITY_CASES: list[tuple[list[tuple[str, str]], int, bytes]] = [
    ([], 401, b"missing websocket bearer token"),
    ([("Authorization", f"Basic {TOKEN}")], 401, b"invalid authorization header"),
    ([("Authorization", f"Bearer{TOKEN}")], 401, b"invalid authorization header"),
    ([("Authorization", "Bearer ")], 401, b"invalid authorization header"),
    ([("Authorization", "Bearer   ")], 401, b"invalid authorization header"),
    ([("Authorization", TOKEN)], 401, b"invalid authorization header"),
    ([("Authorization", "Bearer wrong-token")], 401, b"invalid websocket bearer token"),
    ([("Authorization", f"Bearer {TOKEN}x")], 401, b"invalid websocket bearer token"),
    ([("Authorization", f"Bearer {TOKEN[:-1]}")], 401, b"invalid websocket bearer token"),
    ([("X-Api-Key", TOKEN)], 401, b"missing websocket bearer token"),
    ([("Sec-WebSocket-Protocol", TOKEN)], 401, b"missing websocket bearer token"),
    ([("Authorization", f"Bearer {TOKEN}")], 101, b""),
    ([("Authorization", f"bearer {TOKEN}")], 101, b""),
    ([("Authorization", f"BEARER    {TOKEN}")], 101, b""),
    ([("Authorization", f"Bearer {TOKEN}"), ("Authorization", "Bearer wrong")], 101, b""),
    (
        [("Authorization", "Bearer wrong"), ("Authorization", f"Bearer {TOKEN}")],
        401,
        b"invalid websocket bearer token",
    ),
]


@pytest.mark.parametrize("source", ["file", "sha256"])
def test_capability_token_answers(
    launch: Callable[..., Listening], prefix: list[str], token_file: Path, source: str
) -> None:
    if source == "file":
        flags = ["--ws-token-file", str(token_file)]
    else:
        flags = ["--ws-token-sha256", hashlib.sha256(TOKEN.encode()).hexdigest().upper()]
    srv = launch(prefix, "--ws-auth", "capability-token", *flags)
    for extra, want_status, want_body in CAPABILITY_CASES:
        status, headers, body = http(srv.port, "/", UPGRADE, raw_headers=extra)
        assert (status, body) == (want_status, want_body), extra
        if status == 401:
            assert headers["content-type"] == "text/plain; charset=utf-8"
            assert "www-authenticate" not in headers
    # the token in the query string does not count; the digest is not a token
    assert http(srv.port, f"/?token={TOKEN}", UPGRADE)[::2] == (
        401,
        b"missing websocket bearer token",
    )
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    assert http(srv.port, "/", {**UPGRADE, "Authorization": f"Bearer {digest}"})[0] == 401


def test_log_has_one_line_per_attempt_and_never_the_token(
    launch: Callable[..., Listening], token_file: Path
) -> None:
    srv = launch(
        OURS,
        "--log-level",
        "info",
        "--ws-auth",
        "capability-token",
        "--ws-token-file",
        str(token_file),
    )
    wrong = "wrong-" + "z" * 30
    http(srv.port, "/", {**UPGRADE, "Authorization": f"Bearer {wrong}"})
    http(srv.port, "/", {**UPGRADE, "Origin": "http://x"})
    http(srv.port, "/", {**UPGRADE, "Authorization": f"Bearer {TOKEN}"})
    deadline = time.monotonic() + TIMEOUT
    while "accepted" not in srv.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    log = srv.log()
    lines = [line for line in log.splitlines() if "exec_server.transport.http" in line]
    assert len(lines) == 3, log
    assert "401 (invalid websocket bearer token)" in lines[0]
    assert "403 (Origin header)" in lines[1]
    assert "accepted" in lines[2]
    assert all("127.0.0.1:" in line for line in lines)
    assert TOKEN not in log and wrong not in log


def test_sighup_rereads_the_token_file(launch: Callable[..., Listening], token_file: Path) -> None:
    srv = launch(OURS, "--ws-auth", "capability-token", "--ws-token-file", str(token_file))
    auth = {**UPGRADE, "Authorization": f"Bearer {TOKEN}"}
    assert http(srv.port, "/", auth)[0] == 101
    token_file.write_text("the-new-token-" + "q" * 20)
    srv.proc.send_signal(signal.SIGHUP)
    new = {**UPGRADE, "Authorization": "Bearer the-new-token-" + "q" * 20}
    deadline = time.monotonic() + TIMEOUT
    while http(srv.port, "/", new)[0] != 101:
        assert time.monotonic() < deadline, srv.log()
        time.sleep(0.05)
    assert http(srv.port, "/", auth)[::2] == (401, b"invalid websocket bearer token")
    # an empty file on the next SIGHUP keeps the token in force, with an error logged
    token_file.write_text("\n")
    srv.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + TIMEOUT
    while "keeping the previous websocket auth secret" not in srv.log():
        assert time.monotonic() < deadline, srv.log()
        time.sleep(0.05)
    assert http(srv.port, "/", new)[0] == 101
    assert srv.proc.poll() is None


# ---------------------------------------------------------------------------
# Signed bearer token (§2.3)
# ---------------------------------------------------------------------------


def _jwt_cases(now: int) -> list[tuple[str, str, int, bytes]]:
    good = {"exp": now + 300, "iss": "issuer-1", "aud": "aud-1"}
    return [
        ("valid", mint(good), 101, b""),
        ("aud list", mint({**good, "aud": ["x", "aud-1"]}), 101, b""),
        ("extra claims ignored", mint({**good, "sub": 1, "iat": now + 9999, "jti": []}), 101, b""),
        ("wrong secret", mint(good, secret=b"t" * 40), 401, b"invalid websocket jwt"),
        ("HS384", mint(good, alg="HS384"), 401, b"invalid websocket jwt"),
        ("HS512", mint(good, alg="HS512"), 401, b"invalid websocket jwt"),
        ("alg none", mint(good, alg="none"), 401, b"invalid websocket jwt"),
        ("garbage", "not.a.jwt", 401, b"invalid websocket jwt"),
        ("no exp", mint({"iss": "issuer-1", "aud": "aud-1"}), 401, b"invalid websocket jwt"),
        ("string exp", mint({**good, "exp": str(now + 300)}), 401, b"invalid websocket jwt"),
        ("float exp", mint({**good, "exp": now + 300.5}), 401, b"invalid websocket jwt"),
        ("string nbf", mint({**good, "nbf": "1"}), 401, b"invalid websocket jwt"),
        ("int iss", mint({**good, "iss": 5}), 401, b"invalid websocket jwt"),
        ("int aud", mint({**good, "aud": 5}), 401, b"invalid websocket jwt"),
        ("expired", mint({**good, "exp": now - 100}), 401, b"expired websocket jwt"),
        ("not yet", mint({**good, "nbf": now + 100}), 401, b"websocket jwt is not valid yet"),
        (
            "expired beats nbf",
            mint({**good, "exp": now - 100, "nbf": now + 100}),
            401,
            b"expired websocket jwt",
        ),
        ("wrong iss", mint({**good, "iss": "other"}), 401, b"websocket jwt issuer mismatch"),
        ("no iss", mint({"exp": now + 300, "aud": "aud-1"}), 401, b"websocket jwt issuer mismatch"),
        ("wrong aud", mint({**good, "aud": "other"}), 401, b"websocket jwt audience mismatch"),
        (
            "aud list without",
            mint({**good, "aud": ["a", "b"]}),
            401,
            b"websocket jwt audience mismatch",
        ),
        (
            "no aud",
            mint({"exp": now + 300, "iss": "issuer-1"}),
            401,
            b"websocket jwt audience mismatch",
        ),
        (
            "iss beats aud",
            mint({"exp": now + 300, "iss": "x", "aud": "y"}),
            401,
            b"websocket jwt issuer mismatch",
        ),
    ]


def test_signed_bearer_token_answers(
    launch: Callable[..., Listening], prefix: list[str], secret_file: Path
) -> None:
    srv = launch(
        prefix,
        "--ws-auth",
        "signed-bearer-token",
        "--ws-shared-secret-file",
        str(secret_file),
        "--ws-issuer",
        "issuer-1",
        "--ws-audience",
        "aud-1",
        "--ws-max-clock-skew-seconds",
        "0",
    )
    for name, token, want_status, want_body in _jwt_cases(int(time.time())):
        status, _, body = http(srv.port, "/", {**UPGRADE, "Authorization": f"Bearer {token}"})
        assert (status, body) == (want_status, want_body), name


def test_skew_and_unchecked_claims(
    launch: Callable[..., Listening], prefix: list[str], secret_file: Path
) -> None:
    """Skew 300 accepts 200 s past exp; without --ws-issuer/--ws-audience any iss/aud goes."""
    srv = launch(
        prefix,
        "--ws-auth",
        "signed-bearer-token",
        "--ws-shared-secret-file",
        str(secret_file),
        "--ws-max-clock-skew-seconds",
        "300",
    )
    now = int(time.time())
    for claims, want in [
        ({"exp": now - 200, "iss": "anyone", "aud": ["whoever"]}, 101),
        ({"exp": now - 400}, 401),
        ({"exp": now + 60, "nbf": now + 200}, 101),
        ({"exp": now + 600, "nbf": now + 400}, 401),
    ]:
        auth = {**UPGRADE, "Authorization": f"Bearer {mint(claims)}"}
        assert http(srv.port, "/", auth)[0] == want, claims


async def test_a_jwt_connection_is_closed_when_the_token_expires(
    launch: Callable[..., Listening], secret_file: Path
) -> None:
    """Beyond upstream (which keeps it open): close 1008 at exp + skew."""
    srv = launch(
        OURS,
        "--ws-auth",
        "signed-bearer-token",
        "--ws-shared-secret-file",
        str(secret_file),
        "--ws-max-clock-skew-seconds",
        "0",
    )
    token = mint({"exp": int(time.time()) + 2})
    async with connect(srv.url, additional_headers={"Authorization": f"Bearer {token}"}) as ws:
        await ws.send(json.dumps({"id": 1, "method": "initialize", "params": {"clientName": "t"}}))
        assert "result" in json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))
        with pytest.raises(ConnectionClosed) as info:
            await asyncio.wait_for(ws.recv(), TIMEOUT)
    assert info.value.rcvd is not None
    assert info.value.rcvd.code == 1008
    assert info.value.rcvd.reason == "websocket jwt expired"


# ---------------------------------------------------------------------------
# Start-up refusals (§1.1) and the non-loopback rule
# ---------------------------------------------------------------------------


def _refused(argv: list[str], cwd: Path) -> tuple[int, str, str]:
    proc = subprocess.run(
        argv, cwd=cwd, capture_output=True, timeout=30, stdin=subprocess.DEVNULL, check=False
    )
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


def _startup_cases(tmp: Path) -> list[tuple[list[str], int, str]]:
    token = tmp / "tok"
    token.write_text(TOKEN)
    empty = tmp / "empty"
    empty.write_text("  \n")
    short = tmp / "short"
    short.write_text("x" * 31)
    secret = tmp / "secret"
    secret.write_bytes(SECRET)
    missing = tmp / "missing"
    cap = ["--ws-auth", "capability-token"]
    sig = ["--ws-auth", "signed-bearer-token"]
    return [
        (cap, 1, "`--ws-token-file` or `--ws-token-sha256` is required"),
        (
            [*cap, "--ws-token-file", str(token), "--ws-token-sha256", "a" * 64],
            1,
            "mutually exclusive",
        ),
        ([*cap, "--ws-token-sha256", "abc"], 1, "64-character hex"),
        ([*cap, "--ws-token-sha256", "g" * 64], 1, "64-character hex"),
        (
            [*cap, "--ws-token-file", "missing"],
            1,
            f"failed to read websocket auth secret {missing}: "
            "No such file or directory (os error 2)",
        ),
        ([*cap, "--ws-token-file", str(tmp)], 1, "Is a directory (os error 21)"),
        (
            [*cap, "--ws-token-file", str(empty)],
            1,
            f"websocket auth secret {empty} must not be empty",
        ),
        (
            [*cap, "--ws-token-file", str(token), "--ws-issuer", "x"],
            1,
            "require `--ws-auth signed-bearer-token`",
        ),
        (["--ws-token-file", str(token)], 1, "websocket auth flags require"),
        (["--ws-issuer", "x"], 1, "websocket auth flags require"),
        (sig, 1, "`--ws-shared-secret-file` is required"),
        (
            [*sig, "--ws-shared-secret-file", str(secret), "--ws-token-file", str(token)],
            1,
            "require `--ws-auth capability-token`",
        ),
        ([*sig, "--ws-shared-secret-file", str(short)], 1, "must be at least 32 bytes"),
        (
            [
                *sig,
                "--ws-shared-secret-file",
                str(secret),
                "--ws-max-clock-skew-seconds",
                str(1 << 63),
            ],
            1,
            "signed 64-bit integer",
        ),
        (["--ws-auth", "bogus"], 2, "bogus"),
        (
            [*sig, "--ws-shared-secret-file", str(secret), "--ws-max-clock-skew-seconds", "-1"],
            2,
            "-1",
        ),
        (["--concurrent-requests", "0"], 2, "zero"),
    ]


@pytest.mark.parametrize("which", ["ours", "upstream"])
def test_startup_refusals(tmp_path: Path, which: str, request: pytest.FixtureRequest) -> None:
    if which == "ours":
        base = [*OURS, "--listen", "ws://127.0.0.1:0"]
    else:
        base = [
            request.getfixturevalue("codex_binary"),
            "exec-server",
            "--listen",
            "ws://127.0.0.1:0",
        ]
    for flags, code, text in _startup_cases(tmp_path):
        rc, out, err = _refused([*base, *flags], tmp_path)
        assert rc == code, (flags, err)
        assert out == "", flags  # no URL: nothing was bound
        assert text in err, (flags, err)


def test_stdio_refuses_websocket_flags_and_runs_without_them(tmp_path: Path) -> None:
    token = tmp_path / "tok"
    token.write_text(TOKEN)
    rc, _, err = _refused(
        [
            *OURS,
            "--listen",
            "stdio",
            "--ws-auth",
            "capability-token",
            "--ws-token-file",
            str(token),
        ],
        tmp_path,
    )
    assert rc == 1 and "WebSocket auth requires a WebSocket listener, not stdio" in err
    proc = subprocess.run(
        [*OURS, "--listen", "stdio"],
        input=b'{"id":1,"method":"initialize","params":{"clientName":"t"}}\n',
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert json.loads(proc.stdout.splitlines()[0])["id"] == 1


def test_non_loopback_needs_auth_or_the_loud_flag(
    tmp_path: Path, launch: Callable[..., Listening], token_file: Path
) -> None:
    rc, out, err = _refused([*OURS, "--listen", "ws://0.0.0.0:0"], tmp_path)
    assert rc == 1 and out == ""
    assert err.count("\n") == 1, err  # one line
    assert "--ws-auth capability-token" in err and "--dangerously-allow" in err
    # with auth: serves
    srv = launch(
        OURS,
        "--ws-auth",
        "capability-token",
        "--ws-token-file",
        str(token_file),
        listen="ws://0.0.0.0:0",
    )
    assert srv.url.startswith("ws://0.0.0.0:")
    assert http(srv.port, "/", UPGRADE)[0] == 401
    # the override: serves without auth, with a warning
    srv = launch(OURS, "--dangerously-allow-unauthenticated-network", listen="ws://0.0.0.0:0")
    assert http(srv.port, "/", UPGRADE)[0] == 101
    assert "WITHOUT AUTHENTICATION" in srv.log()
    # loopback in other spellings needs neither
    srv = launch(OURS, listen="ws://127.0.0.2:0")
    assert srv.url.startswith("ws://127.0.0.2:")


# ---------------------------------------------------------------------------
# TLS and the client side
# ---------------------------------------------------------------------------


@pytest.fixture
def tls(tmp_path: Path) -> tuple[Path, Path, ssl.SSLContext]:
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    chain = tmp_path / "cert.pem"
    key = tmp_path / "key.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(chain))
    cert.private_key_pem.write_to_path(str(key))
    client = ssl.create_default_context()
    ca.configure_trust(client)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    return chain, key, client


async def test_tls_and_token_through_the_client_library(
    launch: Callable[..., Listening], token_file: Path, tls: tuple[Path, Path, ssl.SSLContext]
) -> None:
    chain, key, client_ctx = tls
    srv = launch(
        OURS,
        "--ws-auth",
        "capability-token",
        "--ws-token-file",
        str(token_file),
        "--tls-cert-file",
        str(chain),
        "--tls-key-file",
        str(key),
    )
    assert srv.url.startswith("wss://127.0.0.1:")
    async with await ExecServerClient.connect(srv.url, token=TOKEN, ssl=client_ctx) as client:
        done = await (await client.spawn(["echo", "over-tls"])).collect()
        assert done.stdout == b"over-tls\n"
        # a reconnection presents the same token and trust
        await client.reconnect()
        done = await (await client.spawn(["echo", "again"])).collect()
        assert done.stdout == b"again\n"
    with pytest.raises(HandshakeError) as refused:
        await ExecServerClient.connect(srv.url, token="wrong", ssl=client_ctx)
    assert refused.value.status == 401
    assert "invalid websocket bearer token" in str(refused.value)
    with pytest.raises(HandshakeError) as missing:
        await ExecServerClient.connect(srv.url, ssl=client_ctx)
    assert "missing websocket bearer token" in str(missing.value)
    with pytest.raises(HandshakeError) as untrusted:
        await ExecServerClient.connect(srv.url, token=TOKEN)  # system CAs only
    assert "certificate verification failed" in str(untrusted.value)
    plain = srv.url.replace("wss://", "ws://")
    with pytest.raises(HandshakeError):
        await ExecServerClient.connect(plain, token=TOKEN)


async def test_wss_client_against_a_plain_server_says_so(
    launch: Callable[..., Listening],
) -> None:
    srv = launch(OURS)
    with pytest.raises(HandshakeError) as info:
        await ExecServerClient.connect(srv.url.replace("ws://", "wss://"), connect_timeout=5)
    assert "TLS" in str(info.value)


def test_exec_cli_with_token_file_env_and_ca_file(
    launch: Callable[..., Listening],
    token_file: Path,
    tls: tuple[Path, Path, ssl.SSLContext],
    tmp_path: Path,
) -> None:
    chain, key, _ = tls
    srv = launch(
        OURS,
        "--ws-auth",
        "capability-token",
        "--ws-token-file",
        str(token_file),
        "--tls-cert-file",
        str(chain),
        "--tls-key-file",
        str(key),
    )
    base = [
        sys.executable,
        "-m",
        "exec_server",
        "exec",
        "--url",
        srv.url,
        "--ca-file",
        str(tmp_path / "ca.pem"),
    ]
    env = {k: v for k, v in os.environ.items() if k != "EXEC_SERVER_TOKEN"}

    def run(*extra: str, token: str | None = None) -> subprocess.CompletedProcess[bytes]:
        e = dict(env, EXEC_SERVER_TOKEN=token) if token is not None else env
        return subprocess.run(
            [*base, *extra],
            env=e,
            capture_output=True,
            timeout=60,
            check=False,
            stdin=subprocess.DEVNULL,
        )

    ok = run("--token-file", str(token_file), "--", "echo", "via-file")
    assert (ok.returncode, ok.stdout) == (0, b"via-file\n"), ok.stderr
    ok = run("--", "echo", "via-env", token=TOKEN)
    assert (ok.returncode, ok.stdout) == (0, b"via-env\n"), ok.stderr
    bad = run("--", "echo", "never", token="bad-token-9f8e7d")
    assert bad.returncode == 255 and bad.stdout == b""
    assert b"401" in bad.stderr and b"invalid websocket bearer token" in bad.stderr
    assert b"Traceback" not in bad.stderr and b"bad-token-9f8e7d" not in bad.stderr
    none = run("--", "echo", "never")
    assert none.returncode == 255 and b"missing websocket bearer token" in none.stderr
    no_ca = subprocess.run(
        [sys.executable, "-m", "exec_server", "exec", "--url", srv.url, "--", "true"],
        env=dict(env, EXEC_SERVER_TOKEN=TOKEN),
        capture_output=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert no_ca.returncode == 255 and b"certificate verification failed" in no_ca.stderr
    assert b"Traceback" not in no_ca.stderr


async def test_environment_manager_reads_the_token_variable(
    launch: Callable[..., Listening], token_file: Path
) -> None:
    from exec_server.client.environment import EnvironmentManager

    srv = launch(OURS, "--ws-auth", "capability-token", "--ws-token-file", str(token_file))
    manager = EnvironmentManager.from_env({"EXEC_SERVER_URL": srv.url, "EXEC_SERVER_TOKEN": TOKEN})
    assert TOKEN not in repr(manager)
    try:
        env = await manager.current()
        assert env is not None
        client = env.remote_client
        assert client is not None
        done = await (await client.spawn(["echo", "env-ok"])).collect()
        assert done.stdout == b"env-ok\n"
    finally:
        await manager.aclose()
    without = EnvironmentManager.from_env({"EXEC_SERVER_URL": srv.url})
    with pytest.raises(HandshakeError):
        await without.current()
    await without.aclose()


# ---------------------------------------------------------------------------
# --concurrent-requests (§4)
# ---------------------------------------------------------------------------


async def _order_of_answers(url: str) -> list[int]:
    """Start a long-running process, long-poll it for 1.5 s, then ask for metadata."""
    async with connect(url, max_size=None) as ws:

        async def call(msg: dict[str, Any]) -> None:
            await ws.send(json.dumps(msg))

        await call({"id": 1, "method": "initialize", "params": {"clientName": "t"}})
        assert json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))["id"] == 1
        await call({"method": "initialized", "params": {}})
        await call(
            {
                "id": 2,
                "method": "process/start",
                "params": {
                    "processId": "p",
                    "argv": ["sleep", "5"],
                    "cwd": "/",
                    "env": {},
                    "tty": False,
                    "arg0": None,
                },
            }
        )
        await call(
            {
                "id": 3,
                "method": "process/read",
                "params": {"processId": "p", "afterSeq": None, "maxBytes": None, "waitMs": 1500},
            }
        )
        await call({"id": 4, "method": "fs/getMetadata", "params": {"path": "/"}})
        order: list[int] = []
        while len(order) < 3:
            msg = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))
            if "id" in msg:
                order.append(msg["id"])
        await call({"id": 5, "method": "process/terminate", "params": {"processId": "p"}})
        return order


@pytest.mark.parametrize(
    ("count", "expected"), [("1", [2, 3, 4]), ("4", [2, 4, 3]), (None, [2, 4, 3])]
)
async def test_concurrent_requests(
    launch: Callable[..., Listening], count: str | None, expected: list[int]
) -> None:
    """1: the long poll holds the metadata request (upstream's default); 4 and our
    default: the metadata is answered while the poll waits."""
    srv = launch(OURS, *(["--concurrent-requests", count] if count else []))
    assert await _order_of_answers(srv.url) == expected
