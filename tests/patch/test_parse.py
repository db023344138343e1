"""The parser: grammar, every lenient rule, exact error texts and line numbers (§2-§5).

Cases marked "binary" pin codex-cli 0.163.0 behaviour observed where the spec
is silent.
"""

from __future__ import annotations

import pytest

from exec_server.patch.errors import InvalidHunkError, InvalidPatchError, ParseError
from exec_server.patch.parse import (
    AddFile,
    DeleteFile,
    UpdateChunk,
    UpdateFile,
    parse_patch,
    split_lines,
)

HEADERS = (
    "Valid hunk headers: '*** Add File: {path}', '*** Delete File: {path}', "
    "'*** Update File: {path}'"
)
UNEXPECTED = (
    "Every line should start with ' ' (context line), '+' (added line), or '-' (removed line)"
)
FIRST = "Invalid patch: The first line of the patch must be '*** Begin Patch'"
LAST = "Invalid patch: The last line of the patch must be '*** End Patch'"


def P(*lines: str) -> str:
    return "\n".join(["*** Begin Patch", *lines, "*** End Patch"])


def chunk(
    anchor: str | None, *ops: str, eof: bool = False
) -> tuple[str | None, tuple[str, ...], tuple[str, ...], bool]:
    """(anchor, old, new, eof) from diff lines like ``" a"``, ``"-b"``, ``"+c"``."""
    old = tuple(o[1:] for o in ops if o[:1] in (" ", "-"))
    new = tuple(o[1:] for o in ops if o[:1] in (" ", "+"))
    return anchor, old, new, eof


def shape(c: UpdateChunk) -> tuple[str | None, tuple[str, ...], tuple[str, ...], bool]:
    return c.anchor, c.old_lines, c.new_lines, c.is_end_of_file


# --- valid patches -----------------------------------------------------------------------


def test_all_hunk_kinds() -> None:
    parsed = parse_patch(
        P(
            "*** Add File: path/add.py",
            "+abc",
            "+def",
            "*** Delete File: path/delete.py",
            "*** Update File: path/update.py",
            "*** Move to: path/update2.py",
            "@@ def f():",
            "-    pass",
            "+    return 123",
        )
    )
    assert parsed.hunks[0] == AddFile("path/add.py", "abc\ndef\n")
    assert parsed.hunks[1] == DeleteFile("path/delete.py")
    upd = parsed.hunks[2]
    assert isinstance(upd, UpdateFile)
    assert (upd.path, upd.move_path) == ("path/update.py", "path/update2.py")
    assert [shape(c) for c in upd.chunks] == [chunk("def f():", "-    pass", "+    return 123")]


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        # first chunk may omit @@
        ((" import foo", "+bar"), [chunk(None, " import foo", "+bar")]),
        # an empty line is an empty context line; "  " is context " "
        (("@@", "", "  ", "-x"), [chunk(None, " ", "  ", "-x")]),
        # bare @@ with trailing whitespace; "@@ " with only spaces is the same [rev]
        (("@@   ", "-a", "@@ ", "-b"), [chunk(None, "-a"), chunk(None, "-b")]),
        # anchor: one separator space removed, trailing whitespace trimmed [rev]
        (("@@  def f():  ", "-a"), [chunk(" def f():", "-a")]),
        # "@@ -1,3 +1,3 @@" is an anchor text, not a range
        (("@@ -1,3 +1,3 @@", "-a"), [chunk("-1,3 +1,3 @@", "-a")]),
        # indented @@ is a context line
        (("@@", " @@", "-a"), [chunk(None, " @@", "-a")]),
        # End of File closes the chunk, trailing whitespace allowed [rev]
        (
            ("@@", "-a", "*** End of File  ", "@@", "+b"),
            [chunk(None, "-a", eof=True), chunk(None, "+b")],
        ),
        # after End of File blank and whitespace-only lines are skipped (binary)
        (
            ("-a", "*** End of File", "", "\t", "   ", "@@", "+b"),
            [chunk(None, "-a", eof=True), chunk(None, "+b")],
        ),
        # End of File right after the header is ignored (binary)
        (("*** End of File", "-a", "+b"), [chunk(None, "-a", "+b")]),
        # indented End Patch inside a chunk is context
        (("@@", "-a", " *** End Patch"), [chunk(None, "-a", " *** End Patch")]),
    ],
)
def test_update_chunks(lines: tuple[str, ...], expected: list[object]) -> None:
    (hunk,) = parse_patch(P("*** Update File: f", *lines)).hunks
    assert isinstance(hunk, UpdateFile)
    assert [shape(c) for c in hunk.chunks] == expected


def test_context_ops_kept_in_order() -> None:
    (hunk,) = parse_patch(P("*** Update File: f", " a", "-b", "+c", "")).hunks
    assert isinstance(hunk, UpdateFile)
    assert hunk.chunks[0].ops == ((" ", "a"), ("-", "b"), ("+", "c"), (" ", ""))


