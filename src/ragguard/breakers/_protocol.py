"""What a guarded stage needs of a breaker: the :class:`Breaker` protocol.

The breaker layer talks to every breaker (ragguard's :class:`CircuitBreaker`, the Redis-shared
breaker, an aiobreaker adapter, or a user's own) through these methods only, checked once when the
stage's chain is built, never probed per call::

    token = breaker.acquire()                 # raises BreakerOpen when it rejects the call
    ...the call...
    breaker.on_result(token, duration_s, exc) # exc: the Exception raised, None on success
    breaker.release(token)                    # instead, when the call was cancelled or never ran

A breaker whose permits live elsewhere (Redis) is also an :class:`AsyncBreaker`: when ``acquire``
rejects a caller in the half-open state, the layer awaits ``acquire_async`` for a trial permit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

__all__ = ["AsyncBreaker", "Breaker"]


@runtime_checkable
class Breaker(Protocol):
    """A circuit breaker as the guard drives it (see the module docstring for the call order).

    ``classifier(exc)`` is True when ``exc`` counts as a failure of the dependency; the guard
    also uses it to decide whether a stage's fallback serves.
    """

    name: str

    @property
    def state(self) -> Any: ...

    @property
    def classifier(self) -> Callable[[BaseException], bool]: ...

    def acquire(self) -> Any: ...

    def on_result(
        self, token: Any, duration_s: float, exc: BaseException | None, now: float | None = None
    ) -> None: ...

    def release(self, token: Any) -> None: ...


@runtime_checkable
class AsyncBreaker(Breaker, Protocol):
    """A :class:`Breaker` that can hand out half-open trial permits with a round trip."""

    async def acquire_async(self) -> Any: ...
