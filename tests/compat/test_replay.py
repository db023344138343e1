"""Replay the recorded Codex CLI 0.163 sessions against our server.

For every recording in ``shared/spec/codex-0.163-recordings`` (copied beside this
file, ``codex-0.163-recordings/``) we start a real
``exec-server serve`` whose cwd is a fresh scenario directory, rewrite the
recorded paths to that directory, send the client's side of the conversation
in the recorded order (pipelining where codex pipelined, waiting where codex
waited), and check what the client depends on (CLIENT_COMPAT.md §0.3, §7):
response kind and code per id, result shapes, notification order
(output…, exited, closed last; one seq counter), output text, and the
effects on disk.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect

#: A copy of ``shared/spec/codex-0.163-recordings`` kept with the tests, so they run
#: wherever the repository is cloned (CI clones it without the spec beside it).
RECORDINGS = Path(__file__).resolve().parent / "codex-0.163-recordings"
PLACEHOLDER_ROOT = "/srv/data/harness/final"
MARKER = "replay-marker-7f3a"
TIMEOUT = 20.0


@pytest.fixture
def replay_base() -> Iterator[Path]:
    """A scratch dir outside /tmp (writable under workspace-write; the recorded root was not)."""
    base = Path(tempfile.mkdtemp(prefix="exec-server-replay-", dir="/var/tmp"))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _recordings() -> list[Path]:
    found = sorted(RECORDINGS.glob("*.rpc.jsonl"))
    assert found, f"no recordings in {RECORDINGS}"
    return found


def _rewrite(value: Any, old: str, new: str) -> Any:
    """Substitute the scenario prefix everywhere, including inside base64 payloads."""
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, list):
        return [_rewrite(v, old, new) for v in value]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if key in ("chunk", "dataBase64") and isinstance(item, str):
                raw = base64.b64decode(item)
                try:
                    text = raw.decode()
                except UnicodeDecodeError:
                    out[key] = item
                    continue
                out[key] = base64.b64encode(text.replace(old, new).encode()).decode()
            else:
                out[key] = _rewrite(item, old, new)
        return out
    return value


@dataclass
class Recording:
    name: str
    frames: list[dict[str, Any]]
    methods: dict[Any, str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path, root: Path) -> Recording:
        name = path.name.removesuffix(".rpc.jsonl")
        old = f"{PLACEHOLDER_ROOT}/{name}"
        frames = []
        methods: dict[Any, str] = {}
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if "dir" not in record:
                continue
            msg = _rewrite(record["msg"], old, str(root))
            frames.append({"dir": record["dir"], "msg": msg})
            if record["dir"] == "c2s" and "id" in msg:
                methods[msg["id"]] = msg["method"]
        return cls(name, frames, methods)

    def c2s_requests(self) -> Iterator[dict[str, Any]]:
        for frame in self.frames:
            if frame["dir"] == "c2s" and "id" in frame["msg"]:
                yield frame["msg"]


class Peer:
    """Collects everything the server sends; lets the replay wait on ids and events."""

    def __init__(self) -> None:
        self.responses: dict[Any, dict[str, Any]] = {}
        self.notifications: list[dict[str, Any]] = []
        self.changed = asyncio.Condition()

    async def pump(self, ws: Any) -> None:
        async for text in ws:
            msg = json.loads(text)
            async with self.changed:
                if "id" in msg and ("result" in msg or "error" in msg):
                    self.responses[msg["id"]] = msg
                else:
                    self.notifications.append(msg)
                self.changed.notify_all()

    async def wait_for(self, predicate: Any, what: str) -> None:
        async def _wait() -> None:
            async with self.changed:
                await self.changed.wait_for(predicate)

        try:
            await asyncio.wait_for(_wait(), TIMEOUT)
        except TimeoutError:
            pytest.fail(f"timed out waiting for {what}")

    def closed(self, process_id: str) -> bool:
        return any(
            n["method"] == "process/closed" and n["params"]["processId"] == process_id
            for n in self.notifications
        )


def _prepare_workspace(root: Path) -> None:
    workspace = root / "workspace"
    workspace.mkdir(parents=True)
    if root.name == "skills":
        _prepare_skill(workspace)
    (workspace / "edit_me.txt").write_text("alpha\nbeta\ngamma\n")
    (workspace / "delete_me.txt").write_text("bye\n")
    for line in (RECORDINGS / "view_image.rpc.jsonl").read_text().splitlines():
        record = json.loads(line)
        result = record.get("msg", {}).get("result", {})
        if isinstance(result, dict) and "dataBase64" in result:
            (workspace / "pixel.png").write_bytes(base64.b64decode(result["dataBase64"]))
    (root / "exec_server_home").mkdir()


def _prepare_skill(workspace: Path) -> None:
    """The skills recording's repository: a ``.git`` and one skill in ``.agents/skills``
    (found through ``fs/walk``), its ``SKILL.md`` as the recording read it."""
    (workspace / ".git").mkdir()
    skill = workspace / ".agents" / "skills" / "pa-demo"
    skill.mkdir(parents=True)
    for line in (RECORDINGS / "skills.rpc.jsonl").read_text().splitlines():
        result = json.loads(line).get("msg", {}).get("result", {})
        if isinstance(result, dict) and "dataBase64" in result:
            (skill / "SKILL.md").write_bytes(base64.b64decode(result["dataBase64"]))


def _start_server(root: Path, backend: str) -> tuple[subprocess.Popen[str], str]:
    env = dict(os.environ)
    env["HARNESS_EXEC_SERVER_MARKER"] = MARKER
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "exec_server", "serve"),
            *("--listen", "ws://127.0.0.1:0", "--sandbox-backend", backend),
        ],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    if not url.startswith("ws://"):
        proc.kill()
        proc.wait()
        proc.stdout.close()
        pytest.fail(f"server did not announce its URL: {url!r}")
    return proc, url


async def _replay(rec: Recording, backend: str) -> tuple[Peer, int]:
    peer = Peer()
    root_frames = rec.frames
    proc_root = Path(os.environ["_REPLAY_ROOT"])
    server, url = _start_server(proc_root, backend)
    server_pid = server.pid
    try:
        async with connect(url, max_size=None) as ws:
            pump = asyncio.create_task(peer.pump(ws))
            try:
                seen_responses: list[Any] = []
                seen_closed: list[str] = []
                for frame in root_frames:
                    msg = frame["msg"]
                    if frame["dir"] == "s2c":
                        if "id" in msg:
                            seen_responses.append(msg["id"])
                        elif msg.get("method") == "process/closed":
                            seen_closed.append(msg["params"]["processId"])
                        continue
                    # Codex waited for everything recorded before this frame.
                    ids = list(seen_responses)
                    closed = list(seen_closed)
                    await peer.wait_for(
                        lambda ids=ids, closed=closed: (
                            all(i in peer.responses for i in ids)
                            and all(peer.closed(p) for p in closed)
                        ),
                        f"replies {ids} / closed {closed} before sending {msg.get('method')}",
                    )
                    await ws.send(json.dumps(msg))
                await peer.wait_for(
                    lambda: (
                        all(i in peer.responses for i in seen_responses)
                        and all(peer.closed(p) for p in seen_closed)
                    ),
                    "the final replies",
                )
            finally:
                pump.cancel()
                await asyncio.gather(pump, return_exceptions=True)
    finally:
        server.terminate()
        server.wait(timeout=10)
        assert server.stdout is not None
        server.stdout.close()
    return peer, server_pid


def _check_responses(rec: Recording, peer: Peer, advertised: dict[str, Any]) -> None:
    for frame in rec.frames:
        msg = frame["msg"]
        if frame["dir"] != "s2c" or "id" not in msg:
            continue
        method = rec.methods[msg["id"]]
        ours = peer.responses[msg["id"]]
        if method == "environmentConfig/read":
            # Advertised: the host's layers, whose paths differ from the recording's host.
            assert advertised.get("environmentConfigRead") is True
            got = ours["result"]
            assert set(got) == set(msg["result"]), got
            assert got["codexHomeDir"].startswith("file:///")
            for part in ("config", "requirements"):
                assert set(got[part]) == {"layers", "cloudInsertionIndex"}, got
            continue
        if "error" in msg:
            assert "error" in ours, f"{method} id {msg['id']}: expected error, got {ours}"
            assert ours["error"]["code"] == msg["error"]["code"], (method, ours)
            continue
        assert "result" in ours, f"{method} id {msg['id']}: expected result, got {ours}"
        expected, got = msg["result"], ours["result"]
        optional = {"providerId", "prependPathDirs", "modifiedAtMs"}
        missing = {k for k in expected if k not in got} - optional
        assert not missing, f"{method}: result lacks {missing}: {got}"
        if method == "initialize":
            info = got["environmentInfo"]
            assert info["shell"]["name"] in ("bash", "sh")
            assert not info["shell"]["path"].startswith("file:")
            assert info["cwd"] == "file://" + os.environ["_REPLAY_ROOT"]
            for key in ("cwd", "userHomeDir", "tempDir"):
                assert info[key].startswith("file:///")
        elif method.startswith("fs/getMetadata"):
            for key in ("isDirectory", "isFile", "isSymlink", "size"):
                assert got[key] == expected[key], (key, got)
        elif method == "fs/readFile":
            assert got["dataBase64"] == expected["dataBase64"]
        else:
            assert got == expected, (method, got)


def _check_notifications(rec: Recording, peer: Peer) -> dict[str, bytes]:
    outputs: dict[str, bytes] = {}
    recorded = [f["msg"] for f in rec.frames if f["dir"] == "s2c" and "method" in f["msg"]]
    process_ids = {n["params"]["processId"] for n in recorded}
    for pid in process_ids:
        ours = [n for n in peer.notifications if n["params"].get("processId") == pid]
        theirs = [n for n in recorded if n["params"]["processId"] == pid]
        seqs = [n["params"]["seq"] for n in ours]
        assert sorted(seqs) == list(range(1, len(ours) + 1)), seqs
        methods = [n["method"] for n in ours]
        assert methods[-1] == "process/closed", methods
        assert methods.count("process/exited") == 1 and methods.count("process/closed") == 1
        exited = next(n for n in ours if n["method"] == "process/exited")
        their_exit = next(n for n in theirs if n["method"] == "process/exited")
        assert exited["params"]["exitCode"] == their_exit["params"]["exitCode"]
        assert exited["params"].get("sandboxDenied") == their_exit["params"]["sandboxDenied"]
        streams = {n["params"]["stream"] for n in ours if n["method"] == "process/output"}
        their_streams = {n["params"]["stream"] for n in theirs if n["method"] == "process/output"}
        assert streams <= their_streams | {"stderr"}, streams
        data = b"".join(
            base64.b64decode(n["params"]["chunk"])
            for n in sorted(ours, key=lambda n: n["params"]["seq"])
            if n["method"] == "process/output" and n["params"]["stream"] != "stderr"
        )
        outputs[pid] = data
    return outputs


def _cases() -> list[Any]:
    """Every recording; the sandboxed ones once per Linux backend."""
    cases = []
    for path in _recordings():
        name = path.name.removesuffix(".rpc.jsonl")
        backends = ("bwrap", "landlock") if name.startswith("sandboxed") else ("auto",)
        cases += [pytest.param(path, b, id=f"{name}-{b}") for b in backends]
    return cases


@pytest.mark.parametrize(("path", "backend"), _cases())
async def test_replay_recording(
    path: Path, backend: str, replay_base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = replay_base / path.name.removesuffix(".rpc.jsonl")
    root.mkdir()
    _prepare_workspace(root)
    monkeypatch.setenv("_REPLAY_ROOT", str(root))
    rec = Recording.load(path, root)

    peer, server_pid = await _replay(rec, backend)

    advertised = peer.responses[1]["result"]["environmentInfo"].get("capabilities", {})
    _check_responses(rec, peer, advertised)
    outputs = _check_notifications(rec, peer)
    workspace = root / "workspace"

    if rec.name == "shell":
        (out,) = outputs.values()
        text = out.decode()
        assert text.startswith("remote-ok\n")
        assert f"marker={MARKER}\n" in text  # inherit "all" uses the server's env
        assert (workspace / "proof.txt").read_text() == "remote-ok\n"
        # The command ran as a descendant of our server, not of the test.
        ancestry = [int(p) for p in (workspace / "ancestry.txt").read_text().split()]
        assert server_pid in ancestry, (server_pid, ancestry)
    elif rec.name == "tty_write_stdin":
        (out,) = outputs.values()
        assert out == b"hello\r\ngot:hello\r\nlate\r\n"
    elif rec.name == "sandboxed_shell":
        (out,) = outputs.values()
        assert out == b"sandboxed-ok\nOUTSIDE-WRITE-DENIED\n"
        assert (workspace / "sb_proof.txt").read_text() == "sandboxed-ok\n"
        assert not (root / "outside_probe.txt").exists()
    elif rec.name in ("apply_patch", "sandboxed_apply_patch"):
        assert (workspace / "edit_me.txt").read_text() == "alpha\nBETA-patched\ngamma\n"
        assert (workspace / "sub" / "dir" / "added.txt").read_text() == "added by apply_patch\n"
        assert not (workspace / "delete_me.txt").exists()
    elif rec.name == "view_image":
        assert (workspace / "pixel.png").exists()
