"""The docs name only modules, functions and ``exec-server`` flags that exist.

Every backticked code span and fenced code line of README.md and docs/*.md is read:

- a path ending in ``.py`` or ``/`` (``fs/direct.py``, ``server/handlers/``,
  ``src/exec_server/exceptions.py``, ``tests/fs/``, ``benchmarks/bench_fs.py``, braces
  expanded: ``fs/helper/{client,main}.py``) must exist in the repository, relative to
  ``src/exec_server`` or to the repository root;
- a dotted name whose first part is a module or package of ``exec_server``
  (``exec_server.fs.direct``, ``exceptions.from_domain_error``,
  ``fs.errors.FsNotFoundError``) must import and resolve attribute by attribute;
- ``Class.attr`` where ``Class`` is defined in ``src`` must name something that class (or
  a base of it in ``src``) defines; ``module.attr`` where ``module`` is the name of a
  module in ``src`` (``codec.decode_message``) must name something in it; a bare
  ``name.py`` must be a file of the repository;
- a span that is one CamelCase name must name something the code has;
- an ``exec-server SUBCOMMAND ...`` command line may use only that subcommand's options,
  and a table row that starts with a flag names only ``exec-server`` options.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib
import itertools
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "exec_server"
TOP_LEVEL = {p.stem for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
TOP_LEVEL -= {"__init__", "__main__"}

#: names of ``exec_server``'s top-level modules that are also stdlib modules or variable
#: names in examples (``client.spawn``, ``fs.read_file``): a dotted span starting with one
#: of them is checked only when its first two parts name something of ours.
AMBIGUOUS = {
    "backend", "client", "config", "env", "fs", "http", "patch", "process", "request", "sandbox",
    "sync",
}


def _docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _snippets(md: Path) -> list[tuple[int, str, bool]]:
    """(line number, text, fenced) of every inline code span and every fenced code line.

    Fenced lines are example code and output (``client.fs.write_file(...)`` on a
    variable): only their paths and command lines are checked."""
    out: list[tuple[int, str, bool]] = []
    fenced = False
    for number, line in enumerate(md.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            out.append((number, line, True))
        else:
            out.extend((number, span, False) for span in re.findall(r"`([^`\n]+)`", line))
    return out


def _expand(text: str) -> list[str]:
    """``a/{b,c}.py`` -> ``a/b.py``, ``a/c.py`` (every brace group)."""
    parts = re.split(r"\{([^{}]*)\}", text)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(combo) for combo in itertools.product(*choices)]


#: first parts of a directory path (``fs/helper/``, ``tests/fs/``) that name the repository's.
TREES = {*TOP_LEVEL, "src", "tests", "benchmarks", "docs", ".ci"}

PATH = re.compile(r"(?<![\w./-])((?:[\w.{},*-]+/)+(?:[\w{},*-]+\.py)?)(?![\w/])")


def _path_exists(path: str) -> bool:
    for base in (PACKAGE, ROOT):
        if "*" in path:
            if list(base.glob(path)):
                return True
        elif (base / path).exists():
            return True
    return False


def _file_names() -> set[str]:
    """Names of the repository's Python files (for bare ``streams.py`` mentions)."""
    return {
        py.name for base in ("src", "tests", "benchmarks") for py in (ROOT / base).rglob("*.py")
    }


FILE_NAMES = _file_names()
BARE = re.compile(r"(?<![\w./*-])(\w+\.py)(?![\w/])")


def _path_problems(text: str) -> list[str]:
    problems = [name for name in BARE.findall(text) if name not in FILE_NAMES]
    for match in PATH.finditer(text):
        raw = match.group(1)
        if raw.startswith(("/", ".")):
            continue
        if not raw.endswith(".py") and raw.split("/")[0] not in TREES:
            continue  # a directory in prose (``W/``, ``a/../``) unless it is one of ours
        if "://" in text[max(0, match.start() - 8) : match.end()]:
            continue
        # ``/proc/self/``, ``/usr/bin/`` ... are absolute; only repository paths are checked
        if match.start() > 0 and text[match.start() - 1] == "/":
            continue
        for path in _expand(raw.removeprefix("src/exec_server/").removeprefix("exec_server/")):
            if not _path_exists(path):
                problems.append(path)
    return problems


DOTTED = re.compile(r"(?<![\w./-])((?:exec_server\.)?[a-z_][a-z0-9_]*(?:\.[A-Za-z_]\w*)+)")


