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

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from .._clock import Clock
from .._errors import BreakerOpen, ConfigError, DeadlineExceeded
from ..breakers import AsyncBreaker, Breaker, CircuitBreaker, from_aiobreaker
from ..options._breaker import BREAKER_KINDS
from ..pipeline import WAIT, Call, Scope

if TYPE_CHECKING:
    from ._shapes import Bound, Stage

__all__ = ["BreakerLayer", "adapt_breaker", "build", "make_breaker"]


class BreakerLayer:
    """Drives ``breaker`` (any :class:`~ragguard.breakers.Breaker`) around each attempt.

    Only through its protocol: a ragguard :class:`~ragguard.breakers.CircuitBreaker` keeps its own
    fast paths (a closed breaker's permit, a success its clean window takes in bulk) inside
    ``acquire`` and ``on_result``.
    """

    scope: ClassVar[Scope] = "attempt"
    __slots__ = ("_asks_async", "_failed", "breaker", "clock")

    def __init__(self, breaker: Breaker, clock: Clock) -> None:
        self.breaker = breaker
        self.clock = clock
        self._asks_async = isinstance(breaker, AsyncBreaker)
        # a ragguard CircuitBreaker's record of a failed attempt, what its ``on_result`` does with
        # an ``Exception`` (one frame less on the failure path); None for any other breaker
        self._failed: Callable[[int, float, Exception, float], None] | None = (
            breaker._error
            if isinstance(breaker, CircuitBreaker) and type(breaker).on_result is CircuitBreaker.on_result
            else None
        )

    def enter(self, call: Call) -> Any:
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
            breaker.on_result(token, now - call.started, None, now)
        elif not isinstance(exc, Exception) or isinstance(exc, DeadlineExceeded):
            breaker.release(token)
        else:
            recoverable = call.recoverable
            if recoverable is not None and recoverable(exc):
                breaker.release(token)
            else:
                now = self.clock()
                failed = self._failed
                if failed is not None:
                    failed(token, now - call.started, exc, now)
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
        return from_aiobreaker(breaker)
    raise ConfigError(
        "breaker must be a ragguard breaker (acquire, on_result, release, classifier) or an "
        f"aiobreaker.CircuitBreaker, got {type(breaker).__name__}"
    )


def make_breaker(stage: Stage, given: Breaker | Literal[False] | None) -> Breaker | None:
    """The stage's breaker: ``given`` (False: none), else the kind its policy names (None for
    ``none``), named by the stage's label (``stage``, or ``stage[key]`` for a key's), shared
    through Redis when the Guard has a client."""
    if given is False:
        return None
    if given is not None:
        return given
    policy = stage.policy.breaker
    config = policy.config()  # validated when the policy was built: not again
    if config is None:
        return None
    ctx = stage.context
    # every kind counts StageTimeout (breakers/_typed.py)
    local = BREAKER_KINDS[policy.kind](stage.label, clock=ctx.clock, rng=ctx.rng, config=config)
    return ctx.share("breaker", local)


def build(stage: Stage, bound: Bound) -> BreakerLayer | None:
    breaker = stage.breaker
    return None if breaker is None else BreakerLayer(breaker, stage.clock)
