#!/usr/bin/env python3
"""Sandbox benchmark: sandboxed ``true`` start->closed, ours per backend vs upstream.

Starts, one after the other, our server with ``--sandbox-backend bwrap``, ours
with ``--sandbox-backend landlock`` (launches through the helper zygote), ours
with ``--sandbox-backend landlock --no-launch-zygote`` (the launcher script per
launch; ``--no-launcher-leg`` skips it) and (when installed, ``pip install
openai-codex-cli-bin``) the upstream ``codex exec-server``, and measures over
the shared raw WebSocket client (TCP_QUICKACK client, the fair mode):

  sandboxed true start->closed   process/start of ``true`` with the current
                                 client's ``permissions`` workspace-write shape
                                 (recording sandboxed_shell.rpc.jsonl), until
                                 process/closed; the reply's sandboxType must be
                                 ``linuxSeccomp`` and the exit code 0
  unsandboxed true start->closed same ``true`` without a sandbox (the floor)
  denied write                   one ``sh -c 'echo > outside'`` checked to fail
                                 (proves the figure is for a real sandbox)

All servers run at once and samples alternate between them round by round.

Also times ``backend.wrap()`` alone in this process (no spawn) for each backend.
The budget's target: ours/upstream <= 0.25 per backend, met when the ratio's
95 % interval reaches it. ``--alt DIR`` adds another build of this server
(``PYTHONPATH=DIR``) with the same legs, named ``alt1-bwrap``, ...

Usage: python benchmarks/bench_sandbox.py [--quick] [--no-upstream] [--no-launcher-leg]
                                          [-n N] [--json FILE] [--alt DIR ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
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
    alt_targets,
    connect_client,
    ours_target,
    ratio_interval,
    start_in_temp_dir,
    summarize,
    target_met,
    temp_dir,
    upstream_target,
    write_json,
)

METRIC = "sandboxed true start->closed"
PLAIN_METRIC = "unsandboxed true start->closed"
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


class _Leg:
    """One started server, its connection and the samples taken so far."""

    def __init__(self, target: ServerTarget, client: RawClient, workspace: str) -> None:
        self.target = target
        self.client = client
        self.workspace = workspace
        self.samples: list[float] = []
        self.plain: list[float] = []
        self.kind = ""


async def _check_denied(leg: _Leg, outside: str) -> None:
    """Correctness first: a write outside the workspace must fail on this server."""
    probe = os.path.join(outside, f"{leg.target.name}-escape")
    pid = f"deny-{uuid.uuid4().hex[:8]}"
    await _start(leg.client, pid, ["sh", "-c", f"echo x > {probe}"], leg.workspace)
    st = await leg.client.wait_closed(pid)
    if st.exit_code == 0 or await asyncio.to_thread(os.path.exists, probe):
        raise AssertionError(f"{leg.target.name}: write outside the workspace succeeded")


async def _one(leg: _Leg, *, sandboxed: bool) -> float:
    c = leg.client
    pid = f"sbt-{uuid.uuid4().hex[:12]}"
    t0 = time.perf_counter()
    if sandboxed:
        res = await _start(c, pid, ["true"], leg.workspace)
        leg.kind = str(res.get("sandboxType") or res.get("sandbox"))
    else:
        await c.start(pid, ["true"], leg.workspace, env=_env())
    st = await c.wait_closed(pid)
    dt = (time.perf_counter() - t0) * 1000
    c.forget(pid)
    if st.exit_code != 0:
        raise AssertionError(f"{leg.target.name}: true exited {st.exit_code}")
    return dt


async def bench_all(targets: list[ServerTarget], n: int) -> list[_Leg]:
    """Start every server, then alternate rounds (one sample per server per round).

    Alternating keeps a noisy machine's load swings out of the ratios.
    """
    async with contextlib.AsyncExitStack() as stack:
        outside = temp_dir(stack, "bench_sandbox_outside_", parent="/var/tmp")
        legs: list[_Leg] = []
        for t in targets:
            srv, workspace = await start_in_temp_dir(
                stack, t, "bench_sandbox_ws_", parent="/var/tmp"
            )
            client = await connect_client(stack, srv.url)
            leg = _Leg(t, client, workspace)
            await _check_denied(leg, outside)
            # warm probes and caches (and let the helper zygote, started by
            # the first sandboxed launch, come up: launches before it is ready run the
            # launcher script)
            for _ in range(8):
                await _one(leg, sandboxed=True)
            legs.append(leg)
        for _ in range(n):
            for leg in legs:
                leg.samples.append(await _one(leg, sandboxed=True))
                leg.plain.append(await _one(leg, sandboxed=False))
        return legs


def wrap_cost(n: int) -> dict[str, Summary]:
    """``backend.wrap()`` alone (argv build, seccomp memfd), per backend, in µs."""
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="few iterations (smoke run)")
    ap.add_argument("--no-upstream", action="store_true", help="skip the upstream server")
    ap.add_argument("-n", type=int, default=40, help="samples per server (default 40)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    ap.add_argument("--no-launcher-leg", dest="launcher_leg", action="store_false",
                    help="skip the Landlock leg without the helper zygote (launcher script)")
    ap.add_argument("--alt", action="append", default=[], metavar="DIR",
                    help="another build of this server, run with PYTHONPATH=DIR (legs "
                    "alt1-bwrap, ...); repeatable")
    args = ap.parse_args()
    n = 3 if args.quick else args.n
    targets: list[ServerTarget] = []
    for name, flags in (("bwrap", ("--sandbox-backend", "bwrap")),
                        ("landlock", ("--sandbox-backend", "landlock")),
                        ("landlock-launcher", ("--sandbox-backend", "landlock",
                                               "--no-launch-zygote"))):
        if name == "landlock-launcher" and not args.launcher_leg:
            continue
        t = ours_target(*flags)
        targets.append(ServerTarget(f"ours-{name}", t.argv, t.env))
        targets += [ServerTarget(f"{alt.name}-{name}", alt.argv, alt.env)
                    for alt in alt_targets(args.alt, *flags)]
    up = None if args.no_upstream else upstream_target()
    if up is not None:
        targets.append(up)
    report = Report("sandbox", [t.name for t in targets])
    report.metric(METRIC, "ms", target=TARGET_RATIO)
    report.metric(PLAIN_METRIC, "ms")
    figures: dict[str, object] = {}
    samples: dict[str, list[float]] = {}
    for leg in asyncio.run(bench_all(targets, n)):
        samples[leg.target.name] = leg.samples
        summary, plain = summarize(leg.samples), summarize(leg.plain)
        name = leg.target.name
        report.add(name, METRIC, summary)
        report.add(name, PLAIN_METRIC, plain)
        report.notes.append(f"{name}: sandboxType={leg.kind} median={summary.median:.2f} ms "
                            f"p90={summary.p90:.2f} ms n={summary.n}; unsandboxed "
                            f"{plain.median:.2f} ms")
        figures[name] = {"median_ms": summary.median, "p90_ms": summary.p90,
                         "n": summary.n, "sandboxType": leg.kind,
                         "unsandboxed_median_ms": plain.median}
    for name, s in wrap_cost(200 if not args.quick else 5).items():
        report.notes.append(f"wrap() alone [{name}]: median {s.median:.1f} us, p90 {s.p90:.1f} us")
        figures[f"wrap-{name}"] = {"median_us": s.median, "p90_us": s.p90}
    upstream_med = figures.get(UPSTREAM)
    if isinstance(upstream_med, dict):
        for t in targets:
            f = figures[t.name]
            if t.name != UPSTREAM and isinstance(f, dict):
                ratio = f["median_ms"] / upstream_med["median_ms"]
                interval = ratio_interval(samples[t.name], samples[UPSTREAM])
                ok = "ok" if target_met(ratio, interval, TARGET_RATIO, False) else "MISS"
                shown = "" if interval is None else f" (95% {interval[0]:.2f}-{interval[1]:.2f})"
                report.notes.append(f"{t.name}/upstream = {ratio:.2f}x{shown} "
                                    f"(target <= {TARGET_RATIO}) {ok}")
                f["ratio"] = ratio
                f["ratio_95"] = None if interval is None else list(interval)
    for t in targets:
        if t.name.startswith("alt"):
            ours = "ours-" + t.name.split("-", 1)[1]
            ratio = statistics.median(samples[ours]) / statistics.median(samples[t.name])
            interval = ratio_interval(samples[ours], samples[t.name])
            shown = "" if interval is None else f" (95% {interval[0]:.2f}-{interval[1]:.2f})"
            report.notes.append(f"{ours}/{t.name} = {ratio:.2f}x{shown}")
    print(report.render(), flush=True)
    if args.json:
        write_json(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
