"""How ragguard errors become gRPC statuses (server side), and how clients read the pushback.

==========================  ==================  ==============================================
error                       status              trailing metadata
==========================  ==================  ==============================================
QuotaExceeded               RESOURCE_EXHAUSTED  ``retry-after``: seconds, e.g. ``"0.250"``, and
                                                ``grpc-retry-pushback-ms``: ``"250"``
QuotaExceeded (deadline)    DEADLINE_EXCEEDED   (the wait for a slot or token outlasted it)
BreakerOpen                 UNAVAILABLE         both, when the breaker knows the wait
Overloaded                  UNAVAILABLE         both (shed by an adaptive limit or throttle)
DeadlineExceeded            DEADLINE_EXCEEDED
StageTimeout                DEADLINE_EXCEEDED   (a dependency was slower than its stage allows)
StreamTimeout               DEADLINE_EXCEEDED   ``ragguard-stream-budget``: ``first_item``,
                                                ``idle`` or ``total``
(a stream cut by either)                        ``ragguard-stream-items``: the messages sent
InvalidInput (ValueError)   INVALID_ARGUMENT    (bad tenant id, bad option, corrupt payload)
anything else               unchanged           (gRPC reports UNKNOWN)
==========================  ==================  ==============================================

``grpc-retry-pushback-ms`` is what stock gRPC retry policies read (gRFC A6: the client waits
that many milliseconds before its next attempt); ``retry-after`` keeps the exact value for
ragguard clients and for people reading trailers.
"""

from __future__ import annotations

import math

import grpc

from .._errors import (
    BreakerOpen,
    DeadlineExceeded,
    InvalidInput,
    Overloaded,
    QuotaExceeded,
    StageTimeout,
    StreamTimeout,
)

__all__ = [
    "PUSHBACK_KEY",
    "RETRY_AFTER_KEY",
    "STREAM_BUDGET_KEY",
    "STREAM_ITEMS_KEY",
    "Status",
    "format_retry_after",
    "parse_pushback_ms",
    "parse_retry_after",
    "retry_after_of",
    "retry_trailers",
    "status_for",
]

RETRY_AFTER_KEY = "retry-after"
PUSHBACK_KEY = "grpc-retry-pushback-ms"
STREAM_BUDGET_KEY = "ragguard-stream-budget"
STREAM_ITEMS_KEY = "ragguard-stream-items"

Status = tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]


def format_retry_after(seconds: float) -> str:
    """``seconds`` as a ``retry-after`` value: decimal seconds with millisecond precision."""
    return f"{max(0.0, seconds):.3f}"


def _pushback_ms(seconds: float) -> str:
    # whole milliseconds, rounded up: a client that waits this long never comes back too early
    return str(math.ceil(round(max(0.0, seconds) * 1000.0, 6)))


def retry_trailers(seconds: float | None) -> tuple[tuple[str, str], ...]:
    """The trailing metadata that tells a client to wait ``seconds`` (none when None)."""
    if seconds is None or not math.isfinite(seconds):
        return ()
    return ((RETRY_AFTER_KEY, format_retry_after(seconds)), (PUSHBACK_KEY, _pushback_ms(seconds)))


def parse_retry_after(value: object) -> float | None:
    """A ``retry-after`` metadata value in seconds, or None when absent or not a finite number >= 0."""
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if not isinstance(value, str):
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def parse_pushback_ms(value: object) -> float | None:
    """A ``grpc-retry-pushback-ms`` value in seconds, or None: a negative or unreadable value means
    "do not retry" in gRFC A6, which gives no wait to honour."""
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if not isinstance(value, str) or not value.strip().isdigit():
        return None
    return int(value.strip()) / 1000.0


def retry_after_of(metadata: object) -> float | None:
    """The wait, in seconds, that trailing ``metadata`` asks for: ``retry-after`` when readable,
    else ``grpc-retry-pushback-ms``; None when neither is there."""
    if not metadata:
        return None
    pushback: float | None = None
    for item in metadata:  # type: ignore[attr-defined]
        key, value = item[0], item[1]
        if key == RETRY_AFTER_KEY:
            seconds = parse_retry_after(value)
            if seconds is not None:
                return seconds
        elif key == PUSHBACK_KEY and pushback is None:
            pushback = parse_pushback_ms(value)
    return pushback


def _stream_trailers(exc: DeadlineExceeded | StageTimeout) -> tuple[tuple[str, str], ...]:
    """What a timeout that cut a stream says in trailing metadata: its budget and the messages sent."""
    if exc.items is None:
        return ()
    items = (STREAM_ITEMS_KEY, str(exc.items))
    if isinstance(exc, StreamTimeout):
        return ((STREAM_BUDGET_KEY, exc.budget), items)
    return (items,)


def status_for(exc: BaseException) -> Status | None:
    """The (code, details, trailing metadata) that ``exc`` maps to, or None to leave it to gRPC."""
    if isinstance(exc, QuotaExceeded):
        if exc.reason == "deadline":
            return grpc.StatusCode.DEADLINE_EXCEEDED, str(exc), ()
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc), retry_trailers(exc.retry_after_s)
    if isinstance(exc, (BreakerOpen, Overloaded)):
        return grpc.StatusCode.UNAVAILABLE, str(exc), retry_trailers(exc.retry_after_s)
    if isinstance(exc, (DeadlineExceeded, StageTimeout)):
        return grpc.StatusCode.DEADLINE_EXCEEDED, str(exc), _stream_trailers(exc)
    if isinstance(exc, InvalidInput):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc), ()
    return None
