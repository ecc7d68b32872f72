"""Errors the transport raises for throttled and unavailable answers, shaped for the typed breakers.

Each is an :class:`httpx.HTTPStatusError` (``request``, ``response`` work, and
``except httpx.HTTPStatusError`` still catches it) and also a class the breakers classify, as
:mod:`ragguard.grpc` does for gRPC statuses::

    httpx.HTTPStatusError
     +-- RemoteStatusError
          +-- RemoteUnavailable     (ConnectionError)         503: connection class
          +-- RemoteQuotaExceeded   (ragguard.QuotaExceeded)  429

429 is a :class:`~ragguard.QuotaExceeded`, not a connection error: the server is up and
throttling this tenant, so no breaker opens for every tenant because of it. A ragguard service
that lets it escape answers its own caller 429 with the same wait, so the pushback travels
back. 503 is a :class:`ConnectionError`: the vector-store and embedding breakers count it.

Each carries ``retry_after_s``: seconds from ``retry-after-ms`` when the server sent it (exact),
else from ``Retry-After`` (delay-seconds or an HTTP-date); None when it sent neither, 0.0 for a
429 (whose ``retry_after_s`` is always a float).
"""

from __future__ import annotations

import httpx

from .._errors import QuotaExceeded
from .._http import RETRY_AFTER_HEADER, RETRY_AFTER_MS_HEADER, parse_retry_after, parse_retry_after_ms

__all__ = ["RemoteQuotaExceeded", "RemoteStatusError", "RemoteUnavailable", "retry_after_of"]


def retry_after_of(headers: httpx.Headers) -> float | None:
    """The wait, in seconds, that response ``headers`` ask for (see the module docstring)."""
    exact = headers.get(RETRY_AFTER_MS_HEADER)
    if exact is not None:
        seconds = parse_retry_after_ms(exact)
        if seconds is not None:
            return seconds
    value = headers.get(RETRY_AFTER_HEADER)
    return None if value is None else parse_retry_after(value)


class RemoteStatusError(httpx.HTTPStatusError):
    """A response status ragguard classifies; see the subclasses.

    ``retry_after_s``: seconds the server asked to wait before a retry, or None.
    """

    retry_after_s: float | None

    def __init__(self, response: httpx.Response) -> None:
        request = response.request
        message = f"{response.status_code} {response.reason_phrase} from {request.method} {request.url}"
        # Fill HTTPStatusError's fields directly: its __init__ chains to the next base's
        # __init__ (OSError's, QuotaExceeded's), which take other arguments.
        Exception.__init__(self, message)
        self._request = request
        self.response = response
        self.retry_after_s = retry_after_of(response.headers)


class RemoteUnavailable(RemoteStatusError, ConnectionError):
    """503: the server is up but cannot serve now (a ConnectionError)."""


class RemoteQuotaExceeded(RemoteStatusError, QuotaExceeded):
    """429: the server throttled tenant ``tenant`` (a ragguard QuotaExceeded).

    ``retry_after_s``: the server's wait in seconds, 0.0 when it sent none; ``reason``: ``"remote"``.
    """

    retry_after_s: float

    def __init__(self, response: httpx.Response, tenant: str) -> None:
        super().__init__(response)
        self.tenant = tenant
        self.reason = "remote"
        self.retry_after_s = retry_after_of(response.headers) or 0.0
