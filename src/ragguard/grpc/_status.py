"""How errors become gRPC statuses (server side), by their outcome (:mod:`ragguard.outcomes`),
and how clients read the pushback. The code is the one table's (``ragguard.outcomes._doors.ANSWERS``,
which the HTTP door reads too).

=================================  ===================  ==============================================
error (its outcome)                status               trailing metadata
=================================  ===================  ==============================================
QuotaExceeded (ragguard's quota)   RESOURCE_EXHAUSTED   ``retry-after``: seconds, e.g. ``"0.250"``, and
                                                        ``grpc-retry-pushback-ms``: ``"250"``
QuotaExceeded (deadline)           DEADLINE_EXCEEDED    (the wait for a slot or token outlasted it)
                                                        the two ``ragguard-deadline-*`` below
BreakerOpen                        UNAVAILABLE          both, when the breaker knows the wait
Overloaded                         UNAVAILABLE          both (shed by an adaptive limit or throttle)
DeadlineExceeded                   DEADLINE_EXCEEDED    ``ragguard-deadline-set-by``: what set the
                                                        request's deadline (``client``, ``tenant``:
                                                        its ``timeout_s``, ``handler``) and
                                                        ``ragguard-deadline-s``: its budget, seconds
StageTimeout, a dependency's       DEADLINE_EXCEEDED    (a dependency was slower than its stage allows)
timeout
StreamTimeout                      DEADLINE_EXCEEDED    ``ragguard-stream-budget``: ``first_item``,
                                                        ``idle`` or ``total``
(a stream cut by either)                                ``ragguard-stream-items``: the messages sent
                                                        (the guarded stream's items, with its ending)
a dependency's rejection           UNAVAILABLE          both: the wait it stated, else 1 s
a dependency's failure             UNAVAILABLE          both, when it stated a wait
InvalidInput (ValueError)          INVALID_ARGUMENT     (bad tenant id, bad option, corrupt payload)
Unauthenticated                    UNAUTHENTICATED
PermissionDenied                   PERMISSION_DENIED
a dependency's invalid request     INVALID_ARGUMENT     (other caller errors of a dependency:
                                                        FAILED_PRECONDITION)
anything else                      unchanged            (gRPC reports UNKNOWN)
=================================  ===================  ==============================================

A dependency's error is described in general words (no upstream URL, host or port in ``details``).
``grpc-retry-pushback-ms`` is what stock gRPC retry policies read (gRFC A6: the client waits
that many milliseconds before its next attempt); ``retry-after`` keeps the exact value for
ragguard clients and for people reading trailers. Every wait parsed or formatted is clamped to a
day (``1e308``, infinity, a 40-digit pushback included): none raises.
"""

from __future__ import annotations

import math

import grpc

from .._context import RequestScope
from .._errors import DeadlineExceeded, StageTimeout, StreamTimeout, TellsDeadline
from .._waits import clamp_wait, clamped
from ..outcomes import outcome_of
from ..outcomes._doors import ANSWERS, door_answer, told_deadline
from ..outcomes._grpc import (
    PUSHBACK_KEY,
    RETRY_AFTER_KEY,
    parse_pushback_ms,
    parse_retry_after,
    retry_after_of,
)

__all__ = [
    "DEADLINE_BY_KEY",
    "DEADLINE_S_KEY",
    "PUSHBACK_KEY",
    "RETRY_AFTER_KEY",
    "STREAM_AFTER_KEY",
    "STREAM_BUDGET_KEY",
    "STREAM_BY_KEY",
    "STREAM_ENDING_KEY",
    "STREAM_ERROR_KEY",
    "STREAM_ITEMS_KEY",
    "Status",
    "deadline_told_of",
    "deadline_trailers",
    "ending_trailers",
    "format_retry_after",
    "parse_pushback_ms",
    "parse_retry_after",
    "retry_after_of",
    "retry_trailers",
    "status_for",
]

STREAM_BUDGET_KEY = "ragguard-stream-budget"
STREAM_ITEMS_KEY = "ragguard-stream-items"
STREAM_ENDING_KEY = "ragguard-stream-ending"
STREAM_BY_KEY = "ragguard-stream-continued-by"
STREAM_AFTER_KEY = "ragguard-stream-continued-after"
STREAM_ERROR_KEY = "ragguard-stream-error"
DEADLINE_BY_KEY = "ragguard-deadline-set-by"
DEADLINE_S_KEY = "ragguard-deadline-s"

Status = tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]


def format_retry_after(seconds: float) -> str:
    """``seconds`` as a ``retry-after`` value: decimal seconds with millisecond precision (clamped
    to [0, a day]; never raises)."""
    return f"{clamped(seconds):.3f}"


def _pushback_ms(seconds: float) -> str:
    # whole milliseconds, rounded up: a client that waits this long never comes back too early
    return str(math.ceil(round(clamped(seconds) * 1000.0, 6)))


