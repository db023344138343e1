"""ProcessManager in-process: pipes and PTYs, seq order, statuses, terminate, retention, leaks."""

from __future__ import annotations

import hashlib
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from exec_server.process.errors import ProcessFailedError, ProcessRefusedError
from exec_server.process.manager import ProcessManager, looks_sandbox_denied
from exec_server.process.spawn import exit_status_from_wait
from exec_server.process.spec import LaunchSpec
from exec_server.protocol.types.process import ProcessStream, WriteStatus
from exec_server.sandbox.plan import SandboxType
from exec_server.server.notifications import notifier

PATH_ENV = {"PATH": "/usr/bin:/bin"}


def sh(script: str, **kwargs: object) -> LaunchSpec:
    return LaunchSpec(argv=["/bin/sh", "-c", script], cwd="/", env=dict(PATH_ENV), **kwargs)  # type: ignore[arg-type]


async def test_pipe_output_exit_code_and_event_order(
    no_leaks: None, manager: ProcessManager, sink: Any
) -> None:
    await manager.start("p", sh("printf out; printf err >&2; exit 3"))
    rec = await sink.closed("p")
    assert rec.data("stdout") == b"out"
    assert rec.data("stderr") == b"err"
    assert rec.exited is not None and rec.exited.exit_code == 3
    # one counter; closed carries the highest seq and comes last
    all_seqs = [seq for _, seq in rec.order]
    assert sorted(all_seqs) == list(range(1, len(all_seqs) + 1))
    assert rec.order[-1][0] == "process/closed"
    assert rec.order[-1][1] == max(all_seqs)
    result = await manager.read("p")
    assert result.exited and result.closed and result.exit_code == 3
    assert b"".join(c.chunk for c in result.chunks if c.stream is ProcessStream.STDOUT) == b"out"
    assert result.next_seq == max(c.seq for c in result.chunks) + 1
    after = await manager.read("p", after_seq=result.next_seq - 1)
    assert after.chunks == [] and after.next_seq == rec.closed.seq + 1  # type: ignore[union-attr]


async def test_true_with_empty_env_uses_default_path(
    no_leaks: None, manager: ProcessManager, sink: Any
) -> None:
    await manager.start("t", LaunchSpec(argv=["true"], cwd="/", env={}))
    rec = await sink.closed("t")
    assert rec.exited is not None and rec.exited.exit_code == 0
    assert rec.exited.sandbox_denied is not False  # legacy shape: member unset


async def test_env_is_exact_and_cwd_applies(
    no_leaks: None, manager: ProcessManager, sink: Any, tmp_path: Path
) -> None:
    spec = LaunchSpec(argv=["/usr/bin/env"], cwd=str(tmp_path), env={"ONLY": "1"})
    await manager.start("e", spec)
    assert (await sink.closed("e")).data() == b"ONLY=1\n"
    await manager.start("c", LaunchSpec(argv=["/bin/pwd"], cwd=str(tmp_path), env={}))
    assert (await sink.closed("c")).data() == f"{tmp_path}\n".encode()


async def test_arg0_is_the_visible_argv0(
    no_leaks: None, manager: ProcessManager, sink: Any
) -> None:
    await manager.start(
        "a",
        LaunchSpec(argv=["cat", "/proc/self/cmdline"], cwd="/", env=PATH_ENV, arg0="custom-name"),
    )
    assert (await sink.closed("a")).data() == b"custom-name\0/proc/self/cmdline\0"


async def test_spawn_failures_report_os_error(no_leaks: None, manager: ProcessManager) -> None:
    with pytest.raises(ProcessFailedError, match=r"^No such file or directory \(os error 2\)$"):
        await manager.start("m", LaunchSpec(argv=["/no/such/program"], cwd="/", env={}))
    with pytest.raises(ProcessFailedError, match=r"No such file or directory \(os error 2\)"):
        await manager.start("m", LaunchSpec(argv=["true"], cwd="/no/such/dir", env={}))
    assert "m" not in manager._records  # placeholder removed; the id is free again
    with pytest.raises(ProcessFailedError, match=r"No such file or directory \(os error 2\)"):
        await manager.start("m", LaunchSpec(argv=["no-such-program-xyz"], cwd="/", env=PATH_ENV))


