"""A blocking client for code that is not async (most agent harnesses).

The same :class:`~exec_server.client.ExecServerClient` underneath, driven by
an event loop in a background thread that this object owns: every method
submits a coroutine to that loop and waits for its result. Safe to call from
any thread; close it (``close()`` or ``with``) to stop the thread.

    from exec_server.sync import ExecServerClient

    with ExecServerClient.connect("ws://127.0.0.1:8765") as client:
        result = client.run(["git", "status"], cwd="/repo", timeout=60)
        print(result.exit_code, result.stdout.decode())
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Coroutine, Iterator, Sequence
from typing import Any, TypeVar, Unpack, final

from exec_server.client import ExecServerClient as AsyncClient
from exec_server.client.fs import DirEntry, FsSandbox, Metadata, PathArg, RemoteFileSystem
from exec_server.client.process import CompletedProcess, ProcessHandle
from exec_server.client.run import RunOptions
from exec_server.process.spec import ExitStatus
from exec_server.protocol.process_types import OutputChunk, WriteStatus

__all__ = ["ExecServerClient", "FileSystem", "Process"]

T = TypeVar("T")


@final
class _LoopThread:
    """An event loop running in a daemon thread until :meth:`stop`."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name="exec-server-client",
                                        daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait; on ``timeout`` it is cancelled and
        the builtin ``TimeoutError`` raised."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("blocking call from the client's own loop thread")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            if future.done():  # the coroutine's own TimeoutError (the same class since 3.11)
                raise
            future.cancel()
            raise TimeoutError(f"no result within {timeout} s") from None

    def stop(self) -> None:
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
            self.loop.close()


@final
class Process:
    """A process started by the blocking client (wraps a :class:`ProcessHandle`)."""

    def __init__(self, handle: ProcessHandle, runner: _LoopThread) -> None:
        self._handle = handle
        self._runner = runner

    def __repr__(self) -> str:
        return repr(self._handle).replace("ProcessHandle", "Process", 1)

    @property
    def process_id(self) -> str:
        return self._handle.process_id

    @property
    def argv(self) -> tuple[str, ...]:
        return self._handle.argv

    @property
    def exit_code(self) -> int | None:
        return self._handle.exit_code

    @property
    def closed(self) -> bool:
        return self._handle.closed

    def read_chunk(self, timeout: float | None = None) -> OutputChunk | None:
        """The next output chunk, or None once the process is closed."""
        return self._runner.call(self._handle.read_chunk(), timeout)

    def __iter__(self) -> Iterator[OutputChunk]:
        while (chunk := self.read_chunk()) is not None:
            yield chunk

    def write(self, data: bytes) -> WriteStatus:
        return self._runner.call(self._handle.write(data))

    def close_stdin(self) -> None:
        self._runner.call(self._handle.close_stdin())

    def resize(self, rows: int, cols: int) -> None:
        self._runner.call(self._handle.resize(rows, cols))

    def terminate(self) -> bool:
        return self._runner.call(self._handle.terminate())

    def signal(self) -> None:
        """Interrupt (SIGINT to the group)."""
        self._runner.call(self._handle.signal())

    def wait(self, timeout: float | None = None) -> ExitStatus:
        """Wait until closed; ``TimeoutError`` after ``timeout`` (the process keeps running)."""
        return self._runner.call(self._handle.wait(), timeout)

    def collect(self, timeout: float | None = None) -> CompletedProcess:
        return self._runner.call(self._handle.collect(), timeout)


@final
class FileSystem:
    """``fs/*`` calls, blocking (see :class:`~exec_server.client.fs.RemoteFileSystem`)."""

    def __init__(self, fs: RemoteFileSystem, runner: _LoopThread) -> None:
        self._fs = fs
        self._runner = runner

    def read_file(self, path: PathArg, sandbox: FsSandbox = None) -> bytes:
        return self._runner.call(self._fs.read_file(path, sandbox))

    def write_file(self, path: PathArg, data: bytes, sandbox: FsSandbox = None) -> None:
        self._runner.call(self._fs.write_file(path, data, sandbox))

    def create_directory(self, path: PathArg, *, recursive: bool = True,
                         sandbox: FsSandbox = None) -> None:
        self._runner.call(self._fs.create_directory(path, recursive=recursive, sandbox=sandbox))

    def get_metadata(self, path: PathArg, sandbox: FsSandbox = None) -> Metadata:
        return self._runner.call(self._fs.get_metadata(path, sandbox))

    def read_directory(self, path: PathArg, sandbox: FsSandbox = None) -> list[DirEntry]:
        return self._runner.call(self._fs.read_directory(path, sandbox))

    def remove(self, path: PathArg, *, recursive: bool = True, force: bool = True,
               sandbox: FsSandbox = None) -> None:
        self._runner.call(self._fs.remove(path, recursive=recursive, force=force,
                                          sandbox=sandbox))

    def copy(self, source: PathArg, destination: PathArg, *, recursive: bool,
             sandbox: FsSandbox = None) -> None:
        self._runner.call(self._fs.copy(source, destination, recursive=recursive,
                                        sandbox=sandbox))

    def canonicalize(self, path: PathArg, sandbox: FsSandbox = None) -> str:
        return self._runner.call(self._fs.canonicalize(path, sandbox))


@final
class ExecServerClient:
    """A blocking connection to one exec-server. Create with :meth:`connect` or
    :meth:`spawn_stdio`; close with :meth:`close` or ``with``."""

    def __init__(self, client: AsyncClient, runner: _LoopThread) -> None:
        self._client = client
        self._runner = runner
        self.fs = FileSystem(RemoteFileSystem(client), runner)

    @classmethod
    def connect(cls, url: str, **options: Any) -> ExecServerClient:
        """Connect to ``ws://HOST:PORT``; ``options`` as for the async ``connect``."""
        return cls._open(AsyncClient.connect(url, **options))

    @classmethod
    def spawn_stdio(cls, argv: Sequence[str] | None = None, **options: Any) -> ExecServerClient:
        """Start a ``serve --listen stdio`` child and connect to it."""
        return cls._open(AsyncClient.spawn_stdio(argv, **options))

    @classmethod
    def _open(cls, opening: Awaitable[AsyncClient]) -> ExecServerClient:
        runner = _LoopThread()
        try:
            client = runner.call(_awaited(opening))
        except BaseException:
            runner.stop()
            raise
        return cls(client, runner)

    def __repr__(self) -> str:
        return repr(self._client).replace("<ExecServerClient", "<sync.ExecServerClient", 1)

    @property
    def session_id(self) -> str:
        return self._client.session_id

    @property
    def url(self) -> str | None:
        return self._client.url

    def run(self, cmd: str | Sequence[str], **options: Unpack[RunOptions]) -> CompletedProcess:
        """Run a command to completion; see the async :meth:`ExecServerClient.run`."""
        return self._runner.call(self._client.run(cmd, **options))

    def spawn(self, argv: Sequence[str], **options: Any) -> Process:
        """Start a process; ``options`` as for the async ``spawn``."""
        return Process(self._runner.call(self._client.spawn(argv, **options)), self._runner)

    def list_processes(self) -> list[Process]:
        """Processes this client started that are not closed yet."""
        return [Process(h, self._runner) for h in self._client.list_processes()]

    def close(self) -> None:
        """Close the connection and stop the loop thread."""
        if self._runner.loop.is_closed():
            return
        try:
            self._runner.call(self._client.aclose())
        finally:
            self._runner.stop()

    def __enter__(self) -> ExecServerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable
