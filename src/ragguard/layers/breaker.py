"""The circuit breaker: a permit before each attempt, the outcome after it.

A gate of attempt scope (a stream holds its permit from opening to its end, and its outcome is
counted once, however it ends). ``enter`` takes a permit (:class:`~ragguard.BreakerOpen` while the
breaker rejects); a breaker whose half-open trial permits live elsewhere (the Redis-shared breaker,
an :class:`~ragguard.breakers.AsyncBreaker`) is asked for one with a round trip, and the attempt's
time starts after it. ``exit`` reports the outcome: success, or the error for the breaker's own
classifier to count or ignore; a cancellation, a :class:`~ragguard.DeadlineExceeded` (the caller's
budget, not the dependency) and an error an outer layer recovers (``Call.recoverable``) give the
permit back unrecorded.

The breaker is built once per stage (:func:`make_breaker`): the kind the stage's policy names,
or the one given to ``@guard(breaker=...)``, shared across replicas when the Guard has Redis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from .._clock import Clock
from .._errors import BreakerOpen, ConfigError, DeadlineExceeded
from ..breakers import (
    AsyncBreaker,
    Breaker,
    CircuitBreaker,
    EmbeddingTimeoutBreaker,
    RerankOOMBreaker,
    VectorStoreUnavailableBreaker,
)
from ..breakers._breaker import _CLOSED
from ..breakers._outcome import BreakerCallOutcome
from ..pipeline import WAIT, Call, Scope

if TYPE_CHECKING:
    from ._stage import Bound, Stage

__all__ = ["BREAKER_KINDS", "BreakerLayer", "adapt_breaker", "build", "make_breaker"]

BREAKER_KINDS: dict[str, type[CircuitBreaker]] = {
    "embedding_timeout": EmbeddingTimeoutBreaker,
    "vector_store_unavailable": VectorStoreUnavailableBreaker,
    "rerank_oom": RerankOOMBreaker,
    "generic": CircuitBreaker,
}


class BreakerLayer:
    """Drives ``breaker`` (any :class:`~ragguard.breakers.Breaker`) around each attempt.

    A ragguard :class:`~ragguard.breakers.CircuitBreaker` (with the stock ``acquire``,
    ``on_result`` and ``release``) is driven through its closed fast path directly: the permit of a
    closed breaker and a success its clean window takes in bulk (see ``ragguard.breakers._breaker``)
    cost no method call of the breaker's, the rest goes through the protocol as for any breaker.
    """

    scope: ClassVar[Scope] = "attempt"
    __slots__ = ("_asks_async", "_stock", "breaker", "clock")

    def __init__(self, breaker: Breaker, clock: Clock) -> None:
        self.breaker = breaker
        self.clock = clock
        self._asks_async = isinstance(breaker, AsyncBreaker)
        kind = type(breaker)
        self._stock: CircuitBreaker | None = (
            breaker
            if isinstance(breaker, CircuitBreaker)
            and kind.acquire is CircuitBreaker.acquire
            and kind.on_result is CircuitBreaker.on_result
            and kind.release is CircuitBreaker.release
            else None
        )

    def enter(self, call: Call) -> Any:
        stock = self._stock
        if stock is not None and stock._state is _CLOSED:
            token = stock._epoch  # acquire(), closed: its permit is the epoch
        else:
            try:
                token = self.breaker.acquire()
            except BreakerOpen as exc:
                # a shared breaker hands out half-open trial permits through Redis: ask it for
                # one rather than rejecting the first callers of the half-open state
                if self._asks_async and exc.state == "half_open":
                    return WAIT
                raise
        call.started = self.clock()
        return token

    async def enter_async(self, call: Call) -> Any:
        token = await self.breaker.acquire_async()  # type: ignore[attr-defined]
        call.started = self.clock()  # the round trip is not the dependency's time
        return token

    def exit(self, call: Call, token: Any, exc: BaseException | None) -> BaseException | None:
        breaker = self.breaker
        if exc is None:
            now = self.clock()
            duration = now - call.started
            stock = self._stock
            if (
                stock is not None
                and now < stock._oks_until
                and duration <= stock._slow_s
                and token == stock._epoch
            ):
                if stock.bus.active:  # on_result()'s fast success, inlined
                    stock.bus.emit(BreakerCallOutcome(stock.name, "success", duration))
                stock._oks += 1
            else:
                breaker.on_result(token, duration, None, now)
        elif not isinstance(exc, Exception) or isinstance(exc, DeadlineExceeded):
            breaker.release(token)
        else:
            recoverable = call.recoverable
            if recoverable is not None and recoverable(exc):
                breaker.release(token)
            else:
                now = self.clock()
                stock = self._stock
                if stock is not None:
                    stock._error(token, now - call.started, exc, now)  # on_result(), for an error
                else:
                    breaker.on_result(token, now - call.started, exc, now)
        return None


def adapt_breaker(breaker: object) -> Breaker:
    """``breaker`` as a :class:`~ragguard.breakers.Breaker`: itself when it is one, an adapter
    for an ``aiobreaker.CircuitBreaker``; else ConfigError."""
    if isinstance(breaker, Breaker):
        return breaker
    try:
        import aiobreaker
    except ImportError:  # pragma: no cover - aiobreaker is a dependency
        aiobreaker = None
    if aiobreaker is not None and isinstance(breaker, aiobreaker.CircuitBreaker):
        from ..breakers import from_aiobreaker

        return from_aiobreaker(breaker)
    raise ConfigError(
        "breaker must be a ragguard breaker (acquire, on_result, release, classifier) or an "
        f"aiobreaker.CircuitBreaker, got {type(breaker).__name__}"
    )


def make_breaker(stage: Stage, given: Breaker | Literal[False] | None) -> Breaker | None:
    """The stage's breaker: ``given`` (False: none), else the kind its policy names (None for
    ``none``), shared through Redis when the Guard has a client."""
    if given is False:
        return None
    if given is not None:
        return given
    kind = stage.policy.breaker.kind
    if kind == "none":
        return None
    cls = BREAKER_KINDS[kind]
    options = stage.policy.breaker.options()  # every kind counts StageTimeout (breakers/_typed.py)
    ctx = stage.context
    return ctx.share("breaker", cls(stage.name, clock=ctx.clock, rng=ctx.rng, **options))


def build(stage: Stage, bound: Bound) -> BreakerLayer | None:
    breaker = stage.breaker
    return None if breaker is None else BreakerLayer(breaker, stage.clock)
