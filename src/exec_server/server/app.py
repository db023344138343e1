"""The exec-server process: the method table, listening, serving, shutdown.

:class:`ExecServer` holds what every connection shares; :func:`run_server` serves
stdio or a WebSocket listener until SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

from exec_server.config import ServerConfig
from exec_server.protocol.messages import InitializeParams, InitializeResult
from exec_server.server.capabilities import advertised_capabilities
from exec_server.server.connection import ConnectionProcessor
from exec_server.server.handlers import env as env_handlers
from exec_server.server.handlers import fs as fs_handlers
from exec_server.server.handlers import fs_handles as fs_handle_handlers
from exec_server.server.handlers import http as http_handlers
from exec_server.server.handlers import process as process_handlers
from exec_server.server.listener import (
    Listener,
    check_stdio,
    prepare_listener,
    reload_authenticator,
)
from exec_server.server.router import RequestContext, Router
from exec_server.server.services import ServerServices
from exec_server.server.session import SessionRegistry
from exec_server.transport.base import MessageTransport
from exec_server.transport.listen import ListenAddress, parse_listen_url
from exec_server.transport.stdio import open_stdio

if TYPE_CHECKING:  # the listener's modules load with the listener: stdio does without
    from websockets.asyncio.server import Server as WsServer

    from exec_server.transport.websocket import WebSocketTransport

__all__ = ["ExecServer", "build_router", "handle_initialize", "run_server"]

logger = logging.getLogger("exec_server.server")


async def handle_initialize(ctx: RequestContext, params: InitializeParams) -> InitializeResult:
    """Create or resume a session and attach this connection (§4.1)."""
    info = await env_handlers.cached_environment_info(ctx)
    att = ctx.attachment
    att.handshake.begin_initialize()
    try:
        if params.resume_session_id is None:
            session = ctx.registry.create(att)
        else:
            session = await ctx.registry.resume(params.resume_session_id, att)
    except BaseException:
        att.handshake.initialize_failed()
        raise
    att.handshake.initialize_succeeded()
    logger.info(
        "%s: client %r attached to session %s", att.label, params.client_name, session.session_id
    )
    return InitializeResult(session.session_id, info)


def build_router() -> Router:
    router = Router()
    router.add("initialize", InitializeParams, handle_initialize, None)
    for module in (env_handlers, process_handlers, fs_handlers, http_handlers, fs_handle_handlers):
        module.register(router)
    return router


class ExecServer:
    """Shared state of one server process: config, services, sessions, router."""

    def __init__(self, config: ServerConfig, services: ServerServices | None = None) -> None:
        self.config = config
        self.services = services if services is not None else ServerServices.create(config)
        self.registry = SessionRegistry(config)
        self.router = build_router()
        self.services.capabilities = advertised_capabilities(self.router.methods)
        env_handlers.provider_id()  # reads our source files: now, not on a request
        self._processors: weakref.WeakSet[ConnectionProcessor] = weakref.WeakSet()

    def processor(self, transport: MessageTransport) -> ConnectionProcessor:
        processor = ConnectionProcessor(
            transport, router=self.router, services=self.services, registry=self.registry
        )
        self._processors.add(processor)
        return processor

    def close_connections(self) -> None:
        """End every connection: requests in progress are cancelled, sessions detach.
        (Closing the sockets is not enough: a busy connection notices EOF late.)"""
        for processor in list(self._processors):
            processor.close("server shutting down")

    async def handle_websocket(self, conn: WebSocketTransport) -> None:
        """One processor per upgraded socket. A connection opened with a signed token
        is closed (1008) when the token expires (upstream keeps it open)."""
        processor = self.processor(conn)
        expiry: asyncio.TimerHandle | None = None
        expires_at = conn.grant.expires_at
        if expires_at is not None:
            loop = asyncio.get_running_loop()
            expiry = loop.call_later(max(0.0, expires_at - time.time()), _expire, processor)
        try:
            await processor.run()
        finally:
            if expiry is not None:
                expiry.cancel()

    async def listen_websocket(
        self, address: ListenAddress, listener: Listener | None = None
    ) -> WsServer:
        """Bind and start accepting; the caller closes the returned server."""
        from exec_server.transport.websocket import serve_websocket

        if listener is None:
            listener = prepare_listener(self.config, address)
        return await serve_websocket(
            self.handle_websocket,
            address.host,
            address.port,
            max_message_size=self.config.max_message_size,
            gate=listener.gate,
            ssl=listener.ssl_context,
        )

    async def aclose(self) -> None:
        self.close_connections()
        await self.registry.aclose()
        await self.services.aclose()


def _expire(processor: ConnectionProcessor) -> None:
    logger.info("%s: websocket jwt expired, closing", processor.transport.label)
    processor.refuse("websocket jwt expired")


async def run_server(
    config: ServerConfig, *, announce: Callable[[str], None] | None = None
) -> None:
    """Run until SIGTERM/SIGINT (or stdin EOF with ``--listen stdio``); SIGHUP re-reads
    the auth token or secret file. ``announce`` receives the bound ``ws://IP:PORT``.
    Bad flags raise before anything is bound."""
    target = parse_listen_url(config.listen)
    listener: Listener | None = None
    if isinstance(target, ListenAddress):
        listener = prepare_listener(config, target)
    else:
        check_stdio(config)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = ExecServer(config)
    server.services.start_warming()
    try:
        if not isinstance(target, ListenAddress) or listener is None:
            transport = await open_stdio("exec-server stdio", config.max_message_size)
            conn = asyncio.create_task(server.processor(transport).run())
            stopper = asyncio.create_task(stop.wait())
            await asyncio.wait({conn, stopper}, return_when=asyncio.FIRST_COMPLETED)
            for task in (conn, stopper):
                task.cancel()
            await asyncio.gather(conn, stopper, return_exceptions=True)
        else:
            ws_server = await server.listen_websocket(target, listener)
            sock = next(iter(ws_server.sockets))
            host, port = sock.getsockname()[:2]
            loop.add_signal_handler(signal.SIGHUP, reload_authenticator, listener)
            if announce is not None:
                scheme = "wss" if listener.ssl_context is not None else "ws"
                address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
                announce(f"{scheme}://{address}")
            try:
                await stop.wait()
            finally:
                loop.remove_signal_handler(signal.SIGHUP)
                ws_server.close()
                server.close_connections()
                await ws_server.wait_closed()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await server.aclose()
