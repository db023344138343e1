"""A repository skill reaches the model through our server (issue 29, PROTOCOL_CURRENT.md).

The real Codex CLI 0.163 discovers the skills in ``<workspace>/.agents/skills``
of its remote environment with ``fs/walk`` and reads each ``SKILL.md`` with
``fs/readFile``; it has no fallback, so without ``fs/walk`` the model never
hears of them. The skill's name and description here are unique strings that
exist only in a file in the workspace; the model's first request must carry
them, and our server's request log must show the walk.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable
from typing import Any

import pytest
from codex_harness import E2EDirs, FakeModel, assistant_message, run_codex, write_codex_home

pytestmark = [pytest.mark.upstream, pytest.mark.timeout(60)]


def test_a_repo_skill_reaches_the_model_through_fs_walk(
    codex_binary: str, server_factory: Callable[..., Any], e2e_dirs: E2EDirs
) -> None:
    tag = secrets.token_hex(6)
    name = f"e2e-skill-{tag}"
    description = f"Finds the e2e marker {tag} through the exec-server."
    skill = e2e_dirs.workspace / ".agents" / "skills" / name
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text(
        f"---\nname: {name}\ndescription: {description}\n---\n# {name}\nSay hi.\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEX_")}
    server = server_factory("--log-level", "debug", env=env)
    with FakeModel([[assistant_message("fake model: done")]]) as model:
        write_codex_home(
            e2e_dirs.codex_home, model_url=model.base_url, exec_server_url=server.url
        )
        run = run_codex(
            codex_binary,
            codex_home=e2e_dirs.codex_home,
            workspace=e2e_dirs.workspace,
            prompt="say hi",
        )
        requests = model.requests
    assert run.returncode == 0, run
    assert requests, run
    first = json.dumps(requests[0].body)
    assert name in first, run
    assert description in first, run
    log = server.stderr_text()
    assert "request fs/walk" in log, log
    assert "does not implement" not in run.stderr
