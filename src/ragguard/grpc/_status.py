"""How ragguard errors become gRPC statuses (server side).

==========================  ==================  ==========================================
error                       status              trailing metadata
==========================  ==================  ==========================================
QuotaExceeded               RESOURCE_EXHAUSTED  ``retry-after``: seconds, e.g. ``"0.250"``
BreakerOpen                 UNAVAILABLE         ``retry-after`` when the breaker knows it
DeadlineExceeded            DEADLINE_EXCEEDED
InvalidInput (ValueError)   INVALID_ARGUMENT    (bad tenant id, bad option, corrupt payload)
anything else               unchanged           (gRPC reports UNKNOWN)
==========================  ==================  ==========================================
"""

from __future__ import annotations

import math

import grpc

from .._errors import BreakerOpen, DeadlineExceeded, InvalidInput, QuotaExceeded

__all__ = ["RETRY_AFTER_KEY", "Status", "format_retry_after", "parse_retry_after", "status_for"]

RETRY_AFTER_KEY = "retry-after"

Status = tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]


def format_retry_after(seconds: float) -> str:
    """``seconds`` as a ``retry-after`` value: decimal seconds with millisecond precision."""
    return f"{max(0.0, seconds):.3f}"


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


def status_for(exc: BaseException) -> Status | None:
    """The (code, details, trailing metadata) that ``exc`` maps to, or None to leave it to gRPC."""
    after: tuple[tuple[str, str], ...]
    if isinstance(exc, QuotaExceeded):
        after = ((RETRY_AFTER_KEY, format_retry_after(exc.retry_after_s)),)
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc), after
    if isinstance(exc, BreakerOpen):
        after = (
            () if exc.retry_after_s is None else ((RETRY_AFTER_KEY, format_retry_after(exc.retry_after_s)),)
        )
        return grpc.StatusCode.UNAVAILABLE, str(exc), after
    if isinstance(exc, DeadlineExceeded):
        return grpc.StatusCode.DEADLINE_EXCEEDED, str(exc), ()
    if isinstance(exc, InvalidInput):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc), ()
    return None
