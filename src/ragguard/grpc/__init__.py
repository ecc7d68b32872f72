"""gRPC (grpc.aio) integration: guarded servers, context-propagating clients, Snappy messages.

Server (the tenant from a resolver: :class:`APIKeyResolver`, a verified token, the client
certificate in ``auth_context()``, or the default :class:`HeaderResolver`, metadata
``x-tenant-id`` as sent, to trust only behind a proxy that sets it; see docs/grpc.md)::

    server = grpc.aio.server(interceptors=[
        GuardServerInterceptor(tenant_resolver=APIKeyResolver(keys)),
        SnappyServerInterceptor(),       # after the guard: refused calls are never decompressed
    ])

Client::

    channel = grpc.aio.insecure_channel(target, interceptors=client_interceptors())
    channel = snappy_channel(channel)          # optional: ask for Snappy responses
"""

from .._errors import PermissionDenied, Unauthenticated
from .._identity import APIKeyResolver, Caller, HeaderResolver, Identity, TenantResolver
from ._client import client_interceptors
from ._compression import SnappyServerInterceptor, SnappyWire, snappy_channel
from ._errors import RemoteDeadlineExceeded, RemoteQuotaExceeded, RemoteUnavailable
from ._server import EXEMPT_SERVICES, TENANT_KEY, GuardServerInterceptor
from ._status import (
    DEADLINE_BY_KEY,
    DEADLINE_S_KEY,
    RETRY_AFTER_KEY,
    STREAM_AFTER_KEY,
    STREAM_BUDGET_KEY,
    STREAM_BY_KEY,
    STREAM_ENDING_KEY,
    STREAM_ERROR_KEY,
    STREAM_ITEMS_KEY,
    ending_trailers,
)

__all__ = [
    "DEADLINE_BY_KEY",
    "DEADLINE_S_KEY",
    "EXEMPT_SERVICES",
    "RETRY_AFTER_KEY",
    "STREAM_AFTER_KEY",
    "STREAM_BUDGET_KEY",
    "STREAM_BY_KEY",
    "STREAM_ENDING_KEY",
    "STREAM_ERROR_KEY",
    "STREAM_ITEMS_KEY",
    "TENANT_KEY",
    "APIKeyResolver",
    "Caller",
    "GuardServerInterceptor",
    "HeaderResolver",
    "Identity",
    "PermissionDenied",
    "RemoteDeadlineExceeded",
    "RemoteQuotaExceeded",
    "RemoteUnavailable",
    "SnappyServerInterceptor",
    "SnappyWire",
    "TenantResolver",
    "Unauthenticated",
    "client_interceptors",
    "ending_trailers",
    "snappy_channel",
]
