"""Table-driven apply tests: files before, patch, files after + stdout or stderr.

Every case runs on each backend (in-memory fake, LocalFileSystem, RemoteFileSystem
over a WebSocket). ``<D>`` in expected texts stands for the case directory.
Expected behaviour is codex-cli 0.163.0's (APPLY_PATCH.md §7-§10); the cases
marked "binary" were checked against that binary where the spec is silent or
differs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from exec_server.patch.apply import apply_patch
from exec_server.patch.errors import PatchError


def P(*lines: str) -> str:
    """A patch with the envelope around ``lines``."""
    return "\n".join(["*** Begin Patch", *lines, "*** End Patch"])


def ok(*lines: str) -> str:
    return "\n".join(["Success. Updated the following files:", *lines]) + "\n"


@dataclass(frozen=True)
class Case:
    name: str
    patch: str
    before: dict[str, bytes | str | None] = field(default_factory=dict)
    after: dict[str, bytes | str] | None = None  # None: files unchanged
    out: str | None = None
    err: str | None = None


# fmt: off
CASES = [
    # --- Add --------------------------------------------------------------------------
    Case("add", P("*** Add File: a.txt", "+hello", "+world"), after={"a.txt": "hello\nworld\n"},
         out=ok("A a.txt")),
    Case("add empty file (zero + lines)", P("*** Add File: e"), after={"e": ""}, out=ok("A e")),
    Case("add keeps trailing whitespace and bare + lines", P("*** Add File: a", "+x  ", "+", "+y"),
         after={"a": "x  \n\ny\n"}, out=ok("A a")),
    Case("add creates parents", P("*** Add File: x/y/z.txt", "+1"), after={"x/y/z.txt": "1\n"},
         out=ok("A x/y/z.txt")),
    Case("add overwrites", P("*** Add File: a", "+new"), before={"a": "old\n"},
         after={"a": "new\n"}, out=ok("A a")),
    Case("add +*** End Patch is content", P("*** Add File: a", "+*** End Patch"),
         after={"a": "*** End Patch\n"}, out=ok("A a")),
    Case("add onto a directory", P("*** Add File: d", "+x"), before={"d": None},
         err="Failed to write file <D>/d"),
    Case("add under a regular file", P("*** Add File: f/x", "+x"), before={"f": "x\n"},
         err="Failed to write file <D>/f/x"),
    Case("add under a regular file (deeper)", P("*** Add File: f/x/y", "+x"), before={"f": "x\n"},
         err="Failed to write file <D>/f/x/y"),
    Case("absolute-looking dot path prints as spelled", P("*** Add File: ./s/../b.txt", "+b"),
         after={"b.txt": "b\n"}, out=ok("A ./s/../b.txt")),
    # --- Delete -----------------------------------------------------------------------
    Case("delete", P("*** Delete File: a"), before={"a": "x\n", "b": "y\n"}, after={"b": "y\n"},
         out=ok("D a")),
    Case("delete missing", P("*** Delete File: nope"), err="Failed to delete file <D>/nope"),
    Case("delete directory refused", P("*** Delete File: d"), before={"d": None},
         err="Failed to delete file <D>/d"),
    Case("delete non-UTF-8 file", P("*** Delete File: bin"), before={"bin": b"\xff\xfe"},
         after={}, out=ok("D bin")),
    # --- Update basics ----------------------------------------------------------------
    Case("update", P("*** Update File: a", "@@", " one", "-two", "+TWO", " three"),
         before={"a": "one\ntwo\nthree\n"}, after={"a": "one\nTWO\nthree\n"}, out=ok("M a")),
    Case("first chunk without @@", P("*** Update File: a", " one", "-two", "+2"),
         before={"a": "one\ntwo\n"}, after={"a": "one\n2\n"}, out=ok("M a")),
    Case("deletion only", P("*** Update File: a", "@@", "-two"),
         before={"a": "one\ntwo\nthree\n"}, after={"a": "one\nthree\n"}, out=ok("M a")),
    Case("anchor narrows", P("*** Update File: a", "@@ def g():", "-    pass", "+    return 2"),
         before={"a": "def f():\n    pass\ndef g():\n    pass\n"},
         after={"a": "def f():\n    pass\ndef g():\n    return 2\n"}, out=ok("M a")),
    Case("anchor not found", P("*** Update File: a", "@@ nope", "-x", "+y"),
         before={"a": "x\n"}, err="Failed to find context 'nope' in <D>/a"),
    Case("unified range header is an anchor text",
         P("*** Update File: a", "@@ -1,3 +1,3 @@", "-x", "+y"), before={"a": "x\n"},
         err="Failed to find context '-1,3 +1,3 @@' in <D>/a"),
    Case("expected lines not found: no partial write",
         P("*** Update File: a", "@@", "-x", "+y", "@@", "-nope", "+z"),
         before={"a": "x\nq\n"}, err="Failed to find expected lines in <D>/a:\nnope"),
    Case("expected lines message has all old lines incl. trailing blank",
         P("*** Update File: a", "@@", " ctx", "-gone", ""), before={"a": "x\n"},
         err="Failed to find expected lines in <D>/a:\nctx\ngone\n"),
    Case("chunks apply in file order; earlier-only match fails",
         P("*** Update File: a", "@@", "-b", "+B", "@@", "-a", "+A"), before={"a": "a\nb\n"},
         err="Failed to find expected lines in <D>/a:\na"),
    Case("two updates of one file build on each other",
         P("*** Update File: a", "@@", "-1", "+2", "*** Update File: a", "@@", "-2", "+3"),
         before={"a": "1\n"}, after={"a": "3\n"}, out=ok("M a", "M a")),
    Case("context-only chunk still rewrites (final newline)", P("*** Update File: a", "@@", " b"),
         before={"a": "a\nb"}, after={"a": "a\nb\n"}, out=ok("M a")),
    Case("update adds missing final newline", P("*** Update File: a", "@@", "-a", "+A"),
         before={"a": "a\nb"}, after={"a": "A\nb\n"}, out=ok("M a")),
    Case("trailing blank lines kept", P("*** Update File: a", "@@", "-a", "+A"),
         before={"a": "a\n\n\n"}, after={"a": "A\n\n\n"}, out=ok("M a")),
    Case("empty file + pure addition", P("*** Update File: a", "@@", "+x"), before={"a": ""},
         after={"a": "x\n"}, out=ok("M a")),
    # --- pure additions go to the end --------------------------------------------------
    Case("pure addition appended at end despite anchor", P("*** Update File: a", "@@ a", "+x"),
         before={"a": "a\nb\n"}, after={"a": "a\nb\nx\n"}, out=ok("M a")),
    Case("pure addition after file without final newline", P("*** Update File: a", "@@", "+x"),
         before={"a": "a\nb"}, after={"a": "a\nb\nx\n"}, out=ok("M a")),
    Case("pure addition then a later chunk", P("*** Update File: a", "@@", "+z", "@@", "-a", "+A"),
         before={"a": "a\nb\n"}, after={"a": "A\nb\nz\n"}, out=ok("M a")),
    # --- seek ladder -------------------------------------------------------------------
    Case("exact later beats trim_end earlier", P("*** Update File: a", "@@", "-x", "+X"),
         before={"a": "x  \ny\nx\n"}, after={"a": "x  \ny\nX\n"}, out=ok("M a")),
    Case("trailing whitespace ignored", P("*** Update File: a", "@@", "-x", "+X"),
         before={"a": "x \t\n"}, after={"a": "X\n"}, out=ok("M a")),
    Case("surrounding whitespace ignored", P("*** Update File: a", "@@", "-x", "+X"),
         before={"a": "   x\n"}, after={"a": "X\n"}, out=ok("M a")),
    Case("trim beats punctuation pass", P("*** Update File: a", "@@", "-a-b", "+ok"),
         before={"a": "a\u2013b\n  a-b\n"}, after={"a": "a\u2013b\nok\n"}, out=ok("M a")),
    Case("unicode dashes and quotes normalised",
         P("*** Update File: a", "@@", " x", '-say "hi" - it\'s', "+done"),
         before={"a": "x\nsay \u201chi\u201d \u2014 it\u2019s\n"}, after={"a": "x\ndone\n"},
         out=ok("M a")),
    Case("odd spaces normalised", P("*** Update File: a", "@@", "-a b", "+c"),
         before={"a": "a\u00a0b\n"}, after={"a": "c\n"}, out=ok("M a")),
    Case("loosely matched context kept verbatim",
         P("*** Update File: a", "@@", " a b", "-c", "+C"), before={"a": "a\u00a0b  \nc\n"},
         after={"a": "a\u00a0b  \nC\n"}, out=ok("M a")),
    Case("trailing empty old line forgiven once", P("*** Update File: a", "@@", "-b", "+B", ""),
         before={"a": "a\nb\n"}, after={"a": "a\nB\n"}, out=ok("M a")),
    Case("two trailing blank lines break matching",
         P("*** Update File: a", "@@", "-b", "+B", "", ""), before={"a": "a\nb\n"},
         err="Failed to find expected lines in <D>/a:\nb\n\n"),
    # --- End of File ---------------------------------------------------------------------
    Case("eof anchors at the end", P("*** Update File: a", "@@", "-x", "+X", "*** End of File"),
         before={"a": "x\ny\nx\n"}, after={"a": "x\ny\nX\n"}, out=ok("M a")),
    Case("eof: no fallback search", P("*** Update File: a", "@@", "-x", "+X", "*** End of File"),
         before={"a": "x\ny\n"}, err="Failed to find expected lines in <D>/a:\nx"),
    Case("eof marker with trailing whitespace",
         P("*** Update File: a", "@@", "-y", "+Y", "*** End of File   "), before={"a": "x\ny\n"},
         after={"a": "x\nY\n"}, out=ok("M a")),
    Case("eof followed by blank lines then next chunk (binary)",
         P("*** Update File: a", "@@", "-y", "+Y", "*** End of File", "", "\t", "@@", "+z"),
         before={"a": "x\ny\n"}, after={"a": "x\nY\nz\n"}, out=ok("M a")),
    Case("eof position before cursor fails (binary)",
         P("*** Update File: a", "@@", "-there", "+B", "@@", " there", "*** End of File"),
         before={"a": "hi\nthere\n"}, err="Failed to find expected lines in <D>/a:\nthere"),
    Case("indented eof marker is a context line",
         P("*** Update File: a", "@@", "-y", "+Y", "  *** End of File"), before={"a": "y\n"},
         err="Failed to find expected lines in <D>/a:\ny\n *** End of File"),
    # --- line endings --------------------------------------------------------------------
    Case("crlf file keeps crlf", P("*** Update File: a", "@@", " a", "-b", "+B", "+C"),
         before={"a": b"a\r\nb\r\nc\r\n"}, after={"a": b"a\r\nB\r\nC\r\nc\r\n"}, out=ok("M a")),
    Case("new lines take the first line break's ending (mixed file stays mixed)",
         P("*** Update File: a", "@@", " b", "-c", "+C"), before={"a": b"a\r\nb\nc\n"},
         after={"a": b"a\r\nb\nC\r\n"}, out=ok("M a")),
    Case("crlf patch on lf file", "*** Begin Patch\r\n*** Update File: a\r\n@@\r\n-a\r\n+A\r\n"
         "*** End Patch\r\n", before={"a": "a\n"}, after={"a": "A\n"}, out=ok("M a")),
    Case("final line without ending gets the preferred ending",
         P("*** Update File: a", "@@", "-a", "+A"), before={"a": b"a\r\nb"},
         after={"a": b"A\r\nb\r\n"}, out=ok("M a")),
    Case("U+2028, form feed, VT, U+0085 are ordinary characters in files",
         P("*** Update File: a", "@@", "-x\u2028y\x0cz\x0bw\x85v", "+ok"),
         before={"a": "x\u2028y\x0cz\x0bw\x85v\n"}, after={"a": "ok\n"}, out=ok("M a")),
    Case("a lone CR ends a file line (binary)", P("*** Update File: a", "@@", "-y", "+Y"),
         before={"a": b"x\ry\nz\n"}, after={"a": b"x\rY\rz\n"}, out=ok("M a")),
    Case("a patch line containing CR never matches a CR-split file line (binary)",
         P("*** Update File: a", "@@", "-x\ry", "+Y"), before={"a": b"x\ry\n"},
         err="Failed to find expected lines in <D>/a:\nx\ry"),
    Case("final lone CR is that line's ending (binary)", P("*** Update File: a", "@@", "+y"),
         before={"a": b"x\r"}, after={"a": b"x\ry\r"}, out=ok("M a")),
    # --- moves ---------------------------------------------------------------------------
    Case("move", P("*** Update File: old/a", "*** Move to: new/dir/b", "@@", "-x", "+y"),
         before={"old/a": "x\n", "old/keep": "k\n"},
         after={"new/dir/b": "y\n", "old/keep": "k\n"}, out=ok("M new/dir/b")),
    Case("move overwrites destination", P("*** Update File: a", "*** Move to: b", "@@", "-x", "+y"),
         before={"a": "x\n", "b": "old\n"}, after={"b": "y\n"}, out=ok("M b")),
    Case("move onto itself is an in-place update",
         P("*** Update File: a", "*** Move to: ./a", "@@", "-x", "+y"), before={"a": "x\n"},
         after={"a": "y\n"}, out=ok("M ./a")),
    Case("move destination trailing spaces trimmed",
         P("*** Update File: a", "*** Move to: b  ", "@@", "-x", "+y"), before={"a": "x\n"},
         after={"b": "y\n"}, out=ok("M b")),
    Case("move onto a directory fails, source kept",
         P("*** Update File: a", "*** Move to: d", "@@", "-x", "+y"),
         before={"a": "x\n", "d": None}, err="Failed to write file <D>/d"),
    # --- read failures -------------------------------------------------------------------
    Case("update missing file", P("*** Update File: nope", "@@", "+x"),
         err="Failed to read file to update <D>/nope: No such file or directory (os error 2)"),
    Case("update a directory", P("*** Update File: d", "@@", "+x"), before={"d": None},
         err="Failed to read file to update <D>/d: path `<D>/d` is not a file"),
    Case("update invalid utf-8", P("*** Update File: b", "@@", "+x"),
         before={"b": b"ok\xe2\x28\xa1"},
         err="Failed to read file to update <D>/b: invalid utf-8 sequence of 1 bytes from index 2"),
    Case("update truncated utf-8", P("*** Update File: b", "@@", "+x"),
         before={"b": b"ok\xe2\x82"},
         err="Failed to read file to update <D>/b: incomplete utf-8 byte sequence from index 2"),
    # --- order, no rollback --------------------------------------------------------------
    Case("failure after partial success leaves earlier hunks",
         P("*** Add File: created.txt", "+hi", "*** Update File: missing.txt", "@@", "-a", "+b"),
         after={"created.txt": "hi\n"},
         err="Failed to read file to update <D>/missing.txt: No such file or directory "
         "(os error 2)"),
    Case("summary grouped A, M, D with duplicates",
         P("*** Delete File: f", "*** Add File: f", "+new", "*** Update File: g", "@@", "+x",
           "*** Add File: h"),
         before={"f": "old\n", "g": ""}, after={"f": "new\n", "g": "x\n", "h": ""},
         out=ok("A f", "A h", "M g", "D f")),
    Case("no hunks", P(), err="No files were modified."),
    Case("environment id is ignored", P("*** Environment ID: env-1", "*** Add File: a", "+x"),
         after={"a": "x\n"}, out=ok("A a")),
    # --- parse errors touch nothing ------------------------------------------------------
    Case("parse error applies nothing", P("*** Add File: a", "+x", "bad"),
         err="Invalid patch hunk on line 4: 'bad' is not a valid hunk header. Valid hunk "
         "headers: '*** Add File: {path}', '*** Delete File: {path}', '*** Update File: {path}'"),
    Case("heredoc-wrapped literal argument", "<<'EOF'\n" + P("*** Add File: a", "+x") + "\nEOF\n",
         after={"a": "x\n"}, out=ok("A a")),
]
# fmt: on


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_apply_case(backend: Any, case: Case) -> None:
    backend.seed(case.before)
    before = backend.snapshot()
    try:
        result = await apply_patch(case.patch, backend.root, backend.fs)
    except PatchError as exc:
        assert case.err is not None, f"unexpected error: {exc}"
        assert str(exc).replace(str(backend.root), "<D>") == case.err
    else:
        assert case.err is None, "expected an error"
        assert result.summary() == case.out
    after = {k: v for k, v in backend.snapshot().items() if v is not None}
    if case.after is None:
        assert after == {k: v for k, v in before.items() if v is not None}
    else:
        expected = {k: v.encode() if isinstance(v, str) else v for k, v in case.after.items()}
        assert after == expected


async def test_table_against_served_subprocess(server: Any, root: Path) -> None:
    """The whole table once more, against a real ``exec-server serve`` child process."""
    from exec_server.client.connection import ExecServerClient
    from exec_server.client.fs import RemoteFileSystem

    client = await ExecServerClient.connect(server.url)
    try:
        fs = RemoteFileSystem(client)
        for number, case in enumerate(CASES):
            case_root = root / str(number)
            case_root.mkdir()
            for rel, content in case.before.items():
                path = case_root / rel
                if content is None:
                    path.mkdir(parents=True, exist_ok=True)
                    continue
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(content.encode() if isinstance(content, str) else content)
            before = _files(case_root)
            try:
                result = await apply_patch(case.patch, case_root, fs)
            except PatchError as exc:
                assert str(exc).replace(str(case_root), "<D>") == case.err, case.name
            else:
                assert result.summary() == case.out, case.name
            expected = before if case.after is None else {
                k: v.encode() if isinstance(v, str) else v for k, v in case.after.items()
            }
            assert _files(case_root) == expected, case.name
    finally:
        await client.aclose()


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }
