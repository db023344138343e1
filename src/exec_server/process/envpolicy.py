"""Child environment from the current client's ``envPolicy`` (CLIENT_COMPAT.md §4.1):
inherit → default excludes unless ignored → ``exclude`` → ``set`` → ``includeOnly`` → the
request ``env``, unfiltered. Patterns match whole names case-insensitively, with ``*`` and
``?`` the only wildcards."""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Iterable, Mapping
from typing import Literal, Protocol

__all__ = [
    "CORE_VARIABLES",
    "DEFAULT_EXCLUDES",
    "EnvPolicyFields",
    "build_child_env",
    "child_env",
    "matches_any",
]

CORE_VARIABLES = ("PATH", "SHELL", "TMPDIR", "TEMP", "TMP", "HOME", "LANG", "LC_ALL",
                  "LC_CTYPE", "LOGNAME", "USER")
DEFAULT_EXCLUDES = ("*KEY*", "*SECRET*", "*TOKEN*")

Inherit = Literal["all", "core", "none"]


@functools.lru_cache(maxsize=256)
def _compile(pattern: str) -> re.Pattern[str]:
    # fnmatch.translate treats [...] as a class; escape it so only * and ? are special.
    translated = fnmatch.translate(pattern.lower().replace("[", "[[]"))
    return re.compile(translated)


def matches_any(name: str, patterns: Iterable[str]) -> bool:
    lowered = name.lower()
    return any(_compile(p).match(lowered) is not None for p in patterns)


def build_child_env(
    *,
    inherit: Inherit,
    ignore_default_excludes: bool,
    exclude: Iterable[str],
    set_vars: Mapping[str, str],
    include_only: Iterable[str],
    env: Mapping[str, str],
    server_env: Mapping[str, str],
) -> dict[str, str]:
    """Apply the policy to ``server_env`` (the exec-server's own environment)."""
    names = server_env if inherit == "all" else CORE_VARIABLES if inherit == "core" else ()
    excludes = (*exclude, *(() if ignore_default_excludes else DEFAULT_EXCLUDES))
    result = {k: server_env[k] for k in names if k in server_env and not matches_any(k, excludes)}
    result.update(set_vars)
    include_only = tuple(include_only)
    if include_only:
        result = {k: v for k, v in result.items() if matches_any(k, include_only)}
    result.update(env)
    return result


class EnvPolicyFields(Protocol):
    """What :func:`child_env` reads of a decoded ``envPolicy``."""

    @property
    def inherit(self) -> Inherit: ...
    @property
    def ignore_default_excludes(self) -> bool: ...
    @property
    def exclude(self) -> list[str]: ...
    @property
    def set(self) -> dict[str, str]: ...
    @property
    def include_only(self) -> list[str]: ...


def child_env(
    policy: EnvPolicyFields | None, env: Mapping[str, str], server_env: Mapping[str, str]
) -> dict[str, str]:
    """The child's environment: ``env`` alone without a policy, else :func:`build_child_env`."""
    if policy is None:
        return dict(env)
    return build_child_env(
        inherit=policy.inherit,
        ignore_default_excludes=policy.ignore_default_excludes,
        exclude=policy.exclude,
        set_vars=policy.set,
        include_only=policy.include_only,
        env=env,
        server_env=server_env,
    )
