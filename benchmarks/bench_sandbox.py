#!/usr/bin/env python3
"""Sandbox benchmark: sandboxed ``true`` start->closed, ours per backend vs upstream.

Starts, one after the other, our server with ``--sandbox-backend bwrap``, ours
with ``--sandbox-backend landlock`` and (when installed, ``pip install
openai-codex-cli-bin``) the upstream ``codex exec-server``, and measures over
the shared raw WebSocket client (TCP_QUICKACK client, the fair mode):

  sandboxed true start->closed   process/start of ``true`` with the current
                                 client's ``permissions`` workspace-write shape
                                 (recording sandboxed_shell.rpc.jsonl), until
                                 process/closed; the reply's sandboxType must be
                                 ``linuxSeccomp`` and the exit code 0
  denied write                   one ``sh -c 'echo > outside'`` checked to fail
                                 (proves the figure is for a real sandbox)

Also times ``backend.wrap()`` alone in this process (no spawn) for each backend.
Target: ours/upstream <= 0.25 per backend.

Usage: python benchmarks/bench_sandbox.py [--quick] [--no-upstream] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (
    UPSTREAM,
    RawClient,
    Report,
    ServerTarget,
    Summary,
    ours_target,
    start_server,
    summarize,
    upstream_target,
)

METRIC = "sandboxed true start->closed"
TARGET_RATIO = 0.25


def permissions_sandbox(c: RawClient, workspace: str) -> dict[str, object]:
    """The current client's workspace-write ``sandbox`` member (CLIENT_COMPAT.md §1.4)."""
    def special(kind: str, subpath: str | None = None) -> dict[str, object]:
        value: dict[str, object] = {"kind": kind}
        if subpath is not None:
            value["subpath"] = subpath
        return {"type": "special", "value": value}

    entries: list[dict[str, object]] = [
        {"path": special("root"), "access": "read"},
        {"path": special("project_roots"), "access": "write"},
        {"path": special("slash_tmp"), "access": "write"},
        {"path": special("tmpdir"), "access": "write"},
    ]
    for name in (".git", ".agents", ".codex", ".aws"):
        entries.append({"path": special("project_roots", name), "access": "read",
                        "missing_path_behavior": "skip"})
    return {
        "permissions": {"type": "managed",
                        "file_system": {"type": "restricted", "entries": entries},
                        "network": "restricted"},
        "cwd": c.path(workspace),
        "workspaceRoots": [c.path(workspace)],
        "windowsSandboxLevel": "disabled",
        "windowsSandboxProxySettingsMode": "reconcile",
        "useLegacyLandlock": False,
    }


def _env() -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C",
            "CODEX_SANDBOX_NETWORK_DISABLED": "1"}


async def _start(c: RawClient, pid: str, argv: list[str], workspace: str) -> dict[str, object]:
    c.track(pid)
    params = {"processId": pid, "argv": argv, "cwd": c.path(workspace), "env": _env(),
              "tty": False, "pipeStdin": False, "arg0": None,
              "sandbox": permissions_sandbox(c, workspace), "enforceManagedNetwork": False}
    result: dict[str, object] = await c.call("process/start", params)
    return result


async def bench_target(target: ServerTarget, n: int, outside: str) -> tuple[Summary, str]:
    workspace = tempfile.mkdtemp(prefix="bench_sandbox_ws_", dir="/var/tmp")
    try:
        async with start_server(target, cwd=workspace) as srv, \
                await RawClient.connect(srv.url, quickack=True) as c:
            await c.handshake()
            # correctness first: a write outside the workspace must fail
            probe = os.path.join(outside, f"{target.name}-escape")
            pid = f"deny-{uuid.uuid4().hex[:8]}"
            await _start(c, pid, ["sh", "-c", f"echo x > {probe}"], workspace)
            st = await c.wait_closed(pid)
            if st.exit_code == 0 or await asyncio.to_thread(os.path.exists, probe):
                raise AssertionError(f"{target.name}: write outside the workspace succeeded")
            samples = []
            kind = ""
            for i in range(n + 2):
                pid = f"sbt-{uuid.uuid4().hex[:12]}"
                t0 = time.perf_counter()
                res = await _start(c, pid, ["true"], workspace)
                st = await c.wait_closed(pid)
                dt = (time.perf_counter() - t0) * 1000
                c.forget(pid)
                kind = str(res.get("sandboxType") or res.get("sandbox"))
                if st.exit_code != 0:
                    raise AssertionError(f"{target.name}: true exited {st.exit_code}")
                if i >= 2:  # first launches warm probes and caches
                    samples.append(dt)
            return summarize(samples), kind
    finally:
        shutil.rmtree(workspace, ignore_errors=True)


