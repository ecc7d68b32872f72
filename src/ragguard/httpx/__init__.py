"""httpx integration: the client side of an HTTP dependency (an embedding or LLM provider, or
another ragguard service).

::

    import httpx
    from ragguard.httpx import GuardTransport

    client = httpx.AsyncClient(transport=GuardTransport())

The transport forwards the tenant and the remaining deadline (the fields
:class:`ragguard.asgi.RagguardMiddleware` reads), bounds each request by the deadline, and turns
429 and 503 answers into errors that carry ``retry_after_s`` and that the typed breakers classify,
and 504 answers into one that says what set the server's deadline (``set_by``, ``deadline_s``).
Needs httpx: install ragguard's ``http`` extra (``pip install '/path/to/ragguard[http]'``; from a
checkout ``pip install '.[http]'``).
"""

from __future__ import annotations

try:
    import httpx as _httpx  # noqa: F401 - the real httpx: absolute imports never find this package
except ImportError as exc:  # pragma: no cover - exercised only without httpx installed
    from .._extras import install_hint

    raise ImportError(f"ragguard.httpx needs httpx: {install_hint('http')}") from exc

from ._errors import RemoteDeadlineExceeded, RemoteQuotaExceeded, RemoteUnavailable
from ._transport import GuardTransport

__all__ = ["GuardTransport", "RemoteDeadlineExceeded", "RemoteQuotaExceeded", "RemoteUnavailable"]
