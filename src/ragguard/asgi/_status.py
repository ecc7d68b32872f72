"""How errors become HTTP responses: by their outcome (:mod:`ragguard.outcomes`), so a
dependency's error maps as surely as ragguard's own; the status is the one table's
(``ragguard.outcomes._doors.ANSWERS``, which the gRPC door reads too).

==================================  ======  =========================================================
error (its outcome)                 status  headers
==================================  ======  =========================================================
QuotaExceeded (ragguard's quota)    429     ``Retry-After`` (whole seconds, rounded up, >= 1),
                                            ``retry-after-ms`` (exact), ``RateLimit`` (see below)
QuotaExceeded (deadline)            504     (the wait for a slot or token outlasted the deadline)
BreakerOpen                         503     ``Retry-After`` and ``retry-after-ms`` when the breaker knows
Overloaded                          503     ``Retry-After`` and ``retry-after-ms`` (shed by an adaptive
                                            limit or throttle)
DeadlineExceeded                    504
StageTimeout, a dependency timeout  504     (a dependency was slower than its stage allows)
a dependency's rejection (429,      503     ``Retry-After`` and ``retry-after-ms``: the wait it stated,
529, RESOURCE_EXHAUSTED)                    else 1 s (the caller is not over *its* quota: no 429)
a dependency's failure (refused,    502     (503 for out of memory); the wait it stated, if any
reset, 5xx, UNAVAILABLE)
InvalidInput (ValueError)           400     (bad tenant id, bad timeout field, corrupt payload)
Unauthenticated                     401     ``WWW-Authenticate``: its ``challenge`` (default ``Bearer``)
PermissionDenied                    403
a dependency's 400/413/422          400     (the request was invalid; other 4xx from a dependency: 502)
anything else                       --      left to the application and the server (500)
==================================  ======  =========================================================

The body is JSON: ``{"detail": ..., "error": "<class name>", "outcome": "<kind>", "retry_after_s":
float}`` (``retry_after_s`` only when there is a wait to tell). ``detail`` is ragguard's message for
its own errors and a general sentence for a dependency's ("a dependency of this service failed"): no
body names an upstream URL, host or port. An error that cut a stream adds ``"items"`` (how many
items the caller had been sent) and, for :class:`~ragguard.StreamTimeout`, ``"budget"``
(``first_item``, ``idle`` or ``total``); in an SSE stream they reach the client in the
``ragguard-error`` event. A :class:`~ragguard.DeadlineExceeded` adds what set the request's
deadline, ``"deadline_set_by"`` (``"client"``: the timeout field the caller sent; ``"tenant"``:
the tenant's ``timeout_s``, shorter; ``"handler"``: a ``deadline(...)`` block of the app, shorter
still), and ``"deadline_s"``, that deadline's budget in seconds, when known; so does a
:class:`~ragguard.QuotaExceeded` whose wait that deadline cut. Every wait is
clamped (a day at most; ``1e308`` or infinity included): formatting one never raises.

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

from .._errors import QuotaExceeded, StreamTimeout, TellsDeadline, Unauthenticated
from .._http import (
    RETRY_AFTER_HEADER,
    RETRY_AFTER_MS_HEADER,
    format_retry_after,
    format_retry_after_ms,
)
from ..outcomes import outcome_of
from ..outcomes._doors import door_answer, told_deadline

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
    docstring). Header names are lowercase bytes, as ASGI wants them. Never raises for any wait.
    """
    outcome = outcome_of(exc)  # the guarded call's own classification, recorded on the error
    answer = door_answer(exc, outcome)
    if answer is None:
        return None
    row, wait, detail = answer
    status = row.http_status
    headers = _wait_headers(wait)
    if isinstance(exc, Unauthenticated):
        headers.append((b"www-authenticate", exc.challenge.encode("latin-1", "replace")))
    elif row.name == "quota" and ratelimit_fields and isinstance(exc, QuotaExceeded):
        if exc.reason in _QUOTA_POLICIES:
            reset = format_retry_after(wait or 0.0)
            headers.append((b"ratelimit", f'"{exc.reason}";r=0;t={reset}'.encode()))
    body: dict[str, Any] = {"detail": detail, "error": type(exc).__name__, "outcome": outcome.kind.value}
    if wait is not None:
        body["retry_after_s"] = round(wait, 6)
    if isinstance(exc, StreamTimeout):
        body["budget"] = exc.budget
    elif isinstance(exc, TellsDeadline):
        by, seconds = told_deadline(exc.set_by, exc.deadline_s)
        if by is not None:
            body["deadline_set_by"] = by
        if seconds is not None:
            body["deadline_s"] = round(seconds, 6)
    items = getattr(exc, "items", None) if status == 504 else None
    if isinstance(items, int):
        body["items"] = items
    return status, headers, body


def json_body(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()
