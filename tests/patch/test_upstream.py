"""Differential test against the reference binary (codex-cli 0.163.0, ``upstream`` marker).

Seeded random patches (real chunks cut from the files, random chunk lines,
marker look-alikes, padded/duplicated End lines, heredoc wrapping, Environment
ID lines, moves, adds, deletes) are applied by ``codex --codex-run-as-apply-patch``
and by our CLI code in twin directories; exit code, stdout, stderr (paths
normalised) and the resulting trees must be identical.

Known, deliberate difference left out of the generator: a move onto the source
itself (0.163.0 deletes the file; we update in place as later upstream does).
"""

from __future__ import annotations

import io
import os
import random
import subprocess
from pathlib import Path

import pytest

from exec_server.cli.apply_patch import run_patch

pytestmark = pytest.mark.upstream

_POOL = [
    "a", "b", "c", "x\ry", "a ", " a", "", "  ", "a\u2013b", "a-b", "\u201cq\u201d", '"q"',
    "x\u00a0y", "x y", "\t", "@@", "*x", "d",
]  # fmt: skip
_FILES = ["f1", "f2", "sub/f3"]


def _codex() -> Path:
    try:
        from codex_cli_bin import bundled_codex_path  # type: ignore[import-untyped]
    except ImportError:
        pytest.skip("openai-codex-cli-bin is not installed")
    try:
        return Path(bundled_codex_path())
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


def _rand_file(r: random.Random) -> str:
    n = r.randint(0, 10)
    out = ""
    for i in range(n):
        line = r.choice(_POOL)
        end = "" if i == n - 1 and r.random() < 0.3 else r.choice(["\n", "\n", "\r\n", "\r"])
        out += line + end
    return out


def _random_chunk(r: random.Random, first: bool) -> list[str]:
    lines: list[str] = []
    h = r.random()
    if h < 0.3 or (not first and h >= 0.5):
        lines.append("@@")
    elif h < 0.5:
        lines.append("@@ " + r.choice(_POOL))
    for _ in range(r.randint(0, 4)):
        kind = r.choice([" ", "-", "+", " ", ""])
        lines.append("" if kind == "" else kind + r.choice(_POOL))
    if r.random() < 0.2:
        lines.append("*** End of File")
    if r.random() < 0.1:
        lines.append("")
    return lines


def _derived_chunk(r: random.Random, first: bool, content: str) -> list[str]:
    file_lines = [x[:-1] if x.endswith("\r") else x for x in content.split("\n")]
    lines: list[str] = []
    if not first or r.random() < 0.5:
        lines.append("@@" if r.random() < 0.7 else "@@ " + r.choice(file_lines))
    i = r.randrange(len(file_lines))
    for text in file_lines[i : min(len(file_lines), i + r.randint(0, 4))]:
        how = r.choice(["ctx", "ctx", "del", "ws"])
        if how == "ctx":
            lines.append(" " + text)
        elif how == "ws":
            variant = r.choice([text + " ", text.strip(), text.replace("-", "\u2013")])
            lines.append(" " + variant)
        else:
            lines.append("-" + text)
        if r.random() < 0.3:
            lines.append("+" + r.choice(_POOL))
    if r.random() < 0.2:
        lines.append("*** End of File")
    return lines


def _rand_patch(r: random.Random, files: dict[str, str]) -> str:
    lines = ["*** Begin Patch"]
    for _ in range(r.randint(0, 3)):
        kind = r.random()
        path = r.choice(_FILES)
        if kind < 0.15:
            lines.append(f"*** Add File: {path}")
            lines += ["+" + r.choice(_POOL) for _ in range(r.randint(0, 2))]
        elif kind < 0.25:
            lines.append(f"*** Delete File: {path}")
        else:
            lines.append(f"*** Update File: {path}")
            if r.random() < 0.15:
                dest = r.choice([x for x in ["f1", "f2", "new/f4"] if x != path])
                lines.append(f"*** Move to: {dest}{r.choice(['', ' '])}")
            for i in range(r.randint(1, 3)):
                if r.random() < 0.6:
                    lines += _derived_chunk(r, i == 0, files.get(path, ""))
                else:
                    lines += _random_chunk(r, i == 0)
        if r.random() < 0.1:
            lines.append(r.choice(["", "  ", "\t", " *** End Patch", "*** End Patch", "bad",
                                   "*** End of File", "@@", "@@ a", "*** Move to: f9",
                                   "  *** Add File: q", "*** Environment ID: e"]))  # fmt: skip
    if r.random() < 0.1:
        lines.insert(1, r.choice(["*** Environment ID: x", "*** Environment ID:", "", "  "]))
    lines.append(r.choice(["*** End Patch", " *** End Patch ", "*** End Patch\n*** End Patch"]))
    text = "\n".join(lines) + r.choice(["", "\n"])
    if r.random() < 0.05:
        text = "<<EOF\n" + text + "\nEOF"
    return text


