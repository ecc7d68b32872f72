"""Errors the transport raises for throttled and unavailable answers.

Each is an :class:`httpx.HTTPStatusError` (``request``, ``response`` work, and
``except httpx.HTTPStatusError`` still catches it); :func:`ragguard.outcomes.classify` reads it by
its status, as any ``HTTPStatusError``::

    httpx.HTTPStatusError
     +-- RemoteStatusError
          +-- RemoteUnavailable     (ConnectionError)  503: a dependency failure (every breaker
          |                                            counts it), a rejection when it states a wait
          +-- RemoteQuotaExceeded                      429: a dependency rejection

A 429 is the dependency's rejection, not ragguard's own quota refusal (it is no longer a
:class:`~ragguard.QuotaExceeded`): no breaker counts it, the throttle does, the retry waits what it
states (up to the stage's ``max_retry_after_s``), the stage's fallback serves it, and a front door
that it reaches answers 503 with ``Retry-After`` (the caller is not over *its* quota).

Each carries ``retry_after_s``: seconds from ``retry-after-ms`` when the server sent it (exact),
else ``Retry-After`` (delay-seconds or an HTTP-date), else the rate-limit resets
(``x-ratelimit-reset-requests`` / ``-tokens``), clamped to a day; None when it sent none, 0.0 for
a 429 (whose ``retry_after_s`` is always a float).
"""

from __future__ import annotations

import httpx

from .._http import stated_wait

__all__ = ["RemoteQuotaExceeded", "RemoteStatusError", "RemoteUnavailable", "retry_after_of"]


def retry_after_of(headers: httpx.Headers) -> float | None:
    """The wait, in seconds, that response ``headers`` ask for (see the module docstring)."""
    return stated_wait(headers)


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


class RemoteQuotaExceeded(RemoteStatusError):
    """429: the server throttled the call made for tenant ``tenant`` (a dependency's rejection).

    ``retry_after_s``: the server's wait in seconds, 0.0 when it sent none; ``reason``: ``"remote"``.
    """

    retry_after_s: float

    def __init__(self, response: httpx.Response, tenant: str) -> None:
        super().__init__(response)
        self.tenant = tenant
        self.reason = "remote"
        self.retry_after_s = retry_after_of(response.headers) or 0.0