async def test_pty_spawn_failures_and_non_executables(
    no_leaks: None, manager: ProcessManager, tmp_path: Path
) -> None:
    with pytest.raises(ProcessFailedError, match=r"^No such file or directory \(os error 2\)$"):
        await manager.start("m", LaunchSpec(argv=["/no/such/program"], cwd="/", env={}, tty=True))
    script = tmp_path / "not-executable.sh"
    script.write_text("echo hi\n")
    with pytest.raises(ProcessFailedError, match=r"^Permission denied \(os error 13\)$"):
        await manager.start("m", LaunchSpec(argv=[str(script)], cwd="/", env={}))
    assert not manager._records


async def test_duplicate_process_id_rejected(
    no_leaks: None, manager: ProcessManager, sink: Any
) -> None:
    cleaned: list[bool] = []
    await manager.start("d", sh("exit 0"))
    spec = sh("exit 0")
    spec.cleanup = lambda: cleaned.append(True)
    with pytest.raises(ProcessRefusedError, match=r"^process d already exists$"):
        await manager.start("d", spec)
    assert cleaned == [True]
    await sink.closed("d")
    with pytest.raises(ProcessRefusedError, match=r"^process d already exists$"):
        await manager.start("d", sh("exit 0"))  # retained after close


async def test_cleanup_runs_after_reap_and_pass_fds_are_closed(
    no_leaks: None, manager: ProcessManager, sink: Any
) -> None:
    r, w = os.pipe()
    cleaned: list[bool] = []
    spec = LaunchSpec(
        argv=["/bin/sh", "-c", "echo via-fd >/dev/fd/$0", str(w)],
        cwd="/",
        env=PATH_ENV,
        pass_fds=(w,),
        cleanup=lambda: cleaned.append(True),
    )
    await manager.start("f", spec)
    with pytest.raises(OSError):
        os.fstat(w)  # closed in the parent after the spawn
    await sink.closed("f")
    assert cleaned == [True]
    try:
        assert os.read(r, 100) == b"via-fd\n"
    finally:
        os.close(r)


async def test_unknown_process_read_write_terminate(manager: ProcessManager) -> None:
    with pytest.raises(ProcessRefusedError, match=r"^unknown process id nope$"):
        await manager.read("nope")
    assert await manager.write("nope", b"x") is WriteStatus.UNKNOWN_PROCESS
    assert manager.terminate("nope") is False
    manager.signal("nope")  # no-op


async def test_pipe_stdin_closed_unless_requested(
    no_leaks: None, manager: ProcessManager, sink: Any
) -> None:
    await manager.start("n", sh("cat; echo eof"))
    assert await manager.write("n", b"ignored\n") is WriteStatus.STDIN_CLOSED
    assert (await sink.closed("n")).data() == b"eof\n"  # stdin is /dev/null

    await manager.start(
        "s",
        LaunchSpec(
            argv=["/bin/sh", "-c", "IFS= read -r line; echo got:$line"],
            cwd="/",
            env=PATH_ENV,
            pipe_stdin=True,
        ),
        report_denial=True,
    )
    assert await manager.write("s", b"hello\n", "1") is WriteStatus.ACCEPTED
    assert await manager.write("s", b"hello\n", "1") is WriteStatus.ACCEPTED  # not re-written
    rec = await sink.closed("s")
    assert rec.data() == b"got:hello\n"
    assert rec.exited is not None and rec.exited.sandbox_denied is False  # current shape
    # after exit, while retained: accepted (and dropped)
    assert await manager.write("s", b"late\n", "2") is WriteStatus.ACCEPTED


async def test_pty_echo_controlling_tty_and_size(
    no_leaks: None, manager: ProcessManager, sink: Any
) -> None:
    script = (
        'stty size; [ "$(ps -o tty= -p $$)" != "?" ] && echo has-ctty; '
        'IFS= read -r line; printf "from-stdin:%s\\n" "$line"'
    )
    await manager.start("t", sh(script, tty=True))
    await sink.output_contains("t", b"has-ctty")
    assert await manager.write("t", b"hello\n") is WriteStatus.ACCEPTED
    rec = await sink.closed("t")
    text = rec.data().replace(b"\r\n", b"\n")
    assert b"24 80\n" in text
    assert b"hello\n" in text  # the terminal echoes input
    assert b"from-stdin:hello\n" in text
    assert {n.stream for n in rec.output} == {ProcessStream.PTY}
    assert rec.exited is not None and rec.exited.exit_code == 0


