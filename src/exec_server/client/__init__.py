"""Async client library: talk to an exec-server, or run the same API locally
(docs/client.md); the filesystem half is :mod:`exec_server.client.fs`."""

from exec_server.client.backend import ExecBackend as ExecBackend
from exec_server.client.backend import LocalExecBackend as LocalExecBackend
from exec_server.client.backend import RemoteExecBackend as RemoteExecBackend
from exec_server.client.connection import ExecServerClient as ExecServerClient
from exec_server.client.environment import Environment as Environment
from exec_server.client.environment import EnvironmentManager as EnvironmentManager
from exec_server.client.environment import RuntimePaths as RuntimePaths
from exec_server.client.environment import (
    normalize_exec_server_url as normalize_exec_server_url,
)
from exec_server.client.errors import ClientClosedError as ClientClosedError
from exec_server.client.errors import ClientError as ClientError
from exec_server.client.errors import ConnectionLostError as ConnectionLostError
from exec_server.client.errors import HandshakeError as HandshakeError
from exec_server.client.errors import NotSupportedError as NotSupportedError
from exec_server.client.errors import ProcessError as ProcessError
from exec_server.client.errors import ProcessTimeoutError as ProcessTimeoutError
from exec_server.client.errors import ServerProtocolError as ServerProtocolError
from exec_server.client.process import CompletedProcess as CompletedProcess
from exec_server.client.process import ProcessHandle as ProcessHandle
from exec_server.client.process import RemoteProcess as RemoteProcess
from exec_server.client.process import Signal as Signal

__all__ = [
    "ClientClosedError",
    "ClientError",
    "CompletedProcess",
    "ConnectionLostError",
    "Environment",
    "EnvironmentManager",
    "ExecBackend",
    "ExecServerClient",
    "HandshakeError",
    "LocalExecBackend",
    "NotSupportedError",
    "ProcessError",
    "ProcessHandle",
    "ProcessTimeoutError",
    "RemoteExecBackend",
    "RemoteProcess",
    "RuntimePaths",
    "ServerProtocolError",
    "Signal",
    "normalize_exec_server_url",
]
