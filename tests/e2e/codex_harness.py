"""Drive the real Codex CLI (0.163) against an exec-server, with a fake model.

There is no network here but loopback, so the model is a scripted stand-in for
the OpenAI Responses API: :class:`FakeModel` is a stdlib HTTP server on
127.0.0.1 (in a daemon thread) that answers every ``POST .../responses`` with
the next scripted turn as a Server-Sent-Events stream and records what codex
sent. codex is pointed at it through a custom model provider in
``$CODEX_HOME/config.toml`` and at the exec-server through
``$CODEX_HOME/environments.toml`` (AUTH_AND_DISCOVERY.md §0), both written by
:func:`write_codex_home`; :func:`run_codex` runs ``codex exec`` once and
returns its exit status and output.

Usage::

    with FakeModel([
        [function_call("call_1", "exec_command", {"cmd": "echo hi > proof.txt"})],
        [assistant_message("done")],
    ]) as model:
        write_codex_home(home, model_url=model.base_url,
                         exec_server_url=server.url, token=token)
        run = run_codex(codex_binary, codex_home=home, workspace=ws, prompt="go")
    outputs = model.requests[1].function_call_outputs()   # {"call_1": "...Output:\\n..."}

What codex 0.163 sends and expects (measured with this harness):

* ``POST <base_url>/responses``, JSON body with ``model``, ``input`` (the
  conversation so far: ``message``, ``function_call`` and
  ``function_call_output`` items), ``tools`` (function tools by ``name``;
  ``exec_command`` takes ``{"cmd": str, "workdir"?, "tty"?, "yield_time_ms"?,
  ...}``), ``stream: true``. One request per model turn; after a tool call the
  next request carries a ``function_call_output`` item whose ``output`` text
  ends with ``Output:\\n<the command's output>``.
* The reply: ``content-type: text/event-stream``, events ``response.created``,
  one ``response.output_item.done`` per output item (``function_call`` with
  ``call_id``/``name``/``arguments`` as a JSON string, or an assistant
  ``message`` with ``output_text`` content), then ``response.completed`` with
  the response ``id`` and a ``usage`` object. A stream that ends without
  ``response.completed`` is an error for codex.
* When the exec-server cannot be reached (a 401, say), codex drops
  ``exec_command``, ``write_stdin`` and ``view_image`` from ``tools``, logs
  ``turn environment `remote` failed to start`` and still exits 0: check the
  recorded requests, not the exit status.

When a script runs out, further requests get a final assistant message
(:data:`SCRIPT_EXHAUSTED`), so a codex that asks once too often still ends
and the extra request shows up in :attr:`FakeModel.requests`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = [
    "API_KEY_ENV",
    "SCRIPT_EXHAUSTED",
    "CodexRun",
    "E2EDirs",
    "FakeModel",
    "ModelRequest",
    "assistant_message",
    "encode_sse",
    "function_call",
    "run_codex",
    "temporary_dirs",
    "write_codex_home",
]

#: the environment variable codex reads the (dummy) provider API key from.
API_KEY_ENV = "FAKE_MODEL_API_KEY"
#: the final message a :class:`FakeModel` sends once its script is used up.
SCRIPT_EXHAUSTED = "fake model: script exhausted"
#: seconds one ``codex exec`` may take before it is killed.
CODEX_TIMEOUT = 45.0

#: an output item of a model turn (``function_call`` or ``message``).
Item = dict[str, Any]


def function_call(call_id: str, name: str, arguments: Mapping[str, Any]) -> Item:
    """A ``function_call`` output item; ``arguments`` travel as a JSON string."""
    return {
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": json.dumps(dict(arguments)),
    }


def assistant_message(text: str, item_id: str = "msg_1") -> Item:
    """An assistant ``message`` output item with one ``output_text`` part."""
    return {
        "type": "message",
        "role": "assistant",
        "id": item_id,
        "content": [{"type": "output_text", "text": text}],
    }


def encode_sse(response_id: str, items: Sequence[Item]) -> bytes:
    """One model turn as the Responses API streams it: ``response.created``,
    ``response.output_item.done`` per item, ``response.completed``."""
    usage = {
        "input_tokens": 0,
        "input_tokens_details": None,
        "output_tokens": 0,
        "output_tokens_details": None,
        "total_tokens": 0,
    }
    events: list[dict[str, Any]] = [{"type": "response.created", "response": {"id": response_id}}]
    events += [{"type": "response.output_item.done", "item": item} for item in items]
    events.append({"type": "response.completed", "response": {"id": response_id, "usage": usage}})
    return "".join(f"event: {ev['type']}\ndata: {json.dumps(ev)}\n\n" for ev in events).encode()


@dataclass(frozen=True)
class ModelRequest:
    """One request codex sent to the fake model."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any

    def tool_names(self) -> list[str]:
        """Names of the tools codex offered the model in this turn."""
        tools = self.body.get("tools", []) if isinstance(self.body, dict) else []
        return [str(t.get("name") or t.get("type")) for t in tools]

    def input_items(self, item_type: str) -> list[dict[str, Any]]:
        """The conversation items of one ``type`` (``function_call``, ``message``...)."""
        items = self.body.get("input", []) if isinstance(self.body, dict) else []
        return [it for it in items if isinstance(it, dict) and it.get("type") == item_type]

    def function_call_outputs(self) -> dict[str, str]:
        """``call_id`` -> ``output`` text of every ``function_call_output`` item."""
        out: dict[str, str] = {}
        for item in self.input_items("function_call_output"):
            output = item.get("output")
            # the output is a string, or a list of content parts for images
            out[str(item.get("call_id"))] = (
                output if isinstance(output, str) else json.dumps(output)
            )
        return out


