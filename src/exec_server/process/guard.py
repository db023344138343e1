"""Kill the server's process groups however the server dies: a tiny helper holds a pipe
from us and a memfd of live group ids (``pwrite``: no wake-up per spawn) and at EOF
SIGKILLs every listed group (PDEATHSIG needs a ``fork`` per child, kills only leaders)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
import subprocess
import sys
from typing import Final

from exec_server.process.spawn import close_quietly, exit_status_from_wait, reap

__all__ = ["IDLE_LINGER", "ProcessGuard"]

#: Seconds without a registered group before the helper is closed.
IDLE_LINGER: Final = 1.0

_CODE = """
import os, signal, struct
while os.read(0, 4096):
    pass
for (group,) in struct.iter_unpack("q", os.pread(MEMFD, os.fstat(MEMFD).st_size, 0)):
    if group > 0:
        try:
            os.killpg(group, signal.SIGKILL)
        except OSError:
            pass
"""

_SLOT = struct.Struct("q")
_EMPTY_SLOT = _SLOT.pack(0)


class ProcessGuard:
    """Started on the first ``add``; closed (the helper exits) after :data:`IDLE_LINGER`
    seconds without a group, so an idle server keeps no extra child or fd."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._memfd: int | None = None
        self._popen: subprocess.Popen[bytes] | None = None
        self._failed = False
        self._slots: dict[int, int] = {}
        self._free: list[int] = []
        self._timer: asyncio.TimerHandle | None = None
        self._reapers: set[asyncio.Task[None]] = set()

    def _start(self) -> None:
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        memfd = -1
        try:
            memfd = os.memfd_create("exec-server-guard", os.MFD_CLOEXEC)
            self._popen = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _CODE.replace("MEMFD", str(memfd))],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd="/",
                close_fds=True,
                pass_fds=(memfd,),  # keeps the fd number in the helper
                start_new_session=True,
            )
        except OSError:
            close_quietly(write_end)
            close_quietly(memfd)
            self._failed = True
            return
        finally:
            close_quietly(read_end)
        self._fd = write_end
        self._memfd = memfd

    def add(self, pgid: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._memfd is None and not self._failed:
            self._start()
        if self._memfd is None:
            return
        # Slots 0..n-1 are all taken when none is free.
        slot = self._free.pop() if self._free else len(self._slots)
        self._slots[pgid] = slot
        with contextlib.suppress(OSError):
            os.pwrite(self._memfd, _SLOT.pack(pgid), slot * _SLOT.size)

    def discard(self, pgid: int) -> None:
        slot = self._slots.pop(pgid, None)
        if slot is None or self._memfd is None:
            return
        self._free.append(slot)
        with contextlib.suppress(OSError):
            os.pwrite(self._memfd, _EMPTY_SLOT, slot * _SLOT.size)
        if not self._slots:
            self._timer = asyncio.get_running_loop().call_later(IDLE_LINGER, self._close)

    def _close(self) -> None:
        """Close our ends: the helper kills what is still listed, exits and is reaped."""
        self._timer = None
        close_quietly(self._fd)
        close_quietly(self._memfd)
        self._fd = self._memfd = None
        self._slots.clear()
        self._free.clear()
        popen, self._popen = self._popen, None
        if popen is not None:
            task = asyncio.get_running_loop().create_task(self._reap(popen))
            self._reapers.add(task)
            task.add_done_callback(self._reapers.discard)

    @staticmethod
    async def _reap(popen: subprocess.Popen[bytes]) -> None:
        popen.returncode = exit_status_from_wait(await reap(popen.pid)).code

    async def aclose(self) -> None:
        """Close now and wait until the helper is reaped."""
        if self._timer is not None:
            self._timer.cancel()
        self._close()
        if self._reapers:
            await asyncio.wait(list(self._reapers))