async def test_terminate_sends_sigterm_to_the_group(
    no_leaks: None, manager: ProcessManager, sink: Any
) -> None:
    await manager.start("k", sh("sleep 30 & echo started; wait"))
    await sink.output_contains("k", b"started")
    assert manager.terminate("k") is True
    rec = await sink.closed("k")
    assert rec.exited is not None and rec.exited.exit_code == 128 + signal.SIGTERM
    assert manager.terminate("k") is False  # already exited


async def test_terminate_escalates_to_sigkill(
    no_leaks: None, make_manager: Callable[..., ProcessManager], sink: Any
) -> None:
    manager = make_manager(terminate_grace=0.2)
    await manager.start("k", sh("trap '' TERM; echo ready; sleep 30"))
    await sink.output_contains("k", b"ready")
    assert manager.terminate("k") is True
    rec = await sink.closed("k")
    assert rec.exited is not None and rec.exited.exit_code == 128 + signal.SIGKILL


async def test_signal_deaths_report_128_plus_signal(
    no_leaks: None, manager: ProcessManager, sink: Any
) -> None:
    await manager.start("9", sh("kill -KILL $$"))
    await manager.start("15", sh("kill -TERM $$"))
    assert (await sink.closed("9")).exited.exit_code == 137  # type: ignore[union-attr]
    assert (await sink.closed("15")).exited.exit_code == 143  # type: ignore[union-attr]


async def test_process_signal_interrupts_the_group(
    no_leaks: None, manager: ProcessManager, sink: Any
) -> None:
    await manager.start(
        "i", sh("trap 'echo got-int; exit 7' INT; echo ready; while :; do sleep 0.05; done")
    )
    await sink.output_contains("i", b"ready")
    manager.signal("i")
    rec = await sink.closed("i")
    assert b"got-int" in rec.data()
    assert rec.exited is not None and rec.exited.exit_code == 7


async def test_output_after_exit_keeps_close_last(
    no_leaks: None, manager: ProcessManager, sink: Any
) -> None:
    # a background writer keeps stdout open after the leader exits
    await manager.start("b", sh("(sleep 0.2; echo late) & exit 0"))
    rec = await sink.closed("b")
    assert rec.data() == b"late\n"
    assert rec.exited is not None and rec.closed is not None
    out_seq = rec.output[0].seq
    assert rec.exited.seq < out_seq < rec.closed.seq


async def test_long_poll_read_wakes_on_output(no_leaks: None, manager: ProcessManager) -> None:
    await manager.start("w", sh("sleep 0.1; echo hi"))
    result = await manager.read("w", after_seq=0, wait_ms=10_000)
    assert [c.chunk for c in result.chunks] == [b"hi\n"]
    # a read at the cursor with no wait returns at once
    quick = await manager.read("w", after_seq=result.next_seq - 1, wait_ms=0)
    assert quick.chunks == [] or quick.closed or quick.exited
    while not result.closed:
        result = await manager.read("w", after_seq=result.next_seq - 1, wait_ms=10_000)
    assert result.exit_code == 0


async def test_closed_process_removed_after_retention(
    no_leaks: None, make_manager: Callable[..., ProcessManager], sink: Any, wait_until: Any
) -> None:
    manager = make_manager(closed_retention=0.05)
    await manager.start("r", sh("echo first; sleep 0.05; echo second"))
    manager.set_sink(None)  # notifications dropped; events still retained
    result = await manager.read("r", wait_ms=10_000)
    data = b""
    while True:
        data += b"".join(c.chunk for c in result.chunks)
        if result.closed:
            break
        cursor = result.chunks[-1].seq if result.chunks else result.next_seq - 1
        result = await manager.read("r", after_seq=cursor, wait_ms=10_000)
    assert data == b"first\nsecond\n" and result.exit_code == 0
    await wait_until(lambda: "r" not in manager._records)
    assert await manager.write("r", b"x") is WriteStatus.UNKNOWN_PROCESS
    assert manager.terminate("r") is False
    manager.set_sink(notifier(sink))
    await manager.start("r", sh("exit 0"))  # the id can be reused
    await sink.closed("r")


