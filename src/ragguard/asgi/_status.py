"""How ragguard errors become HTTP responses.

==========================  ======  =============================================================
error                       status  headers
==========================  ======  =============================================================
QuotaExceeded               429     ``Retry-After`` (whole seconds, rounded up, >= 1),
                                    ``retry-after-ms`` (exact), ``RateLimit`` (see below)
QuotaExceeded (deadline)    504     (the wait for a slot or token outlasted the deadline)
BreakerOpen                 503     ``Retry-After`` and ``retry-after-ms`` when the breaker knows
Overloaded                  503     ``Retry-After`` and ``retry-after-ms`` (shed by an adaptive
                                    limit or throttle)
DeadlineExceeded            504
StageTimeout                504     (a dependency was slower than its stage allows)
InvalidInput (ValueError)   400     (bad tenant id, bad timeout field, corrupt payload)
anything else               --      left to the application and the server (500)
==========================  ======  =============================================================

The body is JSON: ``{"detail": str(error), "error": "<class name>", "retry_after_s": float}``
(``retry_after_s`` only when there is a wait to tell). An error that cut a stream adds ``"items"``
(how many items the caller had been sent) and, for :class:`~ragguard.StreamTimeout`, ``"budget"``
(``first_item``, ``idle`` or ``total``); in an SSE stream they reach the client in the
``ragguard-error`` event.

``RateLimit`` follows the IETF draft "RateLimit header fields for HTTP"
(draft-ietf-httpapi-ratelimit-headers, -08 onwards): on a 429 refused by the tenant's concurrency
or rate quota, ``RateLimit: "concurrency";r=0;t=2`` says that quota policy has nothing left and
refills in ``t`` whole seconds. Only this one exact statement is made: no ``RateLimit-Policy``
(a GCRA rate with a burst is not the draft's fixed quota-per-window, so any ``q``/``w`` would be
an approximation), and no fields on admitted requests (their remaining quota would cost every
request a look-up and goes stale at once under concurrency).
"""

from __future__ import annotations

import json
from typing import Any

from .._errors import (
    BreakerOpen,
    DeadlineExceeded,
    InvalidInput,
    Overloaded,
    QuotaExceeded,
    StageTimeout,
    StreamTimeout,
)
from .._http import (
    RETRY_AFTER_HEADER,
    RETRY_AFTER_MS_HEADER,
    format_retry_after,
    format_retry_after_ms,
)

__all__ = ["HttpStatus", "http_status_for"]

Headers = list[tuple[bytes, bytes]]
HttpStatus = tuple[int, Headers, dict[str, Any]]
"""(status code, headers, JSON body) for one error."""

_QUOTA_POLICIES = ("concurrency", "rate")


def _wait_headers(seconds: float | None) -> Headers:
    if seconds is None:
        return []
    return [
        (RETRY_AFTER_HEADER.encode(), format_retry_after(seconds).encode()),
        (RETRY_AFTER_MS_HEADER.encode(), format_retry_after_ms(seconds).encode()),
    ]


def http_status_for(exc: BaseException, *, ratelimit_fields: bool = True) -> HttpStatus | None:
    """The (status, headers, JSON body) that ``exc`` maps to, or None to leave it to the app.

    ``ratelimit_fields``: add the draft ``RateLimit`` field to a quota's 429 (see the module
    docstring). Header names are lowercase bytes, as ASGI wants them.
    """
    status: int
    headers: Headers = []
    wait: float | None = None
    if isinstance(exc, QuotaExceeded):
        if exc.reason == "deadline":
            status = 504
        else:
            status, wait = 429, exc.retry_after_s
            headers = _wait_headers(wait)
            if ratelimit_fields and exc.reason in _QUOTA_POLICIES:
                reset = format_retry_after(exc.retry_after_s)
                headers.append((b"ratelimit", f'"{exc.reason}";r=0;t={reset}'.encode()))
    elif isinstance(exc, (BreakerOpen, Overloaded)):
        status, wait = 503, exc.retry_after_s
        headers = _wait_headers(wait)
    elif isinstance(exc, (DeadlineExceeded, StageTimeout)):
        status = 504
    elif isinstance(exc, InvalidInput):
        status = 400
    else:
        return None
    body: dict[str, Any] = {"detail": str(exc), "error": type(exc).__name__}
    if wait is not None:
        body["retry_after_s"] = round(wait, 6)
    if isinstance(exc, StreamTimeout):
        body["budget"] = exc.budget
    items = getattr(exc, "items", None) if status == 504 else None
    if isinstance(items, int):
        body["items"] = items
    return status, headers, body


def json_body(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()