class FakeModel:
    """A scripted Responses-API server on 127.0.0.1; a context manager.

    Args:
        turns: the output items of each successive model turn; turn ``i``
            answers the ``i``-th ``POST .../responses``.
    """

    def __init__(self, turns: Sequence[Sequence[Item]]) -> None:
        self._turns = [list(t) for t in turns]
        self._lock = threading.Lock()
        self._requests: list[ModelRequest] = []
        self.other_requests: list[ModelRequest] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="fake-model", daemon=True
        )
        self._thread.start()

    @property
    def base_url(self) -> str:
        """The provider ``base_url`` (codex appends ``/responses``)."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    @property
    def requests(self) -> list[ModelRequest]:
        """The ``/responses`` requests received so far, in order."""
        with self._lock:
            return list(self._requests)

    def _next_turn(self, request: ModelRequest) -> tuple[str, list[Item]]:
        with self._lock:
            index = len(self._requests)
            self._requests.append(request)
        if index < len(self._turns):
            return f"resp_{index + 1}", self._turns[index]
        return f"resp_{index + 1}", [assistant_message(SCRIPT_EXHAUSTED)]

    def _record_other(self, request: ModelRequest) -> None:
        with self._lock:
            self.other_requests.append(request)

    def close(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(10)
        self._server.server_close()

    def __enter__(self) -> FakeModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _handler_for(model: FakeModel) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _request(self) -> ModelRequest:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body: Any
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode(errors="replace")
            headers = {k.lower(): v for k, v in self.headers.items()}
            return ModelRequest(self.command, self.path, headers, body)

        def _send(self, status: int, content_type: str, data: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            request = self._request()
            if not self.path.rstrip("/").endswith("/responses"):
                model._record_other(request)
                self._send(404, "text/plain", b"not found")
                return
            response_id, items = model._next_turn(request)
            self._send(200, "text/event-stream", encode_sse(response_id, items))

        def do_GET(self) -> None:
            model._record_other(self._request())
            self._send(404, "text/plain", b"not found")

        def log_message(self, format: str, *args: Any) -> None:
            pass  # requests are recorded, not printed

    return Handler


@dataclass(frozen=True)
class E2EDirs:
    """Where one codex run lives: ``codex_home`` and ``workspace`` under ``root``."""

    root: Path
    codex_home: Path
    workspace: Path


@contextlib.contextmanager
def temporary_dirs() -> Iterator[E2EDirs]:
    """Fresh :class:`E2EDirs`, removed on exit whatever codex left in them."""
    with tempfile.TemporaryDirectory(prefix="codex-e2e-") as name:
        root = Path(name).resolve()
        dirs = E2EDirs(root, root / "codex_home", root / "workspace")
        dirs.codex_home.mkdir()
        dirs.workspace.mkdir()
        yield dirs


def write_codex_home(
    home: Path,
    *,
    model_url: str,
    exec_server_url: str | None = None,
    token: str | None = None,
) -> None:
    """Write ``config.toml`` (the fake model as provider ``fake``) and, with
    ``exec_server_url``, ``environments.toml`` making that server codex's only
    environment, with ``auth_bearer_token = token`` when a token is given.

    Plugins, apps and the update check are off so codex tries no outside host.
    """
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        f"""model = "fake-model"
model_provider = "fake"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[model_providers.fake]
name = "fake"
base_url = {json.dumps(model_url)}
wire_api = "responses"
env_key = "{API_KEY_ENV}"
request_max_retries = 0
stream_max_retries = 0

[features]
plugins = false
remote_plugin = false
apps = false

[analytics]
enabled = false
"""
    )
    if exec_server_url is None:
        return
    lines = [
        'default = "remote"',
        "include_local = false",
        "",
        "[[environments]]",
        'id = "remote"',
        f"url = {json.dumps(exec_server_url)}",
    ]
    if token is not None:
        # a TOML basic string has JSON's escapes for the characters a token may hold
        lines.append(f"auth_bearer_token = {json.dumps(token)}")
    (home / "environments.toml").write_text("\n".join(lines) + "\n")


@dataclass
class CodexRun:
    """The outcome of one ``codex exec``."""

    returncode: int
    stdout: str
    stderr: str
    argv: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return (
            f"codex exited {self.returncode}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"
        )


def run_codex(
    codex_binary: str,
    *,
    codex_home: Path,
    workspace: Path,
    prompt: str,
    env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
    timeout: float = CODEX_TIMEOUT,
) -> CodexRun:
    """Run ``codex exec`` once in ``workspace`` and wait for it.

    codex gets a clean environment: ``PATH``, ``HOME`` (``codex_home``'s
    parent, so nothing of the real user's is read), ``CODEX_HOME``, the dummy
    API key and ``RUST_LOG=warn``, plus ``env``. It runs in its own session;
    whatever of that session is left at the end (or at the timeout, which
    raises ``subprocess.TimeoutExpired``) is killed and codex is reaped.
    """
    argv = [
        codex_binary,
        "exec",
        "--skip-git-repo-check",
        "-C",
        str(workspace),
        *extra_args,
        prompt,
    ]
    child_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(codex_home.parent),
        "CODEX_HOME": str(codex_home),
        API_KEY_ENV: "dummy-key",
        "RUST_LOG": "warn",
        "NO_COLOR": "1",
        **(env or {}),
    }
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env,
        cwd=workspace,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except BaseException:
        _kill_session(proc.pid)
        proc.kill()
        proc.communicate()
        raise
    _kill_session(proc.pid)
    return CodexRun(
        proc.returncode, stdout.decode(errors="replace"), stderr.decode(errors="replace"), argv
    )


def _kill_session(sid: int) -> None:
    """SIGKILL every process left in session ``sid`` (codex's helpers)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.getsid(int(name)) == sid:
                os.kill(int(name), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
