"""Fixtures for the end-to-end tests with the real Codex CLI (see ``codex_harness.py``).

``e2e_dirs``
    A fresh ``E2EDirs`` (``root``, ``codex_home``, ``workspace``) in a
    temporary directory that is removed at teardown, whatever codex left there.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# --import-mode=importlib keeps test directories off sys.path; the harness is a
# plain module beside this file, imported by name by the tests that use it.
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


from codex_harness import E2EDirs, temporary_dirs  # noqa: E402


@pytest.fixture
def e2e_dirs() -> Iterator[E2EDirs]:
    with temporary_dirs() as dirs:
        yield dirs
