"""gRPC (grpc.aio) integration: guarded servers, context-propagating clients, Snappy messages.

Server::

    server = grpc.aio.server(interceptors=[GuardServerInterceptor(), SnappyServerInterceptor()])

Client::

    channel = grpc.aio.insecure_channel(target, interceptors=client_interceptors())
    channel = snappy_channel(channel)          # optional: ask for Snappy responses
"""

from ._client import client_interceptors
from ._compression import (
    ACCEPT_ENCODING_KEY,
    ENCODING_KEY,
    SnappyServerInterceptor,
    SnappyWire,
    snappy_channel,
)
from ._errors import (
    RemoteCallError,
    RemoteDeadlineExceeded,
    RemoteQuotaExceeded,
    RemoteUnavailable,
    remote_error,
)
from ._server import EXEMPT_SERVICES, TENANT_KEY, GuardServerInterceptor, client_budget
from ._status import PUSHBACK_KEY, RETRY_AFTER_KEY, STREAM_BUDGET_KEY, STREAM_ITEMS_KEY, status_for

__all__ = [
    "ACCEPT_ENCODING_KEY",
    "ENCODING_KEY",
    "EXEMPT_SERVICES",
    "PUSHBACK_KEY",
    "RETRY_AFTER_KEY",
    "STREAM_BUDGET_KEY",
    "STREAM_ITEMS_KEY",
    "TENANT_KEY",
    "GuardServerInterceptor",
    "RemoteCallError",
    "RemoteDeadlineExceeded",
    "RemoteQuotaExceeded",
    "RemoteUnavailable",
    "SnappyServerInterceptor",
    "SnappyWire",
    "client_budget",
    "client_interceptors",
    "remote_error",
    "snappy_channel",
    "status_for",
]