def _resolve(dotted: str) -> bool:
    parts = dotted.removeprefix("exec_server.").split(".")
    obj: object = None
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module("exec_server." + ".".join(parts[:i]))
        except ImportError:
            continue
        rest = parts[i:]
        break
    else:
        return False
    for name in rest:
        if not hasattr(obj, name):
            if isinstance(obj, type) and name in getattr(obj, "__annotations__", {}):
                obj = None  # a field without a default
                continue
            if isinstance(obj, type) and any(
                name in getattr(base, "__annotations__", {}) for base in obj.__mro__
            ):
                obj = None
                continue
            return False
        obj = getattr(obj, name)
        if obj is None:
            break
    return True


def _dotted_problems(text: str) -> list[str]:
    problems = []
    for match in DOTTED.finditer(text):
        dotted = match.group(1).rstrip(".")
        if text[match.end() : match.end() + 3] in (".py", ".md") or dotted.endswith((".py", ".md")):
            continue
        first = dotted.removeprefix("exec_server.").split(".")[0]
        if first not in TOP_LEVEL or dotted.endswith((".json", ".toml")):
            continue
        head = ".".join(dotted.removeprefix("exec_server.").split(".")[:2])
        if first in AMBIGUOUS and not dotted.startswith("exec_server.") and not _resolve(head):
            continue  # stdlib ``http.client``-style, a variable, an error text: not ours
        if not _resolve(dotted):
            problems.append(dotted)
    return problems


@functools.cache
def _class_sources() -> dict[str, list[set[str]]]:
    """Class name -> for each class of that name in ``src``, the names it defines:
    methods, class attributes and fields, ``self.x`` assignments, and (by name) what
    its bases defined in ``src`` define."""
    found: dict[str, list[tuple[set[str], list[str]]]] = {}
    for py in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(py.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            names: set[str] = set()
            for item in ast.walk(node):
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    names.add(item.name)
                elif isinstance(item, ast.Name) and isinstance(item.ctx, ast.Store):
                    names.add(item.id)
                elif isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store):
                    names.add(item.attr)
            bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "")
                     for b in node.bases]
            found.setdefault(node.name, []).append((names, bases))

    def defined(name: str, seen: frozenset[str]) -> list[set[str]]:
        out = []
        for names, bases in found.get(name, []):
            names = set(names)
            for base in bases:
                if base not in seen:
                    for inherited in defined(base, seen | {base}):
                        names |= inherited
            out.append(names)
        return out

    return {name: defined(name, frozenset({name})) for name in found}


CLASS_ATTR = re.compile(r"(?<![\w.])([A-Z]\w*)\.([a-z_]\w*)")


def _class_attr_problems(text: str, classes: dict[str, list[set[str]]]) -> list[str]:
    problems = []
    for owner, attr in CLASS_ATTR.findall(text):
        definitions = classes.get(owner)
        if definitions is None:
            continue
        if not any(attr in names for names in definitions):
            problems.append(f"{owner}.{attr}")
    return problems


@functools.cache
def _words() -> frozenset[str]:
    """Every identifier in the repository's Python files."""
    return frozenset(
        word
        for base in ("src", "tests", "benchmarks")
        for py in (ROOT / base).rglob("*.py")
        for word in re.findall(r"\w+", py.read_text())
    )


CAMEL = re.compile(r"[A-Z][a-z0-9]+(?:[A-Z][A-Za-z0-9]*)+")


def _name_problems(text: str) -> list[str]:
    """A span that is one CamelCase name (``SandboxedFileSystem``) names a class or
    constant the code has."""
    name = text.strip()
    if CAMEL.fullmatch(name) and name not in _words():
        return [name]
    return []


@functools.cache
def _module_sources() -> dict[str, list[str]]:
    """Module stem -> the texts of ``src`` modules of that name (``codec`` -> protocol/codec.py)."""
    modules: dict[str, list[str]] = {}
    for py in PACKAGE.rglob("*.py"):
        if py.stem != "__init__":
            modules.setdefault(py.stem, []).append(py.read_text())
    return modules


STEM_ATTR = re.compile(r"(?<![\w./-])([a-z_][a-z0-9_]*)\.([A-Za-z_]\w*)(?![\w.(]*/)")


def _stem_attr_problems(text: str, modules: dict[str, list[str]]) -> list[str]:
    """``codec.decode_message``, ``app.DECODE_OFF_LOOP``: the name is in a module of that stem."""
    problems = []
    for match in STEM_ATTR.finditer(text):
        stem, attr = match.groups()
        if stem in AMBIGUOUS or stem in TOP_LEVEL or stem in sys.stdlib_module_names:
            continue
        if stem not in modules:
            if attr.startswith("_") and not attr.startswith("__"):
                problems.append(f"{stem}.{attr}")  # private: ours, in no module of that name
            continue
        if text[match.end() : match.end() + 3] == ".py" or attr in ("py", "md"):
            continue
        if match.start() > 0 and text[match.start() - 1] == ".":
            continue
        if not any(re.search(rf"\b{re.escape(attr)}\b", src) for src in modules[stem]):
            problems.append(f"{stem}.{attr}")
    return problems