def retry_trailers(seconds: float | None) -> tuple[tuple[str, str], ...]:
    """The trailing metadata that tells a client to wait ``seconds`` (none when None or NaN; an
    infinite or huge wait is told as a day)."""
    if seconds is None or clamp_wait(seconds) is None:
        return ()
    return ((RETRY_AFTER_KEY, format_retry_after(seconds)), (PUSHBACK_KEY, _pushback_ms(seconds)))


def deadline_trailers(exc: TellsDeadline) -> tuple[tuple[str, str], ...]:
    """What the error ``exc`` (a DeadlineExceeded, a QuotaExceeded of reason deadline) says in
    trailing metadata of the request's deadline: what set it and its budget, when known."""
    by, seconds = told_deadline(exc.set_by, exc.deadline_s)
    told: tuple[tuple[str, str], ...] = () if by is None else ((DEADLINE_BY_KEY, by),)
    return told if seconds is None else (*told, (DEADLINE_S_KEY, f"{seconds:.3f}"))


def deadline_told_of(metadata: object) -> tuple[str | None, float | None]:
    """What trailing ``metadata`` says of the deadline that ended a call (a ragguard server's
    ``ragguard-deadline-set-by``, ``ragguard-deadline-s``): what set it (``client``, ``tenant``,
    ``handler``; None for anything else) and its budget in seconds (None unless a finite number
    in [0, ten years]). Never raises; a value longer than 64 characters is None."""
    by: object = None
    seconds: object = None
    try:
        for key, value in metadata or ():  # type: ignore[attr-defined]
            if isinstance(value, bytes) or not isinstance(value, str) or len(value) > _MAX_TOLD:
                continue
            if key == DEADLINE_BY_KEY and by is None:
                by = value
            elif key == DEADLINE_S_KEY and seconds is None:
                seconds = _number(value)
    except (TypeError, ValueError):  # not (key, value) pairs
        return None, None
    return told_deadline(by, seconds)


_MAX_TOLD = 64


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _stream_trailers(exc: DeadlineExceeded | StageTimeout) -> tuple[tuple[str, str], ...]:
    """What a timeout says in trailing metadata: what set the request's deadline and its budget
    (when known); for one that cut a stream, its budget and the messages sent."""
    told = deadline_trailers(exc) if isinstance(exc, DeadlineExceeded) else ()
    if exc.items is None:
        return told
    items = (STREAM_ITEMS_KEY, str(exc.items))
    if isinstance(exc, StreamTimeout):
        return (*told, (STREAM_BUDGET_KEY, exc.budget), items)
    return (*told, items)


def ending_trailers(request: RequestScope | None) -> tuple[tuple[str, str], ...]:
    """The trailing metadata that tells how the last guarded stream of ``request`` (a request's
    scope: ``ragguard.tenant(...)``) ended: ``ragguard-stream-ending`` (``completed``,
    ``continued``, ``incomplete``) and ``ragguard-stream-items``; ``ragguard-stream-continued-by``
    and ``ragguard-stream-continued-after`` when a continuation took over;
    ``ragguard-stream-error`` when an error ended it (or was taken over from). () when no
    guarded stream ended in it."""
    endings = None if request is None else request.endings
    if not endings:
        return ()
    ending = endings[-1]
    trailers = [(STREAM_ENDING_KEY, ending.kind), (STREAM_ITEMS_KEY, str(ending.items))]
    if ending.continued_by:
        trailers.append((STREAM_BY_KEY, _ascii(ending.continued_by)))
        trailers.append((STREAM_AFTER_KEY, str(ending.continued_after)))
    if ending.error:
        trailers.append((STREAM_ERROR_KEY, _ascii(ending.error)))
    return tuple(trailers)


def _ascii(text: str) -> str:
    """``text`` as a metadata value: printable ASCII, at most 128 characters."""
    return "".join(c if " " <= c <= "~" else "?" for c in text[:128])


_CODES = {name: grpc.StatusCode[row.grpc_code] for name, row in ANSWERS.items()}
"""The table's gRPC code names as ``grpc.StatusCode`` members."""


def status_for(exc: BaseException) -> Status | None:
    """The (code, details, trailing metadata) that ``exc`` maps to, or None to leave it to gRPC.
    Never raises for any wait."""
    answer = door_answer(exc, outcome_of(exc))  # the guarded call's own classification
    if answer is None:
        return None
    row, wait, detail = answer
    if row.name == "deadline" and isinstance(exc, (DeadlineExceeded, StageTimeout)):
        return _CODES[row.name], detail, _stream_trailers(exc)
    if row.name == "quota_deadline" and isinstance(exc, TellsDeadline):
        return _CODES[row.name], detail, deadline_trailers(exc)
    return _CODES[row.name], detail, retry_trailers(wait)
