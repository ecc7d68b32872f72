"""The circuit breaker state machine, after resilience4j's CircuitBreaker and Polly v8's.

::

    CLOSED --(failure rate, slow-call rate, rejection rate or consecutive failures over
              threshold, once the window holds minimum_calls)--> OPEN
    OPEN --(open duration elapsed; checked lazily on the next acquire)--> HALF_OPEN
    HALF_OPEN --(all half_open_permits trials done, rates under threshold)--> CLOSED
    HALF_OPEN --(all trials done, a rate at or over threshold)--> OPEN (open duration grows)
    any --force_open()--> FORCED_OPEN,  any --disable()--> DISABLED,  any --reset()--> CLOSED

Concurrency: the breaker is used from one event loop thread. Every state change is synchronous
code between two awaits, so it is atomic under asyncio and trio without a lock.

Tokens: :meth:`CircuitBreaker.acquire` returns the breaker's epoch, a counter bumped on every
state change. A result whose token is not the current epoch (the call started before a trip,
a reset, or in an earlier half-open round) is reported as an event but changes nothing.

Fast successes: while the breaker is closed and its window holds no failure and no slow call, a
success can trip nothing; it is counted (``_oks``) and added to the window in bulk the next time
the window is written or read (:meth:`CircuitBreaker._record`, :meth:`CircuitBreaker.metrics`).
``_oks_until`` is the clock time before which that holds (-inf otherwise: not closed, a dirty
window), so the test is one comparison. The breaker layer (``ragguard.layers._breaker``) takes the
same fast path through ``acquire`` and ``on_result``.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, fields
from typing import Any, ClassVar, ParamSpec, TypeVar, Unpack

from .. import _validate, events
from .._errors import BreakerOpen, ConfigError
from ..outcomes import Kind, Outcome, outcome_of
from ..outcomes._classify import RECORDED
from ._aiobreaker import AiobreakerListenerAdapter
from ._classify import is_timeout, judge, kinds_counted
from ._live import register_breaker
from ._options import MAX_DURATION_S, BreakerConfig, BreakerOptions, Classifier
from ._outcome import OUTCOMES, BreakerCallOutcome
from ._state import BreakerState
from ._window import FAILED, REJECTED, SLOW, CountWindow, TimeWindow

_new_exception = BaseException.__new__

__all__ = ["BreakerCallOutcome", "BreakerMetrics", "CircuitBreaker", "Classifier"]

log = logging.getLogger("ragguard.breakers")

P = ParamSpec("P")
T = TypeVar("T")

_CLOSED = BreakerState.CLOSED
_OPEN = BreakerState.OPEN
_HALF_OPEN = BreakerState.HALF_OPEN
_TIMEOUT, _REJECTION = Kind.TIMEOUT, Kind.REJECTION
_FORCED_OPEN = BreakerState.FORCED_OPEN
_DISABLED = BreakerState.DISABLED


@dataclass(frozen=True, slots=True)
class BreakerMetrics:
    """A snapshot of a breaker's window, read with :meth:`CircuitBreaker.metrics`.

    Rates are percentages in [0, 100], or -1.0 while the window holds fewer than
    ``minimum_calls`` calls (as resilience4j reports them): the failure and slow-call rates of
    the calls the dependency did not turn away (``calls - rejected_calls``; 0.0 when there are
    none), the rejection rate of all the calls. ``retry_after_s`` is the time left open in seconds
    (None unless open).
    """

    state: BreakerState
    calls: int
    failed_calls: int
    slow_calls: int
    failure_rate: float
    slow_call_rate: float
    consecutive_failures: int
    trial_permits_left: int
    trial_calls_done: int
    retry_after_s: float | None
    rejected_calls: int = 0
    rejection_rate: float = -1.0


_DEFAULT_OPTIONS: dict[str, Any] = {
    **{f.name: f.default for f in fields(BreakerConfig)},
    "classifier": None,
}
"""The option keywords of :class:`CircuitBreaker` as their defaults (a keyword given with its
default beside ``config=`` is no conflict)."""


class CircuitBreaker:
    """A circuit breaker with sliding-window failure and slow-call rates.

    Options (keyword-only): the fields of :class:`BreakerConfig`, which gives each one's default,
    units, range and meaning (resilience4j's names in snake_case with units:
    ``failure_rate_threshold``, ``slow_call_rate_threshold`` and ``slow_call_duration_s``,
    ``consecutive_failures_threshold``, ``rejection_rate_threshold``, ``minimum_calls``,
    ``window_type`` and ``window_size``, ``half_open_permits``, ``open_for_s`` with
    ``open_backoff_multiplier``, ``open_max_s`` and ``open_jitter``), and ``classifier`` (``exc ->
    bool``, default :func:`counts_by_default`: True when an error counts as a failure; other errors
    pass through uncounted and give a half-open permit back), ``slow_classifier`` (``exc -> bool``
    or None: errors that count as slow whatever their duration; the embedding breaker passes
    ``is_timeout``) and ``error_class`` (a :class:`ragguard.BreakerOpen` subclass): raised on
    rejection, with ``retry_after_s`` the true time left open (0.0 while half-open with every
    permit taken, None while forced open).

    Or ``config`` (a :class:`BreakerConfig`, e.g. ``BreakerPolicy.config()`` of a stage's policy):
    the options validated already, used as they are (then no option keyword may be given).

    Not options of its behaviour: ``rng`` (a ``random.Random`` for the open-duration jitter; seed
    it in tests) and ``clock`` (a callable returning monotonic seconds, default ``time.monotonic``).

    Cancellation (``asyncio.CancelledError``, trio's ``Cancelled``, any ``BaseException``) is
    never recorded: the call's half-open permit is given back and the cancellation re-raised.

    The options are validated once into a frozen :class:`BreakerConfig` (or given as one),
    read-only as :attr:`config`. Raises :class:`ragguard.ConfigError` naming the option (its ``field``) when a
    value is out of range.
    """

    defaults: ClassVar[dict[str, Any]] = {}
    """The defaults of this kind of breaker that differ from :class:`BreakerConfig`'s."""

    __slots__ = (
        "__weakref__",
        "_classifier",
        "_config",
        "_consecutive",
        "_consecutive_threshold",
        "_counted_kinds",
        "_epoch",
        "_error_class",
        "_failure_threshold",
        "_jitter",
        "_min_calls",
        "_multiplier",
        "_new_error",
        "_oks",
        "_oks_until",
        "_open_base_s",
        "_open_for_s",
        "_open_max_s",
        "_open_until",
        "_permits",
        "_permits_total",
        "_rejection_threshold",
        "_rng",
        "_slow_classifier",
        "_slow_s",
        "_slow_threshold",
        "_slow_timeouts",
        "_state",
        "_trial_calls",
        "_trial_failures",
        "_trial_rejected",
        "_trial_slow",
        "_window",
        "bus",
        "clock",
        "name",
        "window_size",
        "window_type",
    )

    def __init__(self, name: str, **options: Unpack[BreakerOptions]) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"name must be a non-empty str, got {_validate.shown(name)}", field="name")
        self.name = name
        rng = options.pop("rng", None)
        clock = options.pop("clock", time.monotonic)
        config = options.pop("config", None)
        if config is None:
            config = BreakerConfig.of(**options)
        elif not isinstance(config, BreakerConfig):
            got = _validate.shown(config)
            raise ConfigError(f"config must be a ragguard.breakers.BreakerConfig, got {got}", field="config")
        else:
            given = sorted(k for k, value in options.items() if _DEFAULT_OPTIONS.get(k, config) != value)
            if given:
                raise ConfigError(
                    f"give config= or the option keywords, not both (also given: {', '.join(given)})",
                    field="config",
                )
        if rng is not None and not callable(getattr(rng, "random", None)):
            raise ConfigError(f"rng must be a random.Random, got {_validate.shown(rng)}", field="rng")
        _validate.function("clock", clock, "returning monotonic seconds")
        self._config = config
        # The hot path reads these copies of the config's values (a slot read is cheaper than a
        # read through the frozen config).
        self._failure_threshold = config.failure_rate_threshold
        self._slow_threshold = config.slow_call_rate_threshold
        self._slow_s = config.slow_call_duration_s
        self._consecutive_threshold = config.consecutive_failures_threshold
        self._rejection_threshold = config.rejection_rate_threshold
        self._min_calls = config.minimum_calls
        self.window_type = config.window_type
        self.window_size = config.window_size
        window = CountWindow if config.window_type == "count" else TimeWindow
        self._window: CountWindow | TimeWindow = window(config.window_size)
        self._permits_total = config.half_open_permits
        self._open_for_s = config.open_for_s
        self._multiplier = config.open_backoff_multiplier
        self._open_max_s = math.inf if config.open_max_s is None else config.open_max_s
        self._jitter = config.open_jitter
        self._rng = rng if rng is not None else random.Random()
        self._classifier: Classifier = config.classifier
        self._slow_classifier = config.slow_classifier
        # ragguard's own classifiers, read off the error's recorded outcome inline (_error): the
        # kinds counted as failures (None: a classifier of the user's, called), and whether the
        # slow classifier is ``is_timeout`` (None: none)
        counted = kinds_counted(config.classifier)
        slow_of = config.slow_classifier
        self._counted_kinds = counted if slow_of is None or slow_of is is_timeout else None
        self._slow_timeouts = slow_of is is_timeout
        self.clock = clock
        self._error_class = config.error_class
        # A rejection while open skips a Python __init__ for the classes that keep BreakerOpen's
        # (their fields are read from ``args``): a quarter of a microsecond of its cost.
        self._new_error: Callable[..., BreakerOpen] = (
            _new_exception if config.error_class.__init__ is BreakerOpen.__init__ else _construct
        )
        self.bus = events.EventBus(parent=events.bus)

        self._state = _CLOSED
        self._epoch = 0
        self._consecutive = 0
        self._open_until = 0.0
        self._open_base_s = 0.0
        self._permits = 0
        self._trial_calls = self._trial_failures = self._trial_slow = self._trial_rejected = 0
        self._oks = 0
        self._oks_until = self._window.clean_until()
        register_breaker(self)

    # -- reading ---------------------------------------------------------------------------

    @property
    def state(self) -> BreakerState:
        """The current state. An open breaker whose time is up still reads OPEN until the next
        :meth:`acquire` half-opens it (resilience4j's default, no timer task)."""
        return self._state

    @property
    def config(self) -> BreakerConfig:
        """The breaker's validated options (frozen; build a new breaker to change them)."""
        return self._config

    @property
    def rng(self) -> random.Random:
        """The random source of the open-duration jitter."""
        return self._rng

    @property
    def classifier(self) -> Classifier:
        """The failure classifier: ``classifier(exc)`` is True when ``exc`` counts as a failure."""
        return self._classifier

    @property
    def retry_after_s(self) -> float | None:
        """Seconds left open (>= 0) while open; None in any other state."""
        if self._state is not _OPEN:
            return None
        return max(0.0, self._open_until - self.clock())

    def metrics(self) -> BreakerMetrics:
        """A :class:`BreakerMetrics` snapshot at the current clock time."""
        window = self._window
        if self._oks:
            window.add_successes(self._oks)
            self._oks = 0
        window.expire(self.clock())
        calls = window.calls
        served = calls - window.rejected
        enough = calls >= self._min_calls
        half_open = self._state is _HALF_OPEN
        return BreakerMetrics(
            state=self._state,
            calls=calls,
            failed_calls=window.failures,
            slow_calls=window.slow,
            failure_rate=(window.failures * 100.0 / served if served else 0.0) if enough else -1.0,
            slow_call_rate=(window.slow * 100.0 / served if served else 0.0) if enough else -1.0,
            consecutive_failures=self._consecutive,
            trial_permits_left=self._permits if half_open else 0,
            trial_calls_done=self._trial_calls if half_open else 0,
            retry_after_s=self.retry_after_s,
            rejected_calls=window.rejected,
            rejection_rate=window.rejected * 100.0 / calls if enough else -1.0,
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} {self._state.value}>"

    # -- operators -------------------------------------------------------------------------

    def force_open(self) -> None:
        """Hold the breaker open: every call is rejected (``retry_after_s`` None) until :meth:`reset`."""
        self._to(_FORCED_OPEN, self.clock(), "forced open")

    def disable(self) -> None:
        """Switch the breaker off: every call runs, nothing is recorded, until :meth:`reset`."""
        self._to(_DISABLED, self.clock(), "disabled")

    def reset(self) -> None:
        """Close the breaker with an empty window and the open duration back at ``open_for_s``."""
        self._to(_CLOSED, self.clock(), "reset")

    def add_listener(self, listener: Any) -> Callable[[], None]:
        """Subscribe ``listener`` to this breaker's events; returns an unsubscribe function.

        ``listener`` is a callable taking one event (BreakerTransition, CallOutcome,
        CallRejected), or an ``aiobreaker.CircuitBreakerListener`` (wrapped in an
        :class:`AiobreakerListenerAdapter`). Events are delivered after the call has moved on;
        a listener that raises is logged and kept.
        """
        if not callable(listener) and callable(getattr(listener, "state_change", None)):
            listener = AiobreakerListenerAdapter(listener, self)
        return self.bus.subscribe(listener)

    # -- the low-level protocol used by @guard ---------------------------------------------

    def acquire(self) -> int:
        """Ask to run one call; returns a token for :meth:`on_result` or :meth:`release`.

        Raises ``error_class`` (a :class:`ragguard.BreakerOpen`) when open, forced open, or
        half-open with every trial permit taken. Every token must be handed back exactly once.
        """
        state = self._state
        if state is _CLOSED:
            return self._epoch
        now = self.clock()
        if state is _OPEN and now < self._open_until:
            left = self._open_until - now
            if self.bus.active:
                self.bus.emit(events.CallRejected(self.name, "open", left))
            raise self._new_error(self._error_class, self.name, left)
        return self._admit(now)

    def on_result(
        self, token: int, duration_s: float, exc: BaseException | None, now: float | None = None
    ) -> None:
        """Record the end of a call admitted with ``token``.

        ``duration_s``: how long the call ran, in seconds. ``exc``: the ``Exception`` it raised,
        or None on success (pass cancellations to :meth:`release` instead). ``now``: the clock
        time the call ended, when the caller already read it (else the clock is read).
        """
        if now is None:
            now = self.clock()
        if exc is None:
            if now < self._oks_until and duration_s <= self._slow_s and token == self._epoch:
                if self.bus.active:  # a fast success (see the module docstring)
                    self.bus.emit(BreakerCallOutcome(self.name, "success", duration_s))
                self._oks += 1
                return
            self._success(token, duration_s, now)
        elif isinstance(exc, Exception):
            self._error(token, duration_s, exc, now)
        else:
            self.release(token)

    def release(self, token: int) -> None:
        """Give back ``token`` without recording an outcome (the call was cancelled or never ran)."""
        if token == self._epoch and self._state is _HALF_OPEN:
            self._permits += 1

    # -- calling ---------------------------------------------------------------------------

    async def call(self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``await fn(*args, **kwargs)`` through the breaker and return its result.

        Raises ``error_class`` without calling ``fn`` when the breaker rejects the call;
        otherwise whatever ``fn`` raises, unchanged (the call that trips the breaker still
        raises its own error).
        """
        clock = self.clock
        start = clock()
        if start < (until := self._open_until) and self._state is _OPEN:
            # Inlined rejection: one frame less in the traceback keeps it under a microsecond.
            if self.bus.active:
                self.bus.emit(events.CallRejected(self.name, "open", until - start))
            raise self._new_error(self._error_class, self.name, until - start)
        state = self._state
        if state is _CLOSED:
            token = self._epoch
        elif state is _DISABLED:
            return await fn(*args, **kwargs)
        else:
            token = self._admit(start)
        try:
            result = await fn(*args, **kwargs)
        except Exception as exc:
            now = clock()
            self._error(token, now - start, exc, now)
            raise
        except BaseException:
            self.release(token)
            if self.bus.active:
                self.bus.emit(BreakerCallOutcome(self.name, "cancelled", clock() - start))
            raise
        now = clock()
        duration = now - start
        if now < self._oks_until and duration <= self._slow_s and token == self._epoch:
            if self.bus.active:  # a fast success (see the module docstring)
                self.bus.emit(BreakerCallOutcome(self.name, "success", duration))
            self._oks += 1
        else:
            self._success(token, duration, now)
        return result

    def __call__(self, fn: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
        """Use the breaker as a decorator of an ``async def`` function."""
        if not inspect.iscoroutinefunction(fn):
            raise ConfigError(f"@{type(self).__name__} decorates async def functions, got {fn!r}")

        @functools.wraps(fn)
        async def guarded(*args: P.args, **kwargs: P.kwargs) -> T:
            return await self.call(fn, *args, **kwargs)

        return guarded

    # -- the state machine -----------------------------------------------------------------

    def _admit(self, now: float) -> int:
        state = self._state
        if state is _OPEN:
            if now < self._open_until:
                self._reject(state, self._open_until - now)
            self._to(_HALF_OPEN, now, "open duration elapsed")
            state = _HALF_OPEN
        if state is _HALF_OPEN:
            if self._permits > 0:
                self._permits -= 1
                return self._epoch
            self._reject(state, 0.0)
        if state is _FORCED_OPEN:
            self._reject(state, None)
        return self._epoch  # closed or disabled

    def _reject(self, state: BreakerState, retry_after_s: float | None) -> None:
        if self.bus.active:
            self.bus.emit(events.CallRejected(self.name, state.value, retry_after_s))
        raise self._error_class(self.name, retry_after_s, state=state.value)

    def _success(self, token: int, duration_s: float, now: float) -> None:
        code = SLOW if duration_s > self._slow_s else 0
        current = token == self._epoch
        state = self._state
        if current and state is _DISABLED:
            return
        if self.bus.active:  # the outcome goes out before any transition it causes
            self.bus.emit(BreakerCallOutcome(self.name, OUTCOMES[code], duration_s))
        if not current:
            return
        if state is _CLOSED:
            window = self._record(code, now)
            self._consecutive = 0
            calls = window.calls
            if calls < self._min_calls:
                return
            served = calls - window.rejected
            if (
                window.failures * 100.0 >= self._failure_threshold * served
                or window.slow * 100.0 >= self._slow_threshold * served
                or window.rejected  # the window just reached minimum_calls, or a rate moved
            ):
                self._check(now)
        elif state is _HALF_OPEN:
            self._trial(code, now)

    def _error(self, token: int, duration_s: float, exc: Exception, now: float) -> None:
        current = token == self._epoch
        state = self._state
        if current and state is _DISABLED:
            return
        # classify_outcome(self._config, exc, duration_s), inlined: it runs
        # once per failed attempt, and a dependency that is down fails every attempt
        kinds = self._counted_kinds
        if kinds is not None:  # ragguard's own classifiers: judge() and is_timeout, inlined
            said = getattr(exc, RECORDED, None)
            if type(said) is not Outcome:
                said = outcome_of(exc)
            kind = said.kind
            if kind in kinds:
                slow = duration_s > self._slow_s or (self._slow_timeouts and kind is _TIMEOUT)
                code = FAILED | SLOW if slow else FAILED
            elif self._rejection_threshold is not None and kind is _REJECTION and said.status != 429:
                code = REJECTED
            else:
                code = -1
        else:
            code = self._judged(exc, duration_s)
        if self.bus.active:
            outcome = OUTCOMES[code] if code >= 0 else "ignored"
            self.bus.emit(BreakerCallOutcome(self.name, outcome, duration_s, type(exc).__name__, exc))
        if not current:
            return
        if code < 0:
            if state is _HALF_OPEN:
                self._permits += 1
        elif state is _CLOSED:
            window = self._window  # _record(code, now), inlined
            if self._oks:
                window.add_successes(self._oks)
                self._oks = 0
            window.record(code, now)
            self._oks_until = -math.inf  # a window holding a failure takes no success in bulk
            if code != REJECTED:
                self._consecutive += 1
            if window.calls >= self._min_calls:
                self._check(now)
        elif state is _HALF_OPEN:
            self._trial(code, now)

    def _judged(self, exc: Exception, duration_s: float) -> int:
        """The window code of ``exc`` as the breaker's classifiers judge it (-1: not counted)."""
        try:
            counted, rejected = judge(self._classifier, exc, self._rejection_threshold is not None)
            if not counted:
                return REJECTED if rejected else -1  # or IGNORED
            slow_of = self._slow_classifier
            slow = duration_s > self._slow_s or (slow_of is not None and bool(slow_of(exc)))
            return FAILED | SLOW if slow else FAILED
        except Exception:  # a broken classifier never trips a breaker (as classify_outcome)
            log.exception("classifier of breaker %r raised on %r; the error is not counted", self.name, exc)
            return -1

    def _record(self, code: int, now: float) -> CountWindow | TimeWindow:
        """Record one outcome in the closed window, after the fast successes counted before it."""
        window = self._window
        if self._oks:
            window.add_successes(self._oks)
            self._oks = 0
        window.record(code, now)
        self._oks_until = window.clean_until() if code == 0 else -math.inf
        return window

    def _check(self, now: float) -> None:
        window = self._window
        calls = window.calls
        if calls < self._min_calls:
            return
        rejected = window.rejected
        served = calls - rejected  # the rates of failures and slow calls are of these
        if served and window.failures * 100.0 >= self._failure_threshold * served:
            reason = f"failure rate {window.failures * 100.0 / served:.1f}% >= {self._failure_threshold}%"
        elif served and window.slow * 100.0 >= self._slow_threshold * served:
            reason = f"slow-call rate {window.slow * 100.0 / served:.1f}% >= {self._slow_threshold}%"
        elif self._consecutive_threshold is not None and self._consecutive >= self._consecutive_threshold:
            reason = f"{self._consecutive} consecutive failures"
        elif rejected and (threshold := self._rejection_threshold) is not None and (
            rejected * 100.0 >= threshold * calls
        ):
            reason = f"rejection rate {rejected * 100.0 / calls:.1f}% >= {threshold}%"
        else:
            return
        self._to(_OPEN, now, reason)

    def _trial(self, code: int, now: float) -> None:
        self._trial_calls += 1
        self._trial_failures += code & FAILED
        self._trial_slow += (code >> 1) & 1
        self._trial_rejected += code >> 2
        done = self._trial_calls
        if done < self._permits_total:
            return
        failed, slow, rejected = self._trial_failures, self._trial_slow, self._trial_rejected
        served = done - rejected
        threshold = self._rejection_threshold
        if served and failed * 100.0 >= self._failure_threshold * served:
            self._to(_OPEN, now, f"{failed} of {done} trial calls failed")
        elif served and slow * 100.0 >= self._slow_threshold * served:
            self._to(_OPEN, now, f"{slow} of {done} trial calls were slow")
        elif rejected and threshold is not None and rejected * 100.0 >= threshold * done:
            self._to(_OPEN, now, f"{rejected} of {done} trial calls were turned away")
        else:
            self._to(_CLOSED, now, f"{done} trial calls passed")

    def _open_duration(self) -> float:
        if self._open_base_s == 0.0:
            base = min(self._open_for_s, self._open_max_s)
        else:  # never past a year, so repeated reopenings cannot overflow the open-until time
            base = min(self._open_base_s * self._multiplier, self._open_max_s, MAX_DURATION_S)
        self._open_base_s = base
        if self._jitter:
            spread = self._jitter * (2.0 * self._rng.random() - 1.0)
            return min(base * (1.0 + spread), self._open_max_s)
        return base

    def _to(self, new: BreakerState, now: float, reason: str) -> None:
        old = self._state
        self._state = new
        self._epoch += 1
        self._oks_until = -math.inf  # fast successes only while closed (set again below)
        if new is _OPEN:
            if old is not _HALF_OPEN:
                self._open_base_s = 0.0
            self._open_until = now + self._open_duration()
        elif new is _HALF_OPEN:
            self._permits = self._permits_total
            self._trial_calls = self._trial_failures = self._trial_slow = self._trial_rejected = 0
        elif new is _CLOSED:
            window = self._window
            window.clear()
            self._oks = 0
            self._oks_until = window.clean_until()
            self._consecutive = 0
            self._open_base_s = 0.0
        if self.bus.active:
            self.bus.emit(events.BreakerTransition(self.name, old.value, new.value, now, reason))


def _construct(cls: type[BreakerOpen], breaker: str, retry_after_s: float | None) -> BreakerOpen:
    """A rejection of an ``error_class`` with its own ``__init__``: built by calling it."""
    return cls(breaker, retry_after_s)
