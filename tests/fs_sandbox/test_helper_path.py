"""The one-shot helper path's failure handling, with a stand-in sandbox manager.

``wrap_plan`` is replaced by one that runs a small script instead of the
confined helper, so each failure mode (crash, garbage, wrong operation, hang,
empty command, preparation error) is exercised deterministically.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any

import pytest

from exec_server.client.fs import LocalFileSystem
from exec_server.config import ServerConfig
from exec_server.exceptions import InternalError, InvalidRequestError
from exec_server.fs.confined import SandboxedFileSystem
from exec_server.process.spec import LaunchSpec
from exec_server.sandbox.manager import SandboxLaunchError
from exec_server.sandbox.plan import SandboxPlan


class FakeManager:
    """Wraps every helper launch into ``python -c <script>`` (or fails to)."""

    def __init__(self, script: str | None, *, argv: list[str] | None = None) -> None:
        self.script = script
        self.argv = argv
        self.plans: list[SandboxPlan] = []

    async def warm(self) -> None:
        """Nothing to probe."""

    def wrap_plan(self, spec: LaunchSpec, plan: SandboxPlan) -> LaunchSpec:
        self.plans.append(plan)
        if self.script is None:
            raise SandboxLaunchError("no usable Linux sandbox backend")
        argv = self.argv if self.argv is not None else [sys.executable, "-c", self.script]
        return replace(spec, argv=argv)


def service(manager: FakeManager, timeout: float = 10.0) -> SandboxedFileSystem:
    config = ServerConfig(fs_helper_timeout=timeout)
    return SandboxedFileSystem(config, manager, mode="helper")  # type: ignore[arg-type]


CASES = [
    (
        "import sys; sys.stdin.read(); sys.stderr.write('boom\\n'); sys.exit(1)",
        "fs sandbox helper failed with status exit status: 1: boom",
    ),
    (
        "import sys; sys.stdin.read(); print('not json')",
        "failed to encode or decode fs sandbox helper message",
    ),
    (
        "import sys, json; sys.stdin.read(); print(json.dumps({'status': 'ok', 'payload': "
        "{'operation': 'fs/remove', 'response': {}}}))",
        "unexpected fs sandbox helper response: expected fs/readFile, got fs/remove",
    ),
    (
        "import sys, json; sys.stdin.read(); print(json.dumps({'status': 'ok', 'payload': "
        "{'operation': 'fs/readFile', 'response': {'dataBase64': '!!'}}}))",
        "fs/readFile returned invalid base64 dataBase64",
    ),
    (
        "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
        "fs sandbox helper failed with status signal: 9 (SIGKILL)",
    ),
]


@pytest.mark.parametrize(("script", "message"), CASES)
async def test_broken_one_shot_helper(
    no_leaks: None, layout: Any, ctx: Any, script: str, message: str
) -> None:
    (layout.allowed / "f").write_text("f")
    sfs = service(FakeManager(script))
    try:
        with pytest.raises(InternalError) as info:
            await LocalFileSystem(confined=sfs).read_file(
                layout.allowed / "f", sandbox=ctx.ro(layout.allowed)
            )
        assert info.value.code == -32603
        assert message in info.value.message
    finally:
        await sfs.aclose()


async def test_hung_one_shot_helper_is_killed(no_leaks: None, layout: Any, ctx: Any) -> None:
    (layout.allowed / "f").write_text("f")
    sfs = service(FakeManager("import time; time.sleep(60)"), timeout=0.5)
    try:
        with pytest.raises(InternalError) as info:
            await LocalFileSystem(confined=sfs).read_file(
                layout.allowed / "f", sandbox=ctx.ro(layout.allowed)
            )
        assert info.value.message == "fs sandbox helper timed out after 0.5s and was killed"
    finally:
        await sfs.aclose()


async def test_helper_errors_are_forwarded_and_the_plan_has_no_network(
    no_leaks: None, layout: Any, ctx: Any
) -> None:
    script = (
        "import sys, json; req = json.loads(sys.stdin.read()); "
        "print(json.dumps({'status': 'error', 'payload': "
        "{'code': -32004, 'message': 'No such file or directory (os error 2)'}}))"
    )
    manager = FakeManager(script)
    sfs = service(manager)
    try:
        with pytest.raises(Exception) as info:
            await LocalFileSystem(confined=sfs).read_file(
                layout.allowed / "missing", sandbox=ctx.ro(layout.allowed)
            )
        assert getattr(info.value, "code", None) == -32004
        (plan,) = manager.plans
        assert plan.network is False
        # A fresh interpreter needs its own files: they are readable in the plan.
        assert any(sys.prefix.startswith(root) for root in plan.readable_roots)
    finally:
        await sfs.aclose()


async def test_preparation_failures(no_leaks: None, layout: Any, ctx: Any) -> None:
    (layout.allowed / "f").write_text("f")
    for manager, message in (
        (FakeManager(None), "failed to prepare fs sandbox: "),
        (FakeManager("", argv=[]), "fs sandbox command was empty"),
    ):
        sfs = service(manager)
        try:
            with pytest.raises(InvalidRequestError) as info:
                await LocalFileSystem(confined=sfs).read_file(
                    layout.allowed / "f", sandbox=ctx.ro(layout.allowed)
                )
            assert info.value.message.startswith(message)
        finally:
            await sfs.aclose()