async def test_lossy_retention_drops_oldest(
    no_leaks: None, make_manager: Callable[..., ProcessManager]
) -> None:
    manager = make_manager(attach=False, output_cap=64 * 1024, read_size=8192)
    await manager.start(
        "big", LaunchSpec(argv=["head", "-c", str(1 << 20), "/dev/zero"], cwd="/", env=PATH_ENV)
    )
    result = await manager.read("big", wait_ms=0)
    while not result.closed:
        result = await manager.read(
            "big", after_seq=result.next_seq - 1 if not result.chunks else 10**9, wait_ms=10_000
        )
    everything = await manager.read("big")
    kept = sum(len(c.chunk) for c in everything.chunks)
    assert 0 < kept <= 64 * 1024
    assert everything.chunks[0].seq > 1  # the oldest chunks were dropped


async def test_lossless_mode_pauses_instead_of_dropping(
    no_leaks: None, make_manager: Callable[..., ProcessManager], wait_until: Any
) -> None:
    cap = 64 * 1024
    total = 4 << 20  # more than the cap plus the 1 MiB pipe buffer
    manager = make_manager(attach=False, output_cap=cap, lossless_output=True, read_size=8192)
    await manager.start(
        "ll", LaunchSpec(argv=["head", "-c", str(total), "/dev/zero"], cwd="/", env=PATH_ENV)
    )
    record = manager._records["ll"]
    await wait_until(lambda: record.buffer.full)
    first = await manager.read("ll")
    assert not first.exited  # the child is blocked on its full pipe, not finished
    assert sum(len(c.chunk) for c in first.chunks) <= cap + 8192  # cap + one read
    received = 0
    seen: list[int] = []
    result = first
    while True:
        for chunk in result.chunks:
            seen.append(chunk.seq)
            received += len(chunk.chunk)
        if result.closed:
            break
        cursor = result.chunks[-1].seq if result.chunks else result.next_seq - 1
        result = await manager.read("ll", after_seq=cursor, wait_ms=10_000)
    assert received == total
    assert result.exit_code == 0
    # nothing dropped: the only seq missing among the chunks is the exit event's
    assert len(set(range(1, seen[-1] + 1)) - set(seen)) <= 1


async def test_notifications_flow_while_attached_in_lossless_mode(
    no_leaks: None, make_manager: Callable[..., ProcessManager], sink: Any
) -> None:
    manager = make_manager(output_cap=64 * 1024, lossless_output=True)
    await manager.start(
        "ln", LaunchSpec(argv=["head", "-c", str(2 << 20), "/dev/zero"], cwd="/", env=PATH_ENV)
    )
    rec = await sink.closed("ln")
    assert len(rec.data()) == 2 << 20


async def test_shutdown_kills_groups_and_reaps(no_leaks: None, sink: Any) -> None:
    from exec_server.config import ServerConfig

    manager = ProcessManager(ServerConfig())
    manager.set_sink(notifier(sink))
    await manager.start("s1", sh("sleep 30 & sleep 30"))
    await manager.start("s2", sh("sleep 30", tty=True))
    pids = [manager.pid_of("s1"), manager.pid_of("s2")]
    assert all(pids)
    await manager.shutdown()
    assert not manager._records
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}")  # noqa: ASYNC240


async def test_many_concurrent_short_processes(
    no_leaks: None, manager: ProcessManager, sink: Any
) -> None:
    for i in range(32):
        await manager.start(f"c{i}", sh(f"echo {i}"))
    for i in range(32):
        rec = await sink.closed(f"c{i}")
        assert rec.data() == f"{i}\n".encode()


def test_exit_status_decoding() -> None:
    assert exit_status_from_wait(0).code == 0
    assert exit_status_from_wait(3 << 8).code == 3
    status = exit_status_from_wait(signal.SIGKILL)
    assert status.code == 137 and status.signal == signal.SIGKILL