@functools.cache
def _subcommand_options() -> dict[str, set[str]]:
    from exec_server.cli import main as cli_main

    options: dict[str, set[str]] = {}
    for command, _module, _help in cli_main._SUBCOMMANDS:
        parser = cli_main._build_parser(command)
        top = {s for a in parser._actions for s in a.option_strings}
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                sub = action.choices[command]
                options[command] = top | {s for a in sub._actions for s in a.option_strings}
    return options


COMMAND = re.compile(r"(?:^|[|;&]\s*|\s)(?:exec-server|python3? -m exec_server)\s+([a-z-]+)(.*)")


def _flag_problems(text: str, options: dict[str, set[str]]) -> list[str]:
    problems = []
    for match in COMMAND.finditer(text):
        command, rest = match.group(1), match.group(2)
        if command not in options:
            continue
        rest = re.split(r"\s--(?:\s|$)|\s#|[|;&]", rest)[0]  # the command's own arguments
        for flag in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", rest):
            if flag not in options[command]:
                problems.append(f"exec-server {command} {flag}")
    return problems


def _table_flag_problems(line: str, options: dict[str, set[str]]) -> list[str]:
    """A table row that starts with a flag (``| `--listen URL` | ...``): every flag of
    its first cell is an option of some ``exec-server`` subcommand."""
    if not line.startswith("| `--"):
        return []
    known = set().union(*options.values())
    cell = line.split("|")[1]
    return [flag for flag in re.findall(r"`(--[\w-]+)", cell) if flag not in known]


def test_the_checker_catches_what_it_is_for() -> None:
    """Each rule flags a made-up name and accepts a real one (so it cannot pass vacuously)."""
    assert _path_problems("see fs/direct.py and server/handlers/") == []
    assert _path_problems("fs/nowhere.py") == ["fs/nowhere.py"]
    assert _path_problems("fs/helper/{client,nothing}.py") == ["fs/helper/nothing.py"]
    assert _path_problems("router.py and nowhere.py") == ["nowhere.py"]
    assert _dotted_problems("exceptions.from_domain_error") == []
    assert _dotted_problems("exec_server.fs.direct.no_such_function") != []
    assert _dotted_problems("http.client and sync.py") == []
    assert _dotted_problems("fs.errors.NoSuchError") == ["fs.errors.NoSuchError"]
    classes = _class_sources()
    assert _class_attr_problems("Router.dispatch", classes) == []
    assert _class_attr_problems("Router.no_such_method", classes) == ["Router.no_such_method"]
    assert _name_problems("SandboxedFileSystem") == []
    gone = "Zygote" + "Pool" + "Gone"  # a name no file may hold
    assert _name_problems(gone) == [gone]
    modules = _module_sources()
    assert _stem_attr_problems("codec.decode_message, spec.LaunchSpec", modules) == []
    assert _stem_attr_problems("codec.no_such_name", modules) == ["codec.no_such_name"]
    assert _stem_attr_problems("gone._private", modules) == ["gone._private"]
    assert _stem_attr_problems("os._exit", modules) == []
    options = _subcommand_options()
    assert _flag_problems("exec-server serve --listen stdio", options) == []
    assert _flag_problems("exec-server serve --no-such-flag", options) == [
        "exec-server serve --no-such-flag"
    ]
    assert _flag_problems("exec-server exec --url U -- ls --color", options) == []
    assert _table_flag_problems("| `--listen URL`, `--detach-ttl S` | x |", options) == []
    assert _table_flag_problems("| `--listen URL`, `--gone` | x |", options) == ["--gone"]


@pytest.mark.parametrize("md", _docs(), ids=lambda p: p.name)
def test_docs_name_only_what_exists(md: Path) -> None:
    classes = _class_sources()
    modules = _module_sources()
    options = _subcommand_options()
    problems: list[str] = []
    for number, text, fenced in _snippets(md):
        found = [*_path_problems(text), *_flag_problems(text, options)]
        if not fenced:
            found += [
                *_dotted_problems(text),
                *_class_attr_problems(text, classes),
                *_stem_attr_problems(text, modules),
                *_name_problems(text),
            ]
        problems.extend(f"{md.name}:{number}: {name}" for name in found)
    for number, line in enumerate(md.read_text().splitlines(), 1):
        problems.extend(
            f"{md.name}:{number}: {flag}" for flag in _table_flag_problems(line, options)
        )
    assert problems == []
