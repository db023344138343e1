"""Async client library: talk to an exec-server, or run the same API locally
(docs/client.md); the filesystem half is :mod:`exec_server.client.fs`."""

from exec_server.client.backend import ExecBackend, LocalExecBackend, RemoteExecBackend
from exec_server.client.connection import ExecServerClient
from exec_server.client.environment import (
    Environment,
    EnvironmentManager,
    RuntimePaths,
    normalize_exec_server_url,
)
from exec_server.client.errors import (
    ClientClosedError,
    ClientError,
    ConnectionLostError,
    HandshakeError,
    NotSupportedError,
    ProcessError,
    ProcessTimeoutError,
    ServerProtocolError,
)
from exec_server.client.process import CompletedProcess, ProcessHandle, RemoteProcess, Signal

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
