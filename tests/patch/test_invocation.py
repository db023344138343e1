"""Verified parse of shell invocations (§12) and the unified-diff preview (§13)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from exec_server.patch.apply import apply_patch
from exec_server.patch.diff import unified_diff, unified_diff_from_chunks
from exec_server.patch.errors import ApplyError, CorrectnessError
from exec_server.patch.invocation import (
    IMPLICIT_INVOCATION_MESSAGE,
    AddChange,
    Body,
    DeleteChange,
    NotApplyPatch,
    PatchParseFailure,
    UpdateChange,
    VerifiedBody,
    maybe_parse_apply_patch,
    maybe_parse_apply_patch_verified,
)
from exec_server.patch.parse import DeleteFile, UpdateFile, parse_patch

PATCH = "*** Begin Patch\n*** Delete File: a\n*** End Patch"


def heredoc(delim: str = "'EOF'", end: str = "EOF", body: str = PATCH) -> str:
    return f"apply_patch <<{delim}\n{body}\n{end}\n"


# --- stage 1: recognising the call -------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "workdir"),
    [
        (["apply_patch", PATCH], None),
        (["applypatch", PATCH], None),
        (["bash", "-lc", heredoc()], None),
        (["bash", "-c", heredoc("EOF")], None),
        (["/bin/bash", "-lc", heredoc('"EOF"')], None),
        (["zsh", "-lc", heredoc("PATCH", "PATCH")], None),
        (["sh", "-c", heredoc("'END_OF_PATCH'", "END_OF_PATCH")], None),
        (["bash", "-lc", "applypatch <<EOF\n" + PATCH + "\nEOF"], None),
        (["bash", "-lc", "  apply_patch<<'EOF'\n" + PATCH + "\nEOF\n\n"], None),
        (["bash", "-lc", "cd sub && apply_patch <<'EOF'\n" + PATCH + "\nEOF\n"], "sub"),
        (["bash", "-lc", 'cd "my dir" && apply_patch <<EOF\n' + PATCH + "\nEOF"], "my dir"),
        (["bash", "-lc", "cd '/abs/x y' && apply_patch <<EOF\n" + PATCH + "\nEOF"], "/abs/x y"),
        (["bash", "-lc", "cd ../up&&apply_patch <<EOF\n" + PATCH + "\nEOF"], "../up"),
        (["bash.exe", "-lc", heredoc()], None),
        (["pwsh", "-Command", heredoc()], None),
        (["powershell.exe", "-command", heredoc()], None),
        (["pwsh", "-NoProfile", "-Command", heredoc()], None),
        (["C:\\Windows\\System32\\cmd.exe", "/C", heredoc()], None),
    ],
)
def test_recognised(argv: list[str], workdir: str | None) -> None:
    result = maybe_parse_apply_patch(argv)
    assert isinstance(result, Body)
    assert result.hunks == (DeleteFile("a"),)
    assert result.patch == PATCH
    assert result.workdir == workdir


@pytest.mark.parametrize(
    "argv",
    [
        ["apply_patch"],
        ["apply_patch", PATCH, "extra"],
        ["apply-patch", PATCH],
        ["python", "-c", heredoc()],
        ["bash", "-x", heredoc()],
        ["bash", "-lc", "cd x; apply_patch <<EOF\n" + PATCH + "\nEOF"],
        ["bash", "-lc", "cd x || apply_patch <<EOF\n" + PATCH + "\nEOF"],
        ["bash", "-lc", "cd x | apply_patch <<EOF\n" + PATCH + "\nEOF"],
        ["bash", "-lc", "echo y && apply_patch <<EOF\n" + PATCH + "\nEOF"],
        ["bash", "-lc", "apply_patch foo <<EOF\n" + PATCH + "\nEOF"],
        ["bash", "-lc", "cd a && cd b && apply_patch <<EOF\n" + PATCH + "\nEOF"],
        ["bash", "-lc", "cd a b && apply_patch <<EOF\n" + PATCH + "\nEOF"],
        ["bash", "-lc", "apply_patch <<EOF && echo done\n" + PATCH + "\nEOF"],
        ["bash", "-lc", "apply_patch <<EOF\n" + PATCH + "\nEOF\necho done"],
        ["bash", "-lc", "echo y; cd x && apply_patch <<EOF\n" + PATCH + "\nEOF"],
        ["bash", "-lc", "apply_patch <<EOF\n" + PATCH + "\nNOT_THE_END"],
        ["bash", "-lc", "apply_patch '" + PATCH + "'"],
        ["pwsh", "-NoProfile", "-c", heredoc()],
        ["cmd", "/k", heredoc()],
    ],
)
def test_not_apply_patch(argv: list[str]) -> None:
    assert maybe_parse_apply_patch(argv) == NotApplyPatch()


def test_patch_parse_failure() -> None:
    result = maybe_parse_apply_patch(["apply_patch", "*** Begin Patch\nbad\n*** End Patch"])
    assert isinstance(result, PatchParseFailure)
    assert str(result.error).startswith("Invalid patch hunk on line 2: 'bad'")
    shell = maybe_parse_apply_patch(["bash", "-lc", heredoc(body="not a patch")])
    assert isinstance(shell, PatchParseFailure)


def test_heredoc_body_trailing_newlines_removed_and_tabs_kept() -> None:
    script = "apply_patch <<-EOF\n" + PATCH + "\n\n\n\tEOF\n"
    result = maybe_parse_apply_patch(["bash", "-lc", script])
    assert isinstance(result, Body)
    assert result.patch == PATCH


# --- stage 2: verified plan ------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [[PATCH], ["bash", "-lc", PATCH], ["pwsh", "-NoProfile", "-Command", PATCH]],
)
async def test_implicit_invocation_rejected(memory_backend: Any, argv: list[str]) -> None:
    result = await maybe_parse_apply_patch_verified(argv, memory_backend.root, memory_backend.fs)
    assert isinstance(result, CorrectnessError)
    assert result.kind == "implicit_invocation"
    assert str(result) == IMPLICIT_INVOCATION_MESSAGE
    assert str(result) == (
        'patch detected without explicit call to apply_patch. Rerun as ["apply_patch", "<patch>"]'
    )
    assert memory_backend.memory.calls == []


async def test_verified_cd_resolves_against_workdir(backend: Any) -> None:
    backend.seed({"sub/f.txt": "one\ntwo\n", "sub/gone": "bye\n", "sub/over": "old\n"})
    patch = (
        "*** Begin Patch\n*** Add File: over\n+new\n*** Delete File: gone\n"
        "*** Update File: f.txt\n*** Move to: ../moved.txt\n@@\n-two\n+TWO\n*** End Patch"
    )
    argv = ["bash", "-lc", f"cd sub && apply_patch <<'EOF'\n{patch}\nEOF\n"]
    result = await maybe_parse_apply_patch_verified(argv, backend.root, backend.fs)
    assert isinstance(result, VerifiedBody), result
    action = result.action
    sub = backend.root / "sub"
    assert action.cwd == sub
    assert action.patch == patch
    assert action.changes == {
        sub / "over": AddChange("new\n", "old\n"),
        sub / "gone": DeleteChange("bye\n"),
        sub / "f.txt": UpdateChange(
            "@@ -1,2 +1,2 @@\n one\n-two\n+TWO\n",
            backend.root / "moved.txt",
            "one\nTWO\n",
            "one\ntwo\n",
        ),
    }
    # nothing was written by verification; then the host applies with the effective cwd
    assert backend.snapshot()["sub/f.txt"] == b"one\ntwo\n"
    applied = await apply_patch(action.patch, action.cwd, backend.fs)
    assert applied.summary() == (
        "Success. Updated the following files:\nA over\nM ../moved.txt\nD gone\n"
    )
    assert backend.snapshot()["moved.txt"] == b"one\nTWO\n"


async def test_verified_absolute_workdir(memory_backend: Any) -> None:
    memory_backend.seed({"abs/a": "x\n"})
    script = f"cd {memory_backend.root}/abs && apply_patch <<EOF\n{PATCH}\nEOF"
    result = await maybe_parse_apply_patch_verified(
        ["bash", "-lc", script], Path("/elsewhere"), memory_backend.fs
    )
    assert isinstance(result, VerifiedBody)
    assert result.action.cwd == memory_backend.root / "abs"
    assert result.action.changes == {memory_backend.root / "abs/a": DeleteChange("x\n")}


async def test_verified_delete_read_failure(memory_backend: Any) -> None:
    result = await maybe_parse_apply_patch_verified(
        ["apply_patch", PATCH], memory_backend.root, memory_backend.fs
    )
    assert isinstance(result, CorrectnessError)
    assert result.kind == "io"
    assert str(result) == (
        f"Failed to read {memory_backend.root}/a: No such file or directory (os error 2)"
    )


async def test_verified_update_errors_and_parse_errors(memory_backend: Any) -> None:
    memory_backend.seed({"f": "x\n"})
    upd = "*** Begin Patch\n*** Update File: f\n@@\n-nope\n+y\n*** End Patch"
    result = await maybe_parse_apply_patch_verified(
        ["apply_patch", upd], memory_backend.root, memory_backend.fs
    )
    assert isinstance(result, CorrectnessError)
    assert result.kind == "compute"
    assert str(result) == f"Failed to find expected lines in {memory_backend.root}/f:\nnope"
    bad = await maybe_parse_apply_patch_verified(
        ["apply_patch", "*** Begin Patch\nbad\n*** End Patch"],
        memory_backend.root,
        memory_backend.fs,
    )
    assert isinstance(bad, CorrectnessError)
    assert bad.kind == "parse"
    assert str(bad).startswith("Invalid patch hunk on line 2:")
    other = await maybe_parse_apply_patch_verified(
        ["ls", "-l"], memory_backend.root, memory_backend.fs
    )
    assert other == NotApplyPatch()


async def test_verification_reads_the_disk_before_the_patch(memory_backend: Any) -> None:
    patch = "*** Begin Patch\n*** Add File: n\n+1\n*** Update File: n\n@@\n-1\n+2\n*** End Patch"
    result = await maybe_parse_apply_patch_verified(
        ["apply_patch", patch], memory_backend.root, memory_backend.fs
    )
    assert isinstance(result, CorrectnessError)
    assert str(result).startswith(f"Failed to read file to update {memory_backend.root}/n:")


async def test_sandbox_context_reaches_every_call(memory_backend: Any) -> None:
    """apply_patch never reads the context: the same object goes to each fs call (§14)."""
    memory_backend.seed({"u": "a\n", "d": "x\n", "m": "m\n"})
    sandbox = object()
    patch = (
        "*** Begin Patch\n*** Add File: new/dir/f\n+x\n*** Delete File: d\n"
        "*** Update File: u\n@@\n-a\n+b\n*** Update File: m\n*** Move to: moved/m\n@@\n+z\n"
        "*** End Patch"
    )
    verified = await maybe_parse_apply_patch_verified(
        ["apply_patch", patch], memory_backend.root, memory_backend.fs, sandbox
    )
    assert isinstance(verified, VerifiedBody)
    await apply_patch(patch, memory_backend.root, memory_backend.fs, sandbox)
    calls = memory_backend.memory.calls
    ops = {op for op, _, _ in calls}
    assert ops == {"read_file", "write_file", "create_directory", "get_metadata", "remove"}
    assert all(s is sandbox for _, _, s in calls)


async def test_parent_creation_failure_message(memory_backend: Any) -> None:
    target = memory_backend.root / "p" / "f"
    memory_backend.memory.fail[("create_directory", str(target.parent))] = OSError(13, "denied")
    with pytest.raises(ApplyError) as info:
        await apply_patch(
            "*** Begin Patch\n*** Add File: p/f\n+x\n*** End Patch",
            memory_backend.root,
            memory_backend.fs,
        )
    assert str(info.value) == f"Failed to create parent directories for {target}"


async def test_remove_original_failure_after_move(memory_backend: Any) -> None:
    memory_backend.seed({"a": "x\n"})
    src = memory_backend.root / "a"
    memory_backend.memory.fail[("remove", str(src))] = PermissionError(1, "nope")
    with pytest.raises(ApplyError) as info:
        await apply_patch(
            "*** Begin Patch\n*** Update File: a\n*** Move to: b\n@@\n-x\n+y\n*** End Patch",
            memory_backend.root,
            memory_backend.fs,
        )
    assert str(info.value) == f"Failed to remove original {src}"
    # the destination was written first and stays (no rollback)
    assert memory_backend.snapshot() == {"a": b"x\n", "b": b"y\n"}


# --- unified diff ------------------------------------------------------------------------


def words(text: str) -> str:
    return "".join(w + "\n" for w in text.split())


@pytest.mark.parametrize(
    ("before", "after", "diff"),
    [
        (
            "foo bar baz qux",
            "foo BAR baz QUX",
            "@@ -1,4 +1,4 @@\n foo\n-bar\n+BAR\n baz\n-qux\n+QUX\n",
        ),
        ("foo bar baz", "FOO bar baz", "@@ -1,2 +1,2 @@\n-foo\n+FOO\n bar\n"),
        ("foo bar baz", "foo bar BAZ", "@@ -2,2 +2,2 @@\n bar\n-baz\n+BAZ\n"),
        ("foo bar baz", "foo bar baz quux", "@@ -3 +3,2 @@\n baz\n+quux\n"),
        ("a b c d e f", "a B c d E f g", "@@ -1,6 +1,7 @@\n a\n-b\n+B\n c\n d\n-e\n+E\n f\n+g\n"),
        # three unchanged lines between changes: two hunks
        (
            "a b c d e f g",
            "A b c d e F g",
            "@@ -1,2 +1,2 @@\n-a\n+A\n b\n@@ -5,3 +5,3 @@\n e\n-f\n+F\n g\n",
        ),
        # deletion to nothing: GNU style "start,0"
        ("a", "", "@@ -1 +0,0 @@\n-a\n"),
        ("", "", ""),
    ],
)
def test_unified_diff_reference(before: str, after: str, diff: str) -> None:
    assert unified_diff(words(before), words(after)) == diff


def test_unified_diff_terminators() -> None:
    assert unified_diff("a\r\nb", "a\r\nc\n") == (
        "@@ -1,2 +1,2 @@\n a\r\n-b\n\\ No newline at end of file\n+c\n"
    )
    # a lone CR ends a line (as in similar) and is not a missing newline
    assert unified_diff("a\rb\r", "a\rB\r") == "@@ -1,2 +1,2 @@\n a\r-b\r+B\r"


async def test_unified_diff_from_chunks_crlf(memory_backend: Any) -> None:
    memory_backend.seed({"f": b"a\r\nb\r\nc\r\n"})
    (hunk,) = parse_patch("*** Begin Patch\n*** Update File: f\n@@\n-b\n+B\n*** End Patch").hunks
    assert isinstance(hunk, UpdateFile)
    path = memory_backend.root / "f"
    update = await unified_diff_from_chunks(path, hunk.chunks, memory_backend.fs)
    assert update.content == "a\r\nB\r\nc\r\n"
    assert update.original_content == "a\r\nb\r\nc\r\n"
    assert update.unified_diff == "@@ -1,3 +1,3 @@\n a\r\n-b\r\n+B\r\n c\r\n"