def test_sandbox_denial_heuristic() -> None:
    seccomp = SandboxType.LINUX_SECCOMP
    assert not looks_sandbox_denied(SandboxType.NONE, 1, b"Permission denied")
    assert not looks_sandbox_denied(seccomp, 0, b"Permission denied")
    assert looks_sandbox_denied(seccomp, 2, b"x: Read-only file system\n")
    assert looks_sandbox_denied(seccomp, 1, b"OPERATION NOT PERMITTED")
    assert not looks_sandbox_denied(seccomp, 3, b"plain failure")
    assert not looks_sandbox_denied(seccomp, 127, b"command not found")
    assert looks_sandbox_denied(seccomp, 128 + 31, b"")
    assert not looks_sandbox_denied(SandboxType.MACOS_SEATBELT, 128 + 31, b"")


async def test_guard_exits_when_idle_and_restarts(
    no_leaks: None, manager: ProcessManager, sink: Any, wait_until: Any
) -> None:
    await manager.start("g1", sh("exit 0"))
    guard = manager._guard._popen
    assert guard is not None
    guard_pid = guard.pid
    await sink.closed("g1")
    await wait_until(lambda: manager._guard._popen is None and not manager._guard._reapers)
    assert not os.path.exists(f"/proc/{guard_pid}")  # noqa: ASYNC240 - reaped
    await manager.start("g2", sh("exit 0"))
    assert manager._guard._popen is not None and manager._guard._popen.pid != guard_pid
    await sink.closed("g2")


async def test_large_stdin_write_is_delivered_in_order(
    no_leaks: None, manager: ProcessManager, sink: Any
) -> None:
    # More than a pipe buffer in one write: the rest is flushed when writable.
    await manager.start(
        "big-in",
        LaunchSpec(
            argv=["/bin/sh", "-c", "head -c 3000000 | md5sum"],
            cwd="/",
            env=PATH_ENV,
            pipe_stdin=True,
        ),
    )
    payload = bytes(range(256)) * (3_000_000 // 256) + b"x" * (3_000_000 % 256)
    half = len(payload) // 2
    assert await manager.write("big-in", payload[:half]) is WriteStatus.ACCEPTED
    assert await manager.write("big-in", payload[half:]) is WriteStatus.ACCEPTED
    rec = await sink.closed("big-in")
    assert rec.data().split()[0].decode() == hashlib.md5(payload).hexdigest()


def _tagged(tag: str) -> list[int]:
    """Live processes with ``tag`` as one of their arguments."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if tag.encode() in argv and state != b"Z":
            found.append(int(entry))
    return found


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])


@pytest.mark.parametrize("how", ["terminate", "shutdown"])
@pytest.mark.parametrize("tty", [False, True], ids=["pipes", "pty"])
async def test_unsandboxed_tree_dies_with_its_process(
    no_leaks: None, make_manager: Callable[..., ProcessManager], sink: Any,
    wait_until: Callable[..., Any], how: str, tty: bool,
) -> None:
    """Descendants that left the group (setsid) die too, on terminate and on shutdown
    (what session expiry runs); on a PTY launch (a subreaper) also an orphaned one."""
    tag = f"300.{os.getpid()}{os.urandom(3).hex().translate(str.maketrans('abcdef', '123456'))}"
    stray, orphan = tag + "1", tag + "2"
    tags = (stray, orphan) if tty else (stray,)
    manager = make_manager(terminate_grace=0.5)
    quiet = ">/dev/null 2>&1 </dev/null"
    double_fork = f"(setsid sleep {orphan} {quiet} &); " if tty else ""
    script = f"setsid sleep {stray} {quiet} & {double_fork}echo ready; sleep 300"
    await manager.start("t", sh(script, tty=tty))
    try:
        await sink.output_contains("t", b"ready")
        await wait_until(lambda: all(len(_tagged(t)) == 1 for t in tags))
        leader = manager.pid_of("t")
        assert os.getsid(_tagged(stray)[0]) != os.getsid(leader)
        if tty:  # the orphan was re-parented to the command (a subreaper), not to init
            assert _ppid(_tagged(orphan)[0]) == leader
        if how == "terminate":
            assert manager.terminate("t") is True
            rec = await sink.closed("t")
            assert rec.exited is not None and rec.exited.exit_code == 128 + signal.SIGTERM
        else:
            await manager.shutdown()
        await wait_until(lambda: not any(_tagged(t) for t in tags))
    finally:
        for pid in [p for t in tags for p in _tagged(t)]:
            os.kill(pid, signal.SIGKILL)
