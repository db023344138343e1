"""A blocking client for code that is not async (most agent harnesses): the async
:class:`~exec_server.client.ExecServerClient` on an event loop in a thread this object owns;
safe to call from any thread; ``close()`` (or ``with``) stops it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, final

from exec_server.client import ExecServerClient as AsyncClient
from exec_server.client.fs import RemoteFileSystem
from exec_server.client.process import CompletedProcess, ProcessHandle
from exec_server.process.spec import ExitStatus
from exec_server.protocol.types.process import OutputChunk

__all__ = ["ExecServerClient", "FileSystem", "Process"]

T = TypeVar("T")
P = ParamSpec("P")
W = TypeVar("W")


@final
class _LoopThread:
    """An event loop running in a daemon thread until :meth:`stop`."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="exec-server-client",
                                        daemon=True)
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait; on ``timeout`` cancel it, raise ``TimeoutError``."""
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


def _blocking(
    method: Callable[Concatenate[Any, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[_Facade[Any], P], T]:
    """The blocking twin of an async method of the wrapped object (same signature)."""
    name = method.__name__

    def call(self: _Facade[Any], /, *args: P.args, **kwargs: P.kwargs) -> T:
        coro: Coroutine[Any, Any, T] = getattr(self._target, name)(*args, **kwargs)
        return self._runner.call(coro)

    call.__name__ = name
    call.__doc__ = method.__doc__
    return call


class _Facade(Generic[W]):
    def __init__(self, target: W, runner: _LoopThread) -> None:
        self._target = target
        self._runner = runner


@final
class Process(_Facade[ProcessHandle]):
    """A process started by the blocking client (wraps a :class:`ProcessHandle`)."""

    def __repr__(self) -> str:
        return repr(self._target).replace("ProcessHandle", "Process", 1)

    @property
    def process_id(self) -> str:
        return self._target.process_id

    @property
    def argv(self) -> tuple[str, ...]:
        return self._target.argv

    @property
    def exit_code(self) -> int | None:
        return self._target.exit_code

    @property
    def closed(self) -> bool:
        return self._target.closed

    def read_chunk(self, timeout: float | None = None) -> OutputChunk | None:
        """The next output chunk, or None once the process is closed."""
        return self._runner.call(self._target.read_chunk(), timeout)

    def __iter__(self) -> Iterator[OutputChunk]:
        while (chunk := self.read_chunk()) is not None:
            yield chunk

    write = _blocking(ProcessHandle.write)
    close_stdin = _blocking(ProcessHandle.close_stdin)
    resize = _blocking(ProcessHandle.resize)
    terminate = _blocking(ProcessHandle.terminate)
    signal = _blocking(ProcessHandle.signal)

    def wait(self, timeout: float | None = None) -> ExitStatus:
        """Wait until closed; ``TimeoutError`` after ``timeout`` (the process keeps running)."""
        return self._runner.call(self._target.wait(), timeout)

    def collect(self, timeout: float | None = None) -> CompletedProcess:
        return self._runner.call(self._target.collect(), timeout)


@final
class FileSystem(_Facade[RemoteFileSystem]):
    """``fs/*`` calls, blocking (see :class:`~exec_server.client.fs.RemoteFileSystem`)."""

    read_file = _blocking(RemoteFileSystem.read_file)
    write_file = _blocking(RemoteFileSystem.write_file)
    create_directory = _blocking(RemoteFileSystem.create_directory)
    get_metadata = _blocking(RemoteFileSystem.get_metadata)
    read_directory = _blocking(RemoteFileSystem.read_directory)
    remove = _blocking(RemoteFileSystem.remove)
    copy = _blocking(RemoteFileSystem.copy)
    canonicalize = _blocking(RemoteFileSystem.canonicalize)
    walk = _blocking(RemoteFileSystem.walk)


@final
class ExecServerClient(_Facade[AsyncClient]):
    """A blocking connection to one exec-server. Create with :meth:`connect` or
    :meth:`spawn_stdio`; close with :meth:`close` or ``with``."""

    def __init__(self, client: AsyncClient, runner: _LoopThread) -> None:
        super().__init__(client, runner)
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
        return repr(self._target).replace("<ExecServerClient", "<sync.ExecServerClient", 1)

    @property
    def session_id(self) -> str:
        return self._target.session_id

    @property
    def url(self) -> str | None:
        return self._target.url

    run = _blocking(AsyncClient.run)

    def spawn(self, argv: Sequence[str], **options: Any) -> Process:
        """Start a process; ``options`` as for the async ``spawn``."""
        return Process(self._runner.call(self._target.spawn(argv, **options)), self._runner)

    def list_processes(self) -> list[Process]:
        """Processes this client started that are not closed yet."""
        return [Process(h, self._runner) for h in self._target.list_processes()]

    def close(self) -> None:
        """Close the connection and stop the loop thread."""
        if self._runner.loop.is_closed():
            return
        try:
            self._runner.call(self._target.aclose())
        finally:
            self._runner.stop()

    def __enter__(self) -> ExecServerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable
