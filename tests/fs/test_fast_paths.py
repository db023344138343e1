"""The handlers' ``file:///`` fast path answers exactly like the full path parser."""

from __future__ import annotations

import pytest

from exec_server.exceptions import ExecServerError
from exec_server.protocol.paths import parse_wire_path as full_parse
from exec_server.server.handlers.fs import parse_wire_path as fast_parse

CASES = [
    "file:///",
    "file:///a/b.txt",
    "file:///a/./b/../c//d/",
    "file:///..",
    "file:///a b/ü/ñ.txt",
    "file:///a%20b",
    "file:///a%FFb",
    "file:///a?x=1",
    "file:///a#frag",
    "file:///a\tb",
    "file:///a\nb",
    "file:///a\x00b",
    "file:///a/b?",
    "file:////double",
    "file://localhost/a",
    "file://other/a",
    "FILE:///Upper",
    "file:/one-slash",
    "/plain/./path/../x",
    "relative",
    "file:///a;b=c,d[e]",
    "file:///a\\b",
    "file:///a ",
    " file:///a",
    "file:///a\x01b",
    "file://LOCALHOST/a",
    "file://localhost:80/a",
    "file://user@localhost/a",
    "file:a.txt",
    "file://",
    "http://host/a",
    "file:///a/b//../c",
    "file:///a//%2e%2e/c",
    "file:///a//",
    "file://%6Cocalhost/a",
    "file://[::1/a",
]


@pytest.mark.parametrize("value", CASES)
def test_fast_parse_matches_full_parser(value: str) -> None:
    try:
        expected: object = full_parse(value)
    except ExecServerError as exc:
        expected = (type(exc), exc.code, exc.message)
    try:
        got: object = fast_parse(value)
    except ExecServerError as exc:
        got = (type(exc), exc.code, exc.message)
    assert got == expected


def _reference_normalize(path: str) -> str:
    """An independent oracle: keep named segments, let ``..`` drop the last kept one."""
    kept: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            kept = kept[:-1]
        elif segment not in ("", "."):
            kept.append(segment)
    return "/" + "/".join(kept)


def test_normalize_lexical_shortcut_matches_the_segment_walk() -> None:
    """The already-normal shortcut gives exactly the segment walk's answer."""
    import random

    from exec_server.protocol.paths import normalize_lexical

    rng = random.Random(1234)
    alphabet = ["a", "b", ".", "..", "/", ".x", "x.", " ", "\\", "é"]
    for _ in range(20000):
        tail = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 10)))
        for path in (tail, "/" + tail):
            assert normalize_lexical(path) == _reference_normalize(path), path
