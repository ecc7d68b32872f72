"""The states of a circuit breaker (after resilience4j's CircuitBreaker.State)."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["BreakerState"]


class BreakerState(StrEnum):
    """Where a breaker stands.

    ``CLOSED``: calls run and are recorded in the sliding window.
    ``OPEN``: calls are rejected until ``open_for_s`` has passed, then the next call half-opens it.
    ``HALF_OPEN``: exactly ``half_open_permits`` trial calls run; their failure and slow-call rates
    decide between ``CLOSED`` and ``OPEN``.
    ``FORCED_OPEN``: an operator holds it open; every call is rejected until :meth:`reset`.
    ``DISABLED``: an operator switched it off; every call runs and nothing is recorded.
    """

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"
    FORCED_OPEN = "forced_open"
    DISABLED = "disabled"
