"""Packaging metadata, the shipped license, and docs that link only to files that exist."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _project() -> dict[str, object]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        project: dict[str, object] = tomllib.load(f)["project"]
    return project


def test_license_is_spdx_and_shipped() -> None:
    project = _project()
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License")
    assert "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_classifiers_and_urls() -> None:
    project = _project()
    classifiers = project["classifiers"]
    assert isinstance(classifiers, list)
    for wanted in ("Typing :: Typed", "Operating System :: POSIX :: Linux",
                   "Programming Language :: Python :: 3.11"):
        assert wanted in classifiers
    # PEP 639: the license is the expression, never a classifier too
    assert not any(c.startswith("License ::") for c in classifiers)
    urls = project["urls"]
    assert isinstance(urls, dict) and urls
    assert all(str(u).startswith("https://") for u in urls.values())


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_docs_link_only_to_files_in_the_repository() -> None:
    missing = []
    for md in _markdown_files():
        for match in re.finditer(r"\[[^\]]*\]\(([^)\s]+)\)", md.read_text()):
            target = match.group(1).split("#")[0]
            if not target or re.match(r"^[a-z]+:", target):
                continue
            if not (md.parent / target).exists():
                missing.append(f"{md.relative_to(ROOT)}: {target}")
    assert missing == []


def test_readme_starts_with_the_two_command_blocks() -> None:
    """``.ci/run`` runs the second block: both stay the first two, unchanged."""
    blocks = re.findall(r"```(\w*)\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks[:2] == [
        ("sh", "pip install . && exec-server serve --listen ws://127.0.0.1:0\n"),
        ("sh", "pip install -e '.[test]' && pytest\n"),
    ]


def test_readme_is_honest_about_macos() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "never been run" in readme and "Seatbelt" in readme
