"""Property tests: generated patches turn A into B; the parser and applier never crash."""

from __future__ import annotations

import asyncio
import contextlib
import difflib
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exec_server.patch.apply import apply_patch
from exec_server.patch.content import derive_new_contents
from exec_server.patch.errors import ParseError, PatchError
from exec_server.patch.parse import UpdateFile, parse_patch

ROOT = Path("/w")

# Lines include whitespace variants, typographic punctuation and patch-marker look-alikes.
_ATOMS = ["a", "b", " ", "\t", "*** End Patch", "@@", "-", "+", "\u2013", "\u201c", "\u00a0", "x"]
line_text = st.lists(st.sampled_from(_ATOMS), max_size=4).map("".join)


@st.composite
def file_pair(draw: st.DrawFn) -> tuple[list[str], list[str], str, bool]:
    """(A lines, B lines, line ending, A has a final newline); A's lines are unique."""
    a = draw(st.lists(line_text, unique=True, max_size=12))
    b = list(a)
    for _ in range(draw(st.integers(0, 5))):
        op = draw(st.sampled_from(["insert", "delete", "replace"]))
        if op == "insert" or not b:
            b.insert(draw(st.integers(0, len(b))), draw(line_text))
        elif op == "delete":
            del b[draw(st.integers(0, len(b) - 1))]
        else:
            b[draw(st.integers(0, len(b) - 1))] = draw(line_text)
    ending = draw(st.sampled_from(["\n", "\r\n"]))
    # A last line "" only exists if a newline follows it.
    final_newline = draw(st.booleans()) or (bool(a) and a[-1] == "")
    return a, b, ending, final_newline


def make_patch(a: list[str], b: list[str], context: int, blank_as_space: bool) -> str:
    """An Update hunk from A to B built from difflib's grouped opcodes."""
    lines = ["*** Begin Patch", "*** Update File: f"]
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    groups = list(matcher.get_grouped_opcodes(context)) if a != b else []
    if not groups:
        lines += ["@@", *[f" {x}" for x in a[:1]]] if a else ["@@", "+"] if b else []
    for group in groups:
        lines.append("@@")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                lines += [(" " + x) if x or blank_as_space else "" for x in a[i1:i2]]
            else:
                lines += ["-" + x for x in a[i1:i2]]
                lines += ["+" + x for x in b[j1:j2]]
    lines.append("*** End Patch")
    return "\n".join(lines)


@settings(max_examples=300, deadline=None)
@given(file_pair(), st.integers(1, 3), st.booleans())
def test_generated_patch_turns_a_into_b(
    pair: tuple[list[str], list[str], str, bool], context: int, blank_as_space: bool
) -> None:
    a, b, ending, final_newline = pair
    if not a and not b:
        return
    original = ending.join(a) + (ending if final_newline and a else "")
    patch = make_patch(a, b, context, blank_as_space)
    (hunk,) = parse_patch(patch).hunks
    assert isinstance(hunk, UpdateFile)
    # New lines take the file's first line ending ("\n" when it has none) and the
    # result always ends with a line break (§8.4, §8.5).
    preferred = ending if len(a) > 1 or (a and final_newline) else "\n"
    expected = "".join(x + preferred for x in b)
    assert derive_new_contents(original, hunk.chunks, "/w/f") == expected


class _DictFs:
    """A tiny fake for the crash-freedom property (paths are never outside /w)."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = dict(files)

    async def read_file(self, path: Path, sandbox: object = None) -> bytes:
        try:
            return self.files[str(path)]
        except KeyError:
            raise FileNotFoundError(2, "No such file or directory") from None

    async def write_file(self, path: Path, data: bytes, sandbox: object = None) -> None:
        self.files[str(path)] = data

    async def create_directory(
        self, path: Path, *, recursive: bool = True, sandbox: object = None
    ) -> None:
        return None

    async def get_metadata(self, path: Path, sandbox: object = None) -> _Meta:
        if str(path) not in self.files:
            raise FileNotFoundError(2, "No such file or directory")
        return _Meta()

    async def remove(
        self, path: Path, *, recursive: bool = False, force: bool = False, sandbox: object = None
    ) -> None:
        if self.files.pop(str(path), None) is None:
            raise FileNotFoundError(2, "No such file or directory")


class _Meta:
    is_directory = False
    is_file = True


_PATCH_LINES = [
    "*** Begin Patch", "*** End Patch", "*** Add File: f", "*** Delete File: f",
    "*** Update File: f", "*** Update File: g", "*** Move to: g", "*** End of File",
    "*** Environment ID: e", "@@", "@@ a", "@@ x", " a", "-a", "+a", " x", "-x", "+b", "",
    "  ", "\t", "bad", "<<EOF", "EOF", " *** End Patch", "+*** End Patch",
]  # fmt: skip


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.one_of(st.sampled_from(_PATCH_LINES), st.text(max_size=8)), max_size=14),
    st.sampled_from(["\n", "\r\n"]),
    st.dictionaries(st.sampled_from(["/w/f", "/w/g"]), st.binary(max_size=12), max_size=2),
)
def test_random_patches_only_raise_patch_errors(
    lines: list[str], sep: str, files: dict[str, bytes]
) -> None:
    """Structured fuzz: parse + apply either succeed or raise our typed errors."""
    text = sep.join(lines)
    fs = _DictFs(files)
    with contextlib.suppress(PatchError):
        asyncio.run(apply_patch(text, ROOT, fs))


@settings(max_examples=500, deadline=None)
@given(st.text())
def test_parser_never_raises_anything_but_parse_error(text: str) -> None:
    with contextlib.suppress(ParseError):
        parse_patch(text)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=6), max_size=10))
def test_enveloped_random_bodies(body: list[str]) -> None:
    try:
        parsed = parse_patch("\n".join(["*** Begin Patch", *body, "*** End Patch"]))
    except ParseError as exc:
        assert str(exc).startswith(("Invalid patch: ", "Invalid patch hunk on line "))
    else:
        assert parsed.patch.startswith("*** Begin Patch")