@pytest.mark.parametrize(
    ("text", "hunks"),
    [
        # whole text trimmed; padded markers and headers
        (
            "\n\n  *** Begin Patch  \n   *** Add File: a  \n+x\n  *** End Patch \n\n",
            (AddFile("a", "x\n"),),
        ),
        # extra spaces after the marker stay in the path
        (P("*** Add File:   x"), (AddFile("  x", ""),)),
        # zero hunks parse
        (P(), ()),
        # CRLF patch
        ("*** Begin Patch\r\n*** Delete File: a\r\n*** End Patch\r\n", (DeleteFile("a"),)),
        # heredoc forms unwrapped
        ("<<EOF\n" + P("*** Delete File: a") + "\nEOF", (DeleteFile("a"),)),
        ("<<'EOF'\n" + P("*** Delete File: a") + "\nEOF\n", (DeleteFile("a"),)),
        ('<<"EOF"\n' + P("*** Delete File: a") + "\nEOF", (DeleteFile("a"),)),
        ("<<EOF\n" + P("*** Delete File: a") + "\nXEOF", (DeleteFile("a"),)),
        # +*** End Patch is Add content; inner End Patch then whitespace is tolerated [rev]
        (P("*** Add File: a", "+*** End Patch"), (AddFile("a", "*** End Patch\n"),)),
        (P("*** Delete File: a", "*** End Patch", "  ", ""), (DeleteFile("a"),)),
        # Move after an ignored End of File (binary); Move destination trailing ws trimmed
        (
            P("*** Update File: a", "*** End of File", "*** Move to: b ", "-x"),
            (UpdateFile("a", "b", (UpdateChunk(None, ("x",), (), False, (("-", "x"),)),)),),
        ),
    ],
)
def test_valid(text: str, hunks: tuple[object, ...]) -> None:
    assert parse_patch(text).hunks == hunks


def test_canonical_patch_text_and_environment_id() -> None:
    text = (
        "<<'EOF'\n*** Begin Patch\r\n*** Environment ID:  env  \n*** Delete File: a\n"
        "*** End Patch\nEOF\n"
    )
    parsed = parse_patch(text)
    assert (
        parsed.patch == "*** Begin Patch\n*** Environment ID:  env  \n*** Delete File: a\n"
        "*** End Patch"
    )
    assert parsed.environment_id == "env"


