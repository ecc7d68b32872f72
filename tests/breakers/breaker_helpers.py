"""Drive a breaker through its low-level protocol without an event loop."""

from __future__ import annotations

from ragguard.breakers import CircuitBreaker


def succeed(breaker: CircuitBreaker, duration_s: float = 0.0) -> None:
    token = breaker.acquire()
    breaker.on_result(token, duration_s, None)


def fail(breaker: CircuitBreaker, exc: Exception | None = None, duration_s: float = 0.0) -> None:
    token = breaker.acquire()
    breaker.on_result(token, duration_s, exc if exc is not None else ConnectionRefusedError("down"))