def wrap_cost(n: int) -> dict[str, Summary]:
    """``backend.wrap()`` alone (argv build, seccomp pipe), per backend, in µs."""
    from exec_server.process.spec import LaunchSpec
    from exec_server.sandbox.plan import SandboxPlan
    from exec_server.sandbox.select import SandboxUnavailableError, select_backend

    ws = tempfile.mkdtemp(prefix="bench_wrap_")
    plan = SandboxPlan(full_read=True, full_write=False, network=False, cwd=ws,
                       writable_roots=(ws, "/tmp"),
                       read_only_subpaths=tuple(os.path.join(ws, p) for p in (".git", ".codex")))
    out: dict[str, Summary] = {}
    try:
        for name in ("bwrap", "landlock"):
            try:
                backend = select_backend(name)
            except SandboxUnavailableError:
                continue
            assert backend is not None
            samples = []
            for _ in range(n):
                t0 = time.perf_counter()
                w = backend.wrap(LaunchSpec(argv=["true"], cwd=ws, env={}), plan)
                samples.append((time.perf_counter() - t0) * 1e6)
                for fd in w.pass_fds:
                    os.close(fd)
                if w.cleanup is not None:
                    w.cleanup()
            out[name] = summarize(samples)
    finally:
        shutil.rmtree(ws, ignore_errors=True)
    return out


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="few iterations (smoke run)")
    ap.add_argument("--no-upstream", action="store_true", help="skip the upstream server")
    ap.add_argument("-n", type=int, default=40, help="samples per server (default 40)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args()
    n = 3 if args.quick else args.n
    targets: list[ServerTarget] = []
    for backend in ("bwrap", "landlock"):
        t = ours_target("--sandbox-backend", backend)
        targets.append(ServerTarget(f"ours-{backend}", t.argv, t.env))
    up = None if args.no_upstream else upstream_target()
    if up is not None:
        targets.append(up)
    report = Report("sandbox", [t.name for t in targets])
    report.metric(METRIC, "ms", target=TARGET_RATIO)
    outside = tempfile.mkdtemp(prefix="bench_sandbox_outside_", dir="/var/tmp")
    figures: dict[str, object] = {}
    try:
        for t in targets:
            summary, kind = await bench_target(t, n, outside)
            report.add(t.name, METRIC, summary)
            report.notes.append(f"{t.name}: sandboxType={kind} median={summary.median:.2f} ms "
                                f"p90={summary.p90:.2f} ms n={summary.n}")
            figures[t.name] = {"median_ms": summary.median, "p90_ms": summary.p90,
                               "n": summary.n, "sandboxType": kind}
    finally:
        shutil.rmtree(outside, ignore_errors=True)
    for name, s in wrap_cost(200 if not args.quick else 5).items():
        report.notes.append(f"wrap() alone [{name}]: median {s.median:.1f} us, p90 {s.p90:.1f} us")
        figures[f"wrap-{name}"] = {"median_us": s.median, "p90_us": s.p90}
    upstream_med = figures.get(UPSTREAM)
    if isinstance(upstream_med, dict):
        for t in targets:
            f = figures[t.name]
            if t.name != UPSTREAM and isinstance(f, dict):
                ratio = f["median_ms"] / upstream_med["median_ms"]
                ok = "ok" if ratio <= TARGET_RATIO else "MISS"
                report.notes.append(f"{t.name}/upstream = {ratio:.2f}x "
                                    f"(target <= {TARGET_RATIO}) {ok}")
                f["ratio"] = ratio
    print(report.render(), flush=True)
    if args.json:
        _write_json(args.json, figures)
    return 0


def _write_json(path: str, figures: dict[str, object]) -> None:
    with open(path, "w") as fh:
        json.dump(figures, fh, indent=2)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
