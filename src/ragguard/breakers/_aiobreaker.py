"""aiobreaker interop for people migrating (aiobreaker 1.2 is never imported unless used).

* :class:`AiobreakerListenerAdapter` lets a ragguard breaker notify an
  ``aiobreaker.CircuitBreakerListener``: ``state_change(breaker, old, new)`` on every transition
  (``old``/``new`` are :class:`BreakerState` members, ``breaker`` the ragguard breaker),
  ``success(breaker)`` and ``failure(breaker, exc)`` on every recorded outcome. ``before_call``
  is not called. A hook that raises is logged and never reaches the call.
* :func:`from_aiobreaker` puts an existing ``aiobreaker.CircuitBreaker`` behind ragguard's
  ``acquire``/``on_result``/``release``/``call`` protocol, so ``@guard`` can drive it. Its
  semantics stay aiobreaker's (consecutive-failure count, every caller admitted while half-open,
  excluded errors reset the count like a success), except that the call that trips it raises its
  own error rather than ``CircuitBreakerError``, a rejection raises ragguard's ``error_class``
  with the true ``retry_after_s``, and its listeners' exceptions never reach the caller.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, ParamSpec, TypeVar

from .. import events
from .._errors import BreakerOpen, ConfigError
from ._live import register_breaker
from ._outcome import BreakerCallOutcome
from ._state import BreakerState

__all__ = ["AiobreakerBreaker", "AiobreakerListenerAdapter", "from_aiobreaker"]

log = logging.getLogger("ragguard.breakers")

P = ParamSpec("P")
T = TypeVar("T")


def _hook(listener: Any, hook: str, *args: Any) -> None:
    method = getattr(listener, hook, None)
    if method is None:
        return
    try:
        method(*args)
    except Exception:
        log.exception("aiobreaker listener %r raised in %s; ignored", listener, hook)


def _move(cb: Any, target: str) -> None:
    """Move aiobreaker's ``cb`` to state ``target`` ("OPEN", "HALF_OPEN", "CLOSED").

    The storage is written first, then aiobreaker's cached state is synced, which runs its
    listeners inline: one that raises is logged and cannot stop the transition (aiobreaker's own
    ``open()`` assigns the cached state first and loses the transition when a listener raises).
    """
    storage = cb._state_storage
    if target == "OPEN":
        storage.opened_at = _utcnow()
    elif target == "CLOSED":
        storage.reset_counter()
    storage.state = type(cb.current_state)[target]
    try:
        cb.state  # noqa: B018 (the getter syncs the cached state and notifies listeners)
    except Exception:
        log.exception("an aiobreaker listener of %r raised in state_change; ignored", cb.name)


class AiobreakerListenerAdapter:
    """An event listener that forwards a ragguard breaker's events to an aiobreaker listener."""

    __slots__ = ("breaker", "listener")

    def __init__(self, listener: Any, breaker: Any) -> None:
        if not callable(getattr(listener, "state_change", None)):
            raise ConfigError(f"listener must be an aiobreaker.CircuitBreakerListener, got {listener!r}")
        self.listener = listener
        self.breaker = breaker

    def __call__(self, event: Any) -> None:
        if isinstance(event, events.BreakerTransition):
            old, new = BreakerState(event.old), BreakerState(event.new)
            _hook(self.listener, "state_change", self.breaker, old, new)
        elif isinstance(event, events.CallOutcome):
            if event.outcome in ("success", "slow_success"):
                _hook(self.listener, "success", self.breaker)
            elif event.outcome in ("failure", "slow_failure"):
                exc = getattr(event, "exception", None)
                if exc is None:
                    exc = RuntimeError(event.error or "failure")
                _hook(self.listener, "failure", self.breaker, exc)


def _utcnow() -> datetime:
    # aiobreaker stores opened_at as a naive UTC datetime.
    return datetime.now(UTC).replace(tzinfo=None)


