"""The executor host's Codex config layers, cut down to the keys a client asks for
(``environmentConfig/read``, PROTOCOL_CURRENT.md §10): the system file, then
``$CODEX_HOME/config.toml``; a project's ``.codex/config.toml`` is left out (upstream leaves
untrusted projects out, and the executor cannot tell trust)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "SYSTEM_CONFIG",
    "SYSTEM_REQUIREMENTS",
    "ConfigLayer",
    "ConfigReadError",
    "HostConfig",
    "read_host_config",
    "select_keys",
]

SYSTEM_CONFIG: Final = "/etc/codex/config.toml"
SYSTEM_REQUIREMENTS: Final = "/etc/codex/requirements.toml"


class ConfigReadError(Exception):
    """A config file exists but cannot be read or is not TOML; ``message`` says which."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, slots=True)
class ConfigLayer:
    """One file's selected keys. ``base_dir`` is the file's directory (relative paths in it)."""

    source: str
    base_dir: str
    toml: str


@dataclass(frozen=True, slots=True)
class HostConfig:
    codex_home: str
    config: list[ConfigLayer]
    requirements: list[ConfigLayer]


def select_keys(document: Mapping[str, Any], key_paths: Sequence[Sequence[str]]) -> dict[str, Any]:
    """The parts of ``document`` under any of ``key_paths``, nested as in the document."""
    selected: dict[str, Any] = {}
    for path in key_paths:
        node: Any = document
        for key in path:
            if not isinstance(node, Mapping) or key not in node:
                break
            node = node[key]
        else:
            target = selected
            for key in path[:-1]:
                target = target.setdefault(key, {})
            target[path[-1]] = node
    return selected


def _layers(
    files: Sequence[tuple[str, str]], key_paths: Sequence[Sequence[str]]
) -> list[ConfigLayer]:
    if not key_paths:
        return []
    # Imported here: every server module imports this module's error class (through
    # exceptions.py); only environmentConfig/read reads TOML.
    import tomllib

    import tomli_w

    layers: list[ConfigLayer] = []
    for label, path in files:
        try:
            with open(path, "rb") as file:
                document = tomllib.load(file)
        except FileNotFoundError:
            continue
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigReadError(f"failed to read config file {path}: {exc}") from None
        selected = select_keys(document, key_paths)
        if selected:
            layers.append(ConfigLayer(f"{label} ({path})", os.path.dirname(path),
                                      tomli_w.dumps(selected)))
    return layers


def read_host_config(
    config_paths: Sequence[Sequence[str]],
    requirements_paths: Sequence[Sequence[str]],
    environ: Mapping[str, str],
    *,
    system_config: str = SYSTEM_CONFIG,
    system_requirements: str = SYSTEM_REQUIREMENTS,
) -> HostConfig:
    """Read the layers (blocking file I/O: run it off the event loop); ConfigReadError for
    a config file that exists but is unreadable or not TOML."""
    home = environ.get("CODEX_HOME") or os.path.join(os.path.expanduser("~"), ".codex")
    user_config = os.path.join(home, "config.toml")
    return HostConfig(
        codex_home=home,
        config=_layers((("system", system_config), ("user", user_config)), config_paths),
        requirements=_layers((("system", system_requirements),), requirements_paths),
    )
