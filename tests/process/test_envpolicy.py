"""envPolicy → child environment, in CLIENT_COMPAT.md §4.1's order."""

from __future__ import annotations

from typing import Any

from exec_server.process.envpolicy import build_child_env, matches_any

SERVER_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "MONKEY": "banana",
    "my_token": "t",
    "MY_API_KEY": "k",
    "DB_SECRET": "s",
    "MARKER": "server",
    "FOO_BAR": "1",
    "CODEX_VERSION": "server-version",
}


def build(**kwargs: Any) -> dict[str, str]:
    args: dict[str, Any] = {
        "inherit": "all",
        "ignore_default_excludes": False,
        "exclude": [],
        "set_vars": {},
        "include_only": [],
        "env": {},
        "server_env": SERVER_ENV,
    }
    args.update(kwargs)
    return build_child_env(**args)


def test_inherit_all_applies_default_excludes() -> None:
    env = build()
    assert env["MARKER"] == "server"
    for name in ("MONKEY", "my_token", "MY_API_KEY", "DB_SECRET"):
        assert name not in env


def test_ignore_default_excludes_keeps_everything() -> None:
    assert build(ignore_default_excludes=True) == SERVER_ENV


def test_inherit_core_and_none() -> None:
    assert build(inherit="core") == {"PATH": "/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
    assert build(inherit="none") == {}


def test_exclude_patterns_are_case_insensitive_wildcards() -> None:
    env = build(ignore_default_excludes=True, exclude=["marker", "f?o_*"])
    assert "MARKER" not in env and "FOO_BAR" not in env
    # only * and ? are special: a bracket is literal
    env = build(ignore_default_excludes=True, exclude=["FOO[_]BAR"])
    assert "FOO_BAR" in env


def test_set_survives_exclude_but_not_include_only() -> None:
    env = build(exclude=["NEW"], set_vars={"NEW": "1"})
    assert env["NEW"] == "1"
    env = build(set_vars={"NEW": "1"}, include_only=["PATH", "HOME"])
    assert env == {"PATH": "/usr/bin:/bin", "HOME": "/root"}


def test_request_env_overlays_last_unfiltered() -> None:
    env = build(
        ignore_default_excludes=True,
        exclude=["CODEX_VERSION"],
        include_only=["PATH"],
        env={"CODEX_VERSION": "0.163.0", "EXTRA": "x"},
    )
    assert env == {"PATH": "/usr/bin:/bin", "CODEX_VERSION": "0.163.0", "EXTRA": "x"}


def test_matches_any() -> None:
    assert matches_any("MY_API_KEY", ["*key*"])
    assert not matches_any("KEYS_X", ["KEY"])
    assert matches_any("key", ["KEY"])
