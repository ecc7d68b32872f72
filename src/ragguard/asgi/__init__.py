"""ASGI integration (FastAPI, Starlette, any ASGI server; no framework is imported).

::

    app = FastAPI()
    app.add_middleware(RagguardMiddleware, tenant_resolver=APIKeyResolver(keys))  # who, deadline, quota
    app.add_route("/health", StatusEndpoint())      # Guard.status() as JSON, never throttled

A streamed answer (SSE, chunked): ``StreamingResponse(await primed(stream), ...)`` lets a failure
before the first item answer its own status (see :func:`primed` and docs/generation.md).

The tenant comes from a tenant resolver (:class:`APIKeyResolver`, a verified token's claim, or
:class:`HeaderResolver`, the default: the ``x-tenant-id`` field as sent, to trust only behind a
proxy that sets it); see docs/http.md.

Field names (shared with :mod:`ragguard.httpx`, so ragguard services chain): ``x-tenant-id``,
``x-request-timeout-ms`` in, ``retry-after``, ``retry-after-ms``, ``ragguard-degraded`` out.
"""

from .._errors import PermissionDenied, Unauthenticated
from .._http import (
    DEGRADED_HEADER,
    RETRY_AFTER_HEADER,
    RETRY_AFTER_MS_HEADER,
    TENANT_HEADER,
    TIMEOUT_HEADER,
)
from .._identity import API_KEY_HEADER, APIKeyResolver, Caller, HeaderResolver, Identity, TenantResolver
from ._health import StatusEndpoint
from ._middleware import SSE_ENDING_EVENT, SSE_ERROR_EVENT, RagguardMiddleware
from ._stream import primed

__all__ = [
    "API_KEY_HEADER",
    "DEGRADED_HEADER",
    "RETRY_AFTER_HEADER",
    "RETRY_AFTER_MS_HEADER",
    "SSE_ENDING_EVENT",
    "SSE_ERROR_EVENT",
    "TENANT_HEADER",
    "TIMEOUT_HEADER",
    "APIKeyResolver",
    "Caller",
    "HeaderResolver",
    "Identity",
    "PermissionDenied",
    "RagguardMiddleware",
    "StatusEndpoint",
    "TenantResolver",
    "Unauthenticated",
    "primed",
]