def _seed(root: Path, files: dict[str, str]) -> None:
    root.mkdir()
    for rel, content in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(content.encode())


def _tree(root: Path) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    for path in sorted(root.rglob("*")):
        out[str(path.relative_to(root))] = path.read_bytes() if path.is_file() else None
    return out


def _ours(root: Path, patch: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    os.chdir(root)
    try:
        code = run_patch(patch, stdout=out, stderr=err)
    finally:
        os.chdir(old)
    return code, out.getvalue(), err.getvalue().replace(str(root), "<D>")


def _theirs(codex: Path, root: Path, patch: str) -> tuple[int, str, str]:
    proc = subprocess.run(
        [str(codex), "--codex-run-as-apply-patch", patch],
        cwd=root,
        capture_output=True,
        timeout=30,
        env={"PATH": os.environ.get("PATH", ""), "HOME": str(root.parent)},
    )
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode().replace(str(root), "<D>")


@pytest.mark.parametrize("block", range(4))
def test_matches_reference_binary(tmp_path: Path, block: int) -> None:
    codex = _codex()
    base = Path(os.path.realpath(tmp_path))
    mismatches: list[str] = []
    for seed in range(block * 150, (block + 1) * 150):
        r = random.Random(seed)
        files = {f: _rand_file(r) for f in _FILES if r.random() < 0.8}
        patch = _rand_patch(r, files)
        ours_root, theirs_root = base / f"o{seed}", base / f"t{seed}"
        _seed(ours_root, files)
        _seed(theirs_root, files)
        ours = _ours(ours_root, patch)
        theirs = _theirs(codex, theirs_root, patch)
        if ours != theirs or _tree(ours_root) != _tree(theirs_root):
            mismatches.append(f"seed {seed}: {patch!r}\n ours={ours}\n theirs={theirs}")
    assert not mismatches, "\n".join(mismatches[:3])


def _setup_special(root: Path) -> None:
    root.mkdir()
    (root / "d").mkdir()
    (root / "bin").write_bytes(b"\xff\xfeabc\n")
    (root / "bin2").write_bytes(b"ok\xe2\x28\xa1\n")
    (root / "bin3").write_bytes(b"ok\xe2\x82")
    (root / "f").write_text("x\n")
    (root / "cr").write_bytes(b"a\rb\r\nc")
    os.mkfifo(root / "fifo")
    (root / "dangling").symlink_to("nowhere")
    (root / "dlink").symlink_to("d")
    (root / "flink").symlink_to("f")


_SPECIAL = [
    "*** Update File: d\n@@\n+x",
    "*** Update File: bin\n@@\n+x",
    "*** Update File: bin2\n@@\n+x",
    "*** Update File: bin3\n@@\n+x",
    "*** Update File: fifo\n@@\n+x",
    "*** Update File: cr\n@@\n-b\n+B\n+C",
    "*** Delete File: d",
    "*** Delete File: nope",
    "*** Delete File: bin",
    "*** Delete File: fifo",
    "*** Delete File: dangling",
    "*** Delete File: dlink",
    "*** Delete File: flink",
    "*** Add File: d\n+x",
    "*** Add File: f/x\n+x",
    "*** Add File: f/x/y\n+x",
    "*** Add File: dangling\n+x",
    "*** Add File: dlink/new\n+x",
    "*** Update File: nope\n@@\n+x",
    "*** Update File: flink\n@@\n-x\n+y",
    "*** Update File: f\n*** Move to: d\n@@\n+x",
    "*** Update File: f\n*** Move to: f/y\n@@\n+x",
    "*** Update File: f\n*** Move to: dlink/moved\n@@\n+x",
    "*** Add File: made\n+1\n*** Delete File: d\n*** Add File: never\n+2",
]


def _tree_with_links(root: Path) -> dict[str, object]:
    out: dict[str, object] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = ("link", os.readlink(path))
        elif path.is_fifo():
            out[rel] = "fifo"
        elif path.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = path.read_bytes()
    return out


@pytest.mark.parametrize("body", _SPECIAL)
def test_special_files_match_reference_binary(tmp_path: Path, body: str) -> None:
    """Directories, non-UTF-8 files, FIFOs, symlinks and missing parents (§7)."""
    codex = _codex()
    base = Path(os.path.realpath(tmp_path))
    patch = f"*** Begin Patch\n{body}\n*** End Patch"
    ours_root, theirs_root = base / "ours", base / "theirs"
    _setup_special(ours_root)
    _setup_special(theirs_root)
    ours = _ours(ours_root, patch)
    theirs = _theirs(codex, theirs_root, patch)
    assert ours == theirs
    assert _tree_with_links(ours_root) == _tree_with_links(theirs_root)
