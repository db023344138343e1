"""The handlers' ``file:///`` fast path answers exactly like the full path parser."""

from __future__ import annotations

import pytest

from exec_server.exceptions import ExecServerError
from exec_server.protocol.paths import parse_wire_path as full_parse
from exec_server.server.fs_handlers import parse_wire_path as fast_parse

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