class AiobreakerBreaker:
    """An ``aiobreaker.CircuitBreaker`` behind ragguard's breaker protocol (see module docstring)."""

    __slots__ = ("__weakref__", "_cb", "_error_class", "bus", "clock", "name")

    def __init__(
        self,
        cb: Any,
        *,
        name: str | None = None,
        error_class: type[BreakerOpen] = BreakerOpen,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not (callable(getattr(cb, "call_async", None)) and hasattr(cb, "current_state")):
            raise ConfigError(f"cb must be an aiobreaker.CircuitBreaker, got {cb!r}")
        if not (isinstance(error_class, type) and issubclass(error_class, BreakerOpen)):
            raise ConfigError(f"error_class must be a subclass of ragguard.BreakerOpen, got {error_class!r}")
        self._cb = cb
        self.name = name or cb.name or "aiobreaker"
        self._error_class = error_class
        self.clock = clock
        self.bus = events.EventBus(parent=events.bus)
        register_breaker(self)

    @property
    def aiobreaker(self) -> Any:
        """The wrapped ``aiobreaker.CircuitBreaker``."""
        return self._cb

    @property
    def state(self) -> BreakerState:
        return BreakerState(self._cb.current_state.name.lower())

    def classifier(self, exc: BaseException) -> bool:
        """True when aiobreaker counts ``exc`` (its ``is_system_error``, i.e. not excluded)."""
        return isinstance(exc, Exception) and bool(self._cb.is_system_error(exc))

    def _left_s(self) -> float:
        cb = self._cb
        opened_at = cb._state_storage.opened_at
        if opened_at is None:
            return 0.0
        return float((opened_at + cb.timeout_duration - _utcnow()).total_seconds())

    def _transition(self, old: BreakerState, reason: str) -> None:
        new = self.state
        if new is not old and self.bus.active:
            self.bus.emit(events.BreakerTransition(self.name, old.value, new.value, self.clock(), reason))

    def acquire(self) -> int:
        """Admit a call (returns a token) or raise ``error_class`` while aiobreaker's timeout runs."""
        old = self.state
        if old is BreakerState.OPEN:
            left = self._left_s()
            if left > 0:
                if self.bus.active:
                    self.bus.emit(events.CallRejected(self.name, old.value, left))
                raise self._error_class(self.name, left, state=old.value)
            _move(self._cb, "HALF_OPEN")
            self._transition(old, "timeout elapsed")
        return 0

    def on_result(
        self, token: int, duration_s: float, exc: BaseException | None, now: float | None = None
    ) -> None:
        """Record a call's outcome the way aiobreaker's own ``call_async`` would."""
        if exc is not None and not isinstance(exc, Exception):
            return
        cb = self._cb
        old = self.state
        if exc is None or not cb.is_system_error(exc):
            cb._state_storage.reset_counter()
            for listener in cb.listeners:
                _hook(listener, "success", cb)
            if old is BreakerState.HALF_OPEN:
                _move(cb, "CLOSED")
            outcome = "success" if exc is None else "ignored"
        else:
            cb._state_storage.increment_counter()
            for listener in cb.listeners:
                _hook(listener, "failure", cb, exc)
            if old is BreakerState.HALF_OPEN or (
                old is BreakerState.CLOSED and cb.fail_counter >= cb.fail_max
            ):
                _move(cb, "OPEN")
            outcome = "failure"
        if self.bus.active:
            error = None if exc is None else type(exc).__name__
            self.bus.emit(BreakerCallOutcome(self.name, outcome, duration_s, error, exc))
        self._transition(old, outcome)

    def release(self, token: int) -> None:
        """Nothing to give back: aiobreaker does not count admitted calls."""

    async def call(self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``await fn(*args, **kwargs)`` through the wrapped breaker."""
        token = self.acquire()
        clock = self.clock
        start = clock()
        try:
            result = await fn(*args, **kwargs)
        except Exception as exc:
            self.on_result(token, clock() - start, exc)
            raise
        self.on_result(token, clock() - start, None)
        return result


def from_aiobreaker(
    cb: Any, *, name: str | None = None, error_class: type[BreakerOpen] = BreakerOpen
) -> AiobreakerBreaker:
    """Wrap the ``aiobreaker.CircuitBreaker`` ``cb`` for ``@guard`` (see :class:`AiobreakerBreaker`)."""
    return AiobreakerBreaker(cb, name=name, error_class=error_class)
