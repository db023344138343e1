"""A sandbox object's cost grows with its size, not its square; past a bound it is refused.

A ``process/start`` whose context had 3,000 entries cost 1.9 s of server CPU
(every rule path was checked against every other). The cost is counted here
in Python function calls (deterministic, unlike time): ten times the entries
may cost at most ~20 times the calls.
"""

from __future__ import annotations

import cProfile
import json
import pstats
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from exec_server.client.sandbox_contexts import to_wire, workspace_write
from exec_server.exceptions import InvalidParamsError
from exec_server.protocol.types.sandbox import MAX_SANDBOX_ENTRIES, decode_launch_sandbox
from exec_server.sandbox.convert import launch_request


def _context(workspace: Path, extra: int) -> dict[str, Any]:
    wire: dict[str, Any] = to_wire(workspace_write(str(workspace)))
    entries = wire["permissions"]["file_system"]["entries"]
    for i in range(extra):
        entries.append(
            {
                "path": {"type": "path", "path": f"{workspace}/d{i % 50}/e{i}"},
                "access": ("read", "write", "none")[i % 3],
            }
        )
    return wire


def _calls(fn: Callable[[], object]) -> int:
    profile = cProfile.Profile()
    profile.runcall(fn)
    return int(pstats.Stats(profile).total_calls)  # type: ignore[attr-defined]


def test_plan_cost_is_linear_in_the_entries(tmp_path: Path) -> None:
    def plan(n: int) -> Callable[[], object]:
        request = launch_request(decode_launch_sandbox(
            msgspec.Raw(json.dumps(_context(tmp_path, n)).encode())),
            command_cwd=str(tmp_path),
            enforce_managed_network=False,
            tmpdir=None,
        )
        return lambda: request.plan(tmpdir=None, platform_defaults=())

    small, big = _calls(plan(300)), _calls(plan(3000))
    assert big < 20 * small, (small, big)


def test_past_the_bound_is_refused_naming_the_list(tmp_path: Path) -> None:
    wire = _context(tmp_path, MAX_SANDBOX_ENTRIES)
    with pytest.raises(InvalidParamsError) as info:
        launch_request(decode_launch_sandbox(
            msgspec.Raw(json.dumps(wire).encode())),
            command_cwd=str(tmp_path),
            enforce_managed_network=False,
            tmpdir=None,
        )
    assert "sandbox.permissions.file_system.entries" in info.value.message
    assert str(MAX_SANDBOX_ENTRIES) in info.value.message
    legacy = {
        "sandboxPolicy": {
            "type": "workspace-write",
            "writable_roots": [f"/w/{i}" for i in range(MAX_SANDBOX_ENTRIES + 1)],
        },
    }
    with pytest.raises(InvalidParamsError) as info:
        launch_request(decode_launch_sandbox(
            msgspec.Raw(json.dumps(legacy).encode())),
            command_cwd=str(tmp_path),
            enforce_managed_network=False,
            tmpdir=None,
        )
    assert "writable_roots" in info.value.message


async def test_an_oversized_context_gets_an_error_and_the_connection_goes_on(
    server: Any, rpc: Callable[..., Any], tmp_path: Path
) -> None:
    client = await rpc(server.url)
    await client.initialize()
    reply = await client.request(
        "process/start",
        {
            "processId": "big",
            "argv": ["true"],
            "cwd": str(tmp_path),
            "env": {},
            "tty": False,
            "arg0": None,
            "sandbox": _context(tmp_path, MAX_SANDBOX_ENTRIES),
        },
    )
    assert reply["error"]["code"] == -32602
    assert "length <= 4096" in reply["error"]["message"]
    assert await client.call("fs/getMetadata", {"path": str(tmp_path)})