# --- errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", LAST),
        ("   \n ", LAST),
        ("bad", FIRST),
        ("*** Begin Patch", LAST),
        ("*** Begin Patch\nbad", LAST),
        ("*** End Patch", FIRST),
        # heredoc: other delimiters, fewer than 4 lines, mismatched quotes are not unwrapped
        ("<<'PATCH'\n" + P("*** Delete File: a") + "\nPATCH", FIRST),
        ("<<EOF\n*** Begin Patch\n*** End Patch", FIRST),
        ("<<\"EOF'\n" + P("*** Delete File: a") + "\nEOF", FIRST),
        # unwrapped text is checked again
        ("<<EOF\n*** Begin Patch\n*** Update File: a\nEOF", LAST),
        # content after an inner End Patch [rev]
        (P("*** Delete File: a", "*** End Patch", "foo"), LAST),
        (P("*** Delete File: a", "*** End Patch", "*** Begin Patch"), LAST),
        # Environment ID [rev] (binary)
        (
            P("*** Environment ID:", "*** Delete File: a"),
            "Invalid patch: apply_patch environment_id cannot be empty",
        ),
        (
            P("*** Environment ID: a", "*** Environment ID: b"),
            "Invalid patch: apply_patch environment_id cannot be specified more than once",
        ),
        (
            P("*** Delete File: a", "*** Environment ID: e"),
            f"Invalid patch hunk on line 3: '*** Environment ID: e' is not a valid hunk header. "
            f"{HEADERS}",
        ),
        # hunk headers
        (P("bad"), f"Invalid patch hunk on line 2: 'bad' is not a valid hunk header. {HEADERS}"),
        (
            P("*** add file: a"),
            f"Invalid patch hunk on line 2: '*** add file: a' is not a valid "
            f"hunk header. {HEADERS}",
        ),
        (
            P("*** Add File: a", "+x", "", "+y"),
            f"Invalid patch hunk on line 4: '' is not a valid hunk header. {HEADERS}",
        ),
        (
            P("*** Add File: a", " +x"),
            f"Invalid patch hunk on line 3: '+x' is not a valid hunk header. {HEADERS}",
        ),
        (
            P("*** Delete File: a", ""),
            f"Invalid patch hunk on line 3: '' is not a valid hunk header. {HEADERS}",
        ),
        # update hunks
        (
            P("*** Update File: a"),
            "Invalid patch hunk on line 2: Update file hunk for path 'a' is empty",
        ),
        (
            P("*** Update File: a", "*** Delete File: b"),
            "Invalid patch hunk on line 2: Update file hunk for path 'a' is empty",
        ),
        (
            P("*** Update File: a", "*** End of File"),
            "Invalid patch hunk on line 2: Update file hunk for path 'a' is empty",
        ),
        (
            P("*** Update File: a", "*** Move to: b"),
            "Invalid patch hunk on line 2: Update file hunk for path 'a' is empty",
        ),
        (
            P("*** Update File: a", "@@"),
            "Invalid patch hunk on line 4: Update hunk does not contain any lines",
        ),
        (
            P("*** Update File: a", "@@", "*** End of File"),
            "Invalid patch hunk on line 4: Update hunk does not contain any lines",
        ),
        (
            P("*** Update File: a", "bad"),
            f"Invalid patch hunk on line 3: Unexpected line found in update hunk: 'bad'. "
            f"{UNEXPECTED}",
        ),
        (
            P("*** Update File: a", "@@foo"),
            f"Invalid patch hunk on line 3: Unexpected line found in update hunk: '@@foo'. "
            f"{UNEXPECTED}",
        ),
        (
            P("*** Update File: a", "@@", "@@ x"),
            f"Invalid patch hunk on line 4: Unexpected line found in update hunk: '@@ x'. "
            f"{UNEXPECTED}",
        ),
        (
            P("*** Update File: a", "@@", "bad"),
            f"Invalid patch hunk on line 4: Unexpected line found in update hunk: 'bad'. "
            f"{UNEXPECTED}",
        ),
        (
            P("*** Update File: a", "@@", "*** Add File: x", "+y"),
            f"Invalid patch hunk on line 4: Unexpected line found in update hunk: "
            f"'*** Add File: x'. {UNEXPECTED}",
        ),
        (
            P("*** Update File: a", "\t", "-x"),
            f"Invalid patch hunk on line 3: Unexpected line found in update hunk: '\t'. "
            f"{UNEXPECTED}",
        ),
        (
            P("*** Update File: a", "*** Foo"),
            f"Invalid patch hunk on line 3: Unexpected line found in update hunk: '*** Foo'. "
            f"{UNEXPECTED}",
        ),
        (
            P("*** Update File: a", "-x", "bad"),
            "Invalid patch hunk on line 4: Expected update hunk to start with a @@ context marker, "
            "got: 'bad'",
        ),
        (
            P("*** Update File: a", "-x", "\t"),
            "Invalid patch hunk on line 4: Expected update hunk to start with a @@ context marker, "
            "got: '\t'",
        ),
        (
            P("*** Update File: a", "-x", "*** End of File", "bad"),
            "Invalid patch hunk on line 5: Expected update hunk to start with a @@ context marker, "
            "got: 'bad'",
        ),
        (
            P("*** Update File: a", "-x", "*** End of File", "", "", "bad"),
            "Invalid patch hunk on line 7: Expected update hunk to start with a @@ context marker, "
            "got: 'bad'",
        ),
        (
            P("*** Update File: a", "-x", "*** End of File", "*** End of File"),
            "Invalid patch hunk on line 5: Expected update hunk to start with a @@ context marker, "
            "got: '*** End of File'",
        ),
        (
            P("*** Update File: a", "-x", "*** Move to: b"),
            "Invalid patch hunk on line 4: Expected update hunk to start with a @@ context marker, "
            "got: '*** Move to: b'",
        ),
        # line numbers count from Begin even inside an unwrapped heredoc
        (
            "<<EOF\n" + P("*** Delete File: a", "oops") + "\nEOF",
            f"Invalid patch hunk on line 3: 'oops' is not a valid hunk header. {HEADERS}",
        ),
        # ... and the Environment ID line counts
        (
            P("*** Environment ID: e", "oops"),
            f"Invalid patch hunk on line 3: 'oops' is not a valid hunk header. {HEADERS}",
        ),
    ],
)
def test_errors(text: str, message: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_patch(text)
    assert str(info.value) == message


def test_error_types_carry_fields() -> None:
    with pytest.raises(InvalidHunkError) as hunk_err:
        parse_patch(P("bad"))
    assert hunk_err.value.line_number == 2
    assert hunk_err.value.message.startswith("'bad' is not a valid hunk header")
    with pytest.raises(InvalidPatchError) as patch_err:
        parse_patch("")
    assert patch_err.value.message == "The last line of the patch must be '*** End Patch'"


def test_split_lines_only_on_newline() -> None:
    assert split_lines("a\r\nb\u2028c\x0cd\re\n\nf") == ["a", "b\u2028c\x0cd\re", "", "f"]
    assert split_lines("") == []
    assert split_lines("x\n") == ["x"]


def test_whitespace_is_rust_white_space() -> None:
    # U+001C..U+001F are not Rust whitespace: a Begin line padded with them is wrong.
    with pytest.raises(ParseError) as info:
        parse_patch("\x1c*** Begin Patch\n*** End Patch")
    assert str(info.value) == FIRST
    # U+3000 and U+0085 are.
    assert parse_patch("\u3000*** Begin Patch\x85\n*** End Patch\u3000").hunks == ()
