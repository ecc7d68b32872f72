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

from pydantic import PrivateAttr, field_validator

from .._clock import Clock
from .._errors import BreakerOpen, ConfigError, DeadlineExceeded
from .._options import Options
from ..breakers import (
    AsyncBreaker,
    Breaker,
    CircuitBreaker,
    EmbeddingTimeoutBreaker,
    RerankOOMBreaker,
    VectorStoreUnavailableBreaker,
)
from ..breakers._options import NUMBER_OPTIONS, BreakerConfig, check_option
from ..pipeline import WAIT, Call, Scope

if TYPE_CHECKING:
    from ._stage import Bound, Stage

__all__ = ["BREAKER_KINDS", "BreakerLayer", "BreakerPolicy", "adapt_breaker", "build", "make_breaker"]

BreakerKind = Literal["embedding_timeout", "vector_store_unavailable", "rerank_oom", "generic", "none"]


class BreakerPolicy(Options):
    """Which breaker guards a stage and its options; None keeps the kind's default.

    Names after resilience4j's (``open_for_s`` is its ``waitDurationInOpenState``); each option
    has the range :class:`ragguard.breakers.BreakerConfig` gives it; the rules between options
    (``minimum_calls`` <= ``window_size`` of a count window, a time window of at most a day,
    ``open_max_s`` >= ``open_for_s``) are checked with the kind's defaults filled in when the
    :class:`Policy` is built, once: the stage's breaker is built from that config (:meth:`config`).

    - ``kind``: ``embedding_timeout``, ``vector_store_unavailable``, ``rerank_oom`` (the typed
      breakers, each with its defaults and its error), ``generic`` (counts every error but a
      caller's) or ``none`` (no breaker).
    - ``failure_rate_threshold``: trip when at least this percentage of the window's calls failed.
    - ``slow_call_rate_threshold``: trip when at least this percentage of the calls were slow.
    - ``slow_call_duration_s``: a call lasting longer is slow (seconds).
    - ``consecutive_failures_threshold``: trip after this many failures in a row (None: off).
    - ``rejection_rate_threshold``: trip when at least this percentage of the window's calls were
      turned away by the dependency with a wait that is not a rate limit (a 503 stating a wait,
      529, an overload event inside a stream; never a 429: that only throttles). Default 90 for
      every kind: rejections that persist are an outage. The failure and slow-call rates are of
      the other calls.
    - ``minimum_calls``: no rule trips before the window holds this many calls.
    - ``window_type``: ``count`` (the last ``window_size`` calls) or ``time`` (the calls of the
      last ``window_size`` seconds).
    - ``window_size``: calls (count window) or seconds (time window).
    - ``half_open_permits``: trial calls admitted while half-open; their rates decide.
    - ``open_for_s``: how long the breaker stays open after a trip (seconds).
    - ``open_backoff_multiplier``: each reopening from half-open multiplies the open time by this.
    - ``open_max_s``: the open time's cap (seconds; None: a year).
    - ``open_jitter``: each open time is spread uniformly by up to this fraction either way.
    """

    kind: BreakerKind = "generic"
    failure_rate_threshold: float | None = None
    slow_call_rate_threshold: float | None = None
    slow_call_duration_s: float | None = None
    consecutive_failures_threshold: int | None = None
    rejection_rate_threshold: float | None = None
    minimum_calls: int | None = None
    window_type: Literal["count", "time"] | None = None
    window_size: int | None = None
    half_open_permits: int | None = None
    open_for_s: float | None = None
    open_backoff_multiplier: float | None = None
    open_max_s: float | None = None
    open_jitter: float | None = None
    _config: tuple[int, BreakerConfig | None] | None = PrivateAttr(default=None)

    @field_validator(*NUMBER_OPTIONS)
    @classmethod
    def _in_range(cls, value: Any, info: Any) -> Any:
        return None if value is None else check_option(info.field_name, value)

    def __eq__(self, other: object) -> bool:  # the config built from it is no part of it
        if not isinstance(other, BreakerPolicy):
            return NotImplemented
        return type(self) is type(other) and self.__dict__ == other.__dict__

    def __hash__(self) -> int:
        return hash((type(self), *self.__dict__.values()))

    def options(self) -> dict[str, Any]:
        """The options that were set, as keyword arguments for the breaker's constructor."""
        return {k: v for k, v in self.model_dump(exclude={"kind"}).items() if v is not None}

    def config(self) -> BreakerConfig | None:
        """The options the stage's breaker gets (the kind's defaults, then the options set),
        validated by the breaker's own rules, once: the breaker is built from this very object
        (``CircuitBreaker(name, config=...)``). None for kind ``none``. Raises ConfigError whose
        ``field`` names the option."""
        made = self._config
        if made is not None and made[0] == id(self):  # a model_copy carries a stale one
            return made[1]
        config = None if self.kind == "none" else self._validated()
        self._config = (id(self), config)
        return config

    def _validated(self) -> BreakerConfig:
        options = self.options()
        try:
            return BreakerConfig.of(**{**BREAKER_KINDS[self.kind].defaults, **options})
        except ConfigError as exc:
            if exc.field is None or exc.field in options:
                raise
            # the value refused is a default the user never wrote: say so
            raise ConfigError(f"{exc} (the {self.kind} breaker's default)", field=exc.field) from None


BREAKER_KINDS: dict[str, type[CircuitBreaker]] = {
    "embedding_timeout": EmbeddingTimeoutBreaker,
    "vector_store_unavailable": VectorStoreUnavailableBreaker,
    "rerank_oom": RerankOOMBreaker,
    "generic": CircuitBreaker,
}


class BreakerLayer:
    """Drives ``breaker`` (any :class:`~ragguard.breakers.Breaker`) around each attempt.

    Only through its protocol: a ragguard :class:`~ragguard.breakers.CircuitBreaker` keeps its own
    fast paths (a closed breaker's permit, a success its clean window takes in bulk) inside
    ``acquire`` and ``on_result``.
    """

    scope: ClassVar[Scope] = "attempt"
    __slots__ = ("_asks_async", "breaker", "clock")

    def __init__(self, breaker: Breaker, clock: Clock) -> None:
        self.breaker = breaker
        self.clock = clock
        self._asks_async = isinstance(breaker, AsyncBreaker)

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
    policy = stage.policy.breaker
    config = policy.config()  # validated when the policy was built: not again
    if config is None:
        return None
    ctx = stage.context
    # every kind counts StageTimeout (breakers/_typed.py)
    local = BREAKER_KINDS[policy.kind](stage.name, clock=ctx.clock, rng=ctx.rng, config=config)
    return ctx.share("breaker", local)


def build(stage: Stage, bound: Bound) -> BreakerLayer | None:
    breaker = stage.breaker
    return None if breaker is None else BreakerLayer(breaker, stage.clock)
