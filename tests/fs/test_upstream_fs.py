"""Side by side with the upstream Rust server: the same fs/* requests, the same answers.

Each case runs against both servers, each in its own fresh directory with the same
layout; error codes and messages (with the directory written as ``<T>``) and results
must be equal, and so must what is left on disk. Skipped when upstream's binary is
not installed (``pip install openai-codex-cli-bin``, part of the test extras).

The cases are edges where an implementation easily answers differently
(base64, URI spellings, FIFOs, ancestors that are not directories, error texts) and
the common paths around them. Differences we keep on purpose (docs/compat.md) are
not here.
"""

from __future__ import annotations

import base64
import os
import socket
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.upstream



def _layout(root: Path) -> None:
    (root / "a.txt").write_text("hello")
    (root / "d" / "sub").mkdir(parents=True)
    (root / "d" / "f").write_text("x")
    (root / "link").symlink_to(root / "a.txt")
    (root / "dangling").symlink_to(root / "nowhere")
    (root / "loop").symlink_to(root / "loop")
    os.mkfifo(root / "fifo")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(root / "sock"))  # the file stays once the socket is closed


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# (name, method, params): "{U}" is the case directory as a file:// URI.
CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("read file", "fs/readFile", {"path": "{U}/a.txt"}),
    ("read missing", "fs/readFile", {"path": "{U}/missing"}),
    ("read directory", "fs/readFile", {"path": "{U}/d"}),
    ("read fifo", "fs/readFile", {"path": "{U}/fifo"}),
    ("read socket", "fs/readFile", {"path": "{U}/sock"}),
    ("read device", "fs/readFile", {"path": "file:///dev/null"}),
    ("read symlink loop", "fs/readFile", {"path": "{U}/loop"}),
    ("read through link", "fs/readFile", {"path": "{U}/link"}),
    ("read dangling", "fs/readFile", {"path": "{U}/dangling"}),
    ("read under a file", "fs/readFile", {"path": "{U}/a.txt/x"}),
    ("uri LOCALHOST", "fs/readFile", {"path": "file://LOCALHOST{P}/a.txt"}),
    ("uri backslash", "fs/readFile", {"path": "{U}\\a.txt"}),
    ("uri spaces around", "fs/readFile", {"path": " {U}/a.txt "}),
    ("uri tab inside", "fs/readFile", {"path": "{U}/a.t\txt"}),
    ("uri without slashes", "fs/readFile", {"path": "file:a.txt"}),
    ("uri root", "fs/readFile", {"path": "file://"}),
    ("uri port", "fs/readFile", {"path": "file://localhost:80{P}/a.txt"}),
    ("uri user", "fs/readFile", {"path": "file://user@localhost{P}/a.txt"}),
    ("uri other host", "fs/readFile", {"path": "file://elsewhere{P}/a.txt"}),
    ("uri other scheme", "fs/readFile", {"path": "http://host{P}/a.txt"}),
    ("uri query", "fs/readFile", {"path": "{U}/a.txt?x=1"}),
    ("uri fragment", "fs/readFile", {"path": "{U}/a.txt#f"}),
    ("uri NUL", "fs/readFile", {"path": "{U}/a%00.txt"}),
    ("uri escapes", "fs/readFile", {"path": "{U}/%61.txt"}),
    ("uri dot-dot", "fs/readFile", {"path": "{U}/d/../a.txt"}),
    ("write new", "fs/writeFile", {"path": "{U}/new.txt", "dataBase64": _b64("new")}),
    ("write replace", "fs/writeFile", {"path": "{U}/a.txt", "dataBase64": _b64("bye")}),
    ("write missing parent", "fs/writeFile", {"path": "{U}/no/x", "dataBase64": ""}),
    ("write directory", "fs/writeFile", {"path": "{U}/d", "dataBase64": ""}),
    # No temp file can be made in /proc (ENOENT): the file's own error, never -32004.
    ("write /proc file", "fs/writeFile", {"path": "file:///proc/version", "dataBase64": "eA=="}),
    ("base64 stray bits", "fs/writeFile", {"path": "{U}/b", "dataBase64": "aGVsbG9="}),
    ("base64 stray bits 2", "fs/writeFile", {"path": "{U}/b", "dataBase64": "aR=="}),
    ("base64 pad in body", "fs/writeFile", {"path": "{U}/b", "dataBase64": "aGk=="}),
    ("base64 only pads", "fs/writeFile", {"path": "{U}/b", "dataBase64": "===="}),
    ("base64 one symbol", "fs/writeFile", {"path": "{U}/b", "dataBase64": "a"}),
    ("base64 no padding", "fs/writeFile", {"path": "{U}/b", "dataBase64": "aGVsbG8"}),
    ("base64 bad symbol", "fs/writeFile", {"path": "{U}/b", "dataBase64": "aGV!bG8="}),
    ("base64 odd tail", "fs/writeFile", {"path": "{U}/b", "dataBase64": "\n fB!"}),
    ("mkdir recursive", "fs/createDirectory", {"path": "{U}/m/n", "recursive": True}),
    ("mkdir existing", "fs/createDirectory", {"path": "{U}/d", "recursive": False}),
    ("mkdir missing parent", "fs/createDirectory", {"path": "{U}/m/n", "recursive": False}),
    ("mkdir on a file", "fs/createDirectory", {"path": "{U}/a.txt", "recursive": True}),
    ("mkdir under a file", "fs/createDirectory", {"path": "{U}/a.txt/x/y", "recursive": True}),
    ("mkdir under dangling", "fs/createDirectory", {"path": "{U}/dangling/x", "recursive": True}),
    ("metadata file", "fs/getMetadata", {"path": "{U}/a.txt"}),
    ("metadata dir", "fs/getMetadata", {"path": "{U}/d/sub"}),
    ("metadata link", "fs/getMetadata", {"path": "{U}/link"}),
    ("metadata fifo", "fs/getMetadata", {"path": "{U}/fifo"}),
    ("metadata dangling", "fs/getMetadata", {"path": "{U}/dangling"}),
    ("metadata loop", "fs/getMetadata", {"path": "{U}/loop"}),
    ("list", "fs/readDirectory", {"path": "{U}/d"}),
    ("list a file", "fs/readDirectory", {"path": "{U}/a.txt"}),
    ("remove missing", "fs/remove", {"path": "{U}/missing", "force": False}),
    ("remove missing forced", "fs/remove", {"path": "{U}/missing"}),
    ("remove non-empty", "fs/remove", {"path": "{U}/d", "recursive": False}),
    ("remove tree", "fs/remove", {"path": "{U}/d", "recursive": True}),
    ("remove link", "fs/remove", {"path": "{U}/link"}),
    ("copy file", "fs/copy", {"sourcePath": "{U}/a.txt", "destinationPath": "{U}/c",
                              "recursive": False}),
    ("copy dir flat", "fs/copy", {"sourcePath": "{U}/d", "destinationPath": "{U}/c",
                                  "recursive": False}),
    ("copy tree", "fs/copy", {"sourcePath": "{U}/d", "destinationPath": "{U}/c",
                              "recursive": True}),
    ("copy into itself", "fs/copy", {"sourcePath": "{U}/d", "destinationPath": "{U}/d/in",
                                     "recursive": True}),
    ("copy fifo", "fs/copy", {"sourcePath": "{U}/fifo", "destinationPath": "{U}/c",
                              "recursive": False}),
    ("canonicalize link", "fs/canonicalize", {"path": "{U}/link"}),
]


def _fill(value: Any, root: Path) -> Any:
    if isinstance(value, str):
        return value.replace("{U}", f"file://{root}").replace("{P}", str(root))
    return value


def _fill_all(params: dict[str, Any], root: Path) -> dict[str, Any]:
    return {k: _fill(v, root) for k, v in params.items()}


def _mask(answer: Any) -> None:
    if isinstance(answer, dict) and answer.get("modifiedAtMs"):
        answer["modifiedAtMs"] = "set"


async def test_fs_answers_match_upstream(upstream_diff: Any) -> None:
    cases = [(name, _layout, [(method, params)]) for name, method, params in CASES]
    differences = await upstream_diff.differences(cases, fill=_fill_all, mask=_mask)
    assert not differences, "\n".join(differences)
