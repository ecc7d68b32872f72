"""ASGI integration (FastAPI, Starlette, any ASGI server; no framework is imported).

::

    app = FastAPI()
    app.add_middleware(RagguardMiddleware)          # tenant, deadline, quota, status mapping
    app.add_route("/health", StatusEndpoint())      # Guard.status() as JSON, never throttled

A streamed answer (SSE, chunked): ``StreamingResponse(await primed(stream), ...)`` lets a failure
before the first item answer its own status (see :func:`primed` and docs/generation.md).

Field names (shared with :mod:`ragguard.httpx`, so ragguard services chain): ``x-tenant-id``,
``x-request-timeout-ms`` in, ``retry-after``, ``retry-after-ms``, ``ragguard-degraded`` out.
"""

from .._http import (
    DEGRADED_HEADER,
    RETRY_AFTER_HEADER,
    RETRY_AFTER_MS_HEADER,
    TENANT_HEADER,
    TIMEOUT_HEADER,
)
from ._health import StatusEndpoint
from ._middleware import SSE_ERROR_EVENT, RagguardMiddleware
from ._status import HttpStatus, http_status_for
from ._stream import primed

__all__ = [
    "DEGRADED_HEADER",
    "RETRY_AFTER_HEADER",
    "RETRY_AFTER_MS_HEADER",
    "SSE_ERROR_EVENT",
    "TENANT_HEADER",
    "TIMEOUT_HEADER",
    "HttpStatus",
    "RagguardMiddleware",
    "StatusEndpoint",
    "http_status_for",
    "primed",
]
