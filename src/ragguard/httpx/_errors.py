"""Errors the transport raises for throttled, unavailable and timed-out answers.

Each is an :class:`httpx.HTTPStatusError` (``request``, ``response`` work, and
``except httpx.HTTPStatusError`` still catches it); :func:`ragguard.outcomes.classify` reads it by
its status, as any ``HTTPStatusError``::

    httpx.HTTPStatusError
     +-- RemoteStatusError
          +-- RemoteUnavailable     (ConnectionError)  503: a dependency failure (every breaker
          |                                            counts it), a rejection when it states a wait
          +-- RemoteDeadlineExceeded   (TimeoutError)  504: a timeout (what a ragguard server said
          |                                            set its deadline: set_by, deadline_s; the
          |                                            request's deadline: request_deadline)
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

import json

import httpx

from .._http import stated_wait
from ..outcomes._doors import told_deadline

__all__ = [
    "ERROR_BODY_BYTES",
    "RemoteDeadlineExceeded",
    "RemoteQuotaExceeded",
    "RemoteStatusError",
    "RemoteUnavailable",
    "deadline_told_of",
    "retry_after_of",
]

ERROR_BODY_BYTES = 8 * 1024
"""The most of a 429's, 503's or 504's body the transport reads, in bytes as sent (a ragguard
door's is under 1 KB, a provider's error JSON a few hundred bytes): a body past it, however large,
compressed or endless, is cut there and never read on."""


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


class RemoteDeadlineExceeded(RemoteStatusError, TimeoutError):
    """504: the server's deadline ran out before it could answer (a TimeoutError, classified by
    its status as any 504: ``Kind.TIMEOUT``, unless ``request_deadline``).

    ``request_deadline``: the server said the client's deadline ran out, and the timeout field
    the request carried was the request's own ragguard deadline (the transport sent it): what
    ran out is the request's time, as :class:`ragguard.DeadlineExceeded` says, classified
    ``Kind.DEADLINE`` (never counted by a breaker, never retried) rather than as the server's
    slowness. A timeout field the caller set itself keeps the 504 a timeout.

    ``set_by`` and ``deadline_s``: what a ragguard server said set the deadline that ran out on
    its side, and that deadline's budget in seconds (the ``deadline_set_by`` and ``deadline_s``
    of its JSON body, as :class:`ragguard.DeadlineExceeded` names them): ``"client"`` (the
    ``x-request-timeout-ms`` the request carried), ``"tenant"`` (the tenant's ``timeout_s``
    there) or ``"handler"`` (the server code's own ``deadline(...)``); None when the server said
    nothing readable (see :func:`deadline_told_of`). ``response.content`` holds the first
    :data:`ERROR_BODY_BYTES` of the body at most."""

    def __init__(self, response: httpx.Response, *, request_deadline: bool = False) -> None:
        super().__init__(response)
        self.set_by, self.deadline_s = deadline_told_of(response)
        self.request_deadline = request_deadline and self.set_by == "client"


def deadline_told_of(response: httpx.Response) -> tuple[str | None, float | None]:
    """What the read body of ``response`` (a 504 of a ragguard server) says of the deadline that
    ran out: what set it (``client``, ``tenant``, ``handler``; None for anything else) and its
    budget in seconds (None unless a JSON number, finite, in [0, ten years]). Only a JSON object
    (``content-type: application/json``) of at most :data:`ERROR_BODY_BYTES` is read; never
    raises."""
    content_type = response.headers.get("content-type", "")
    if content_type.split(";", 1)[0].strip().lower() != "application/json":
        return None, None
    try:
        content = response.content
        if len(content) > ERROR_BODY_BYTES:
            return None, None
        body = json.loads(content)
    except (httpx.ResponseNotRead, ValueError, RecursionError):  # not JSON, too deep, huge ints
        return None, None
    if not isinstance(body, dict):
        return None, None
    return told_deadline(body.get("deadline_set_by"), body.get("deadline_s"))


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
