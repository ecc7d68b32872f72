"""Request deadlines that only shrink as a request moves through the pipeline.

A deadline is a point in time on a clock, held in a context variable, so it follows the request
into child tasks. ``deadline(s)`` nests: the inner one can shorten the budget, never extend it.
Guarded stages read :func:`remaining` and give each attempt ``min(stage timeout, remaining)``; the
block itself is not interrupted by ``deadline`` (only guarded calls inside it are bounded), which
matches how gRPC deadlines propagate.

The clock is the Guard's (see :mod:`ragguard._clock`): ``deadline(s)`` uses the default registry's
clock, :meth:`ragguard.Guard.deadline` and :meth:`ragguard.Guard.tenant` their Guard's, so a
:class:`~ragguard.FakeClock` given to ``configure(clock=...)`` or ``Guard(clock=...)`` drives
deadlines too. A deadline remembers the clock it was set on, and is always read on that clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextvars import ContextVar, Token
from types import TracebackType

from . import _default
from ._clock import Clock
from ._errors import SET_BY, ConfigError
from ._validate import shown

__all__ = ["MAX_DEADLINE_S", "current_deadline", "deadline", "remaining"]

MAX_DEADLINE_S = 10 * 365 * 24 * 3600.0
"""A budget above this many seconds (ten years), infinity included, sets no deadline at all."""


class Expiry:
    """A deadline: the time ``at`` on ``clock`` (monotonic seconds), set ``budget_s`` seconds
    ahead (the request's whole budget, for the errors that report it; None: not known) by
    ``set_by`` (a key of :data:`SET_BY`; None: not known)."""

    __slots__ = ("at", "budget_s", "clock", "set_by")

    def __init__(
        self, at: float, clock: Clock, budget_s: float | None = None, set_by: str | None = None
    ) -> None:
        self.at = at
        self.clock = clock
        self.budget_s = budget_s
        self.set_by = set_by

    def left(self) -> float:
        """Seconds left, negative once passed."""
        return self.at - self.clock()

    def sooner(self, at: float) -> Expiry:
        """A deadline at ``at`` (no later than this one) inside this one: a stage's share, the
        time kept for a fallback. It keeps the request's budget and what set it, for the errors."""
        return Expiry(at, self.clock, self.budget_s, self.set_by)

    def __repr__(self) -> str:
        return f"Expiry(at={self.at}, clock={self.clock!r})"


_deadline: ContextVar[Expiry | None] = ContextVar("ragguard_deadline", default=None)

current_expiry: Callable[[], Expiry | None] = _deadline.get
"""The current deadline as an :class:`Expiry`, or None: the read of the layers and the front doors
on every call (the context variable's own ``get``, so no Python frame)."""

restore: Callable[[Token[Expiry | None]], None] = _deadline.reset
"""Put back the deadline that :func:`narrow` (or :func:`shorten`) replaced, given the token it returned."""

shorten: Callable[[Expiry], Token[Expiry | None]] = _deadline.set
"""Make an :class:`Expiry` the current deadline; returns the token :func:`restore` takes. For a
layer that gives the code inside it an earlier deadline than the request's (a stage's share, the
time kept for a fallback): the caller passes one no later than the current deadline."""


def remaining() -> float | None:
    """Seconds left in the current deadline (>= 0.0), or None when no deadline is set."""
    expiry = _deadline.get()
    if expiry is None:
        return None
    left = expiry.left()
    return left if left > 0.0 else 0.0


def current_deadline() -> float | None:
    """The current deadline as an absolute time on the clock that set it (monotonic seconds), or None."""
    expiry = _deadline.get()
    return None if expiry is None else expiry.at


def narrow(seconds: float, clock: Clock, set_by: str | None = None) -> Token[Expiry | None] | None:
    """Set the deadline to ``seconds`` from now on ``clock`` unless the current one is sooner;
    ``set_by`` (a key of :data:`SET_BY`) says what set it.

    ``seconds`` must be a finite float >= 0 below :data:`MAX_DEADLINE_S`. Returns the token to
    reset, or None when the current deadline was kept."""
    outer = _deadline.get()
    if outer is not None and outer.left() <= seconds:
        return None
    return _deadline.set(Expiry(clock() + seconds, clock, seconds, set_by))


def seconds_of(value: object, what: str = "deadline: seconds") -> float | None:
    """``value`` as a budget in seconds: None (or a budget above ten years) for no deadline.

    Raises :class:`~ragguard.ConfigError` naming ``what`` for a negative, NaN or non-number value,
    or an int no float can hold."""
    if value is None:
        return None
    if type(value) is float and 0.0 <= value <= MAX_DEADLINE_S:  # the common case, at once
        return value
    if isinstance(value, (str, bytes, bool)):  # float() would take "2" and True
        raise ConfigError(f"{what} must be a number or None, got {shown(value)}")
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"{what} must be a number or None, got {type(value).__name__}") from None
    except OverflowError:  # an int past any float (10**400): a mistake, not a budget
        raise ConfigError(f"{what} must be a float-sized number or None, got {shown(value)}") from None
    if math.isnan(seconds) or seconds < 0:
        raise ConfigError(f"{what} must be >= 0, got {seconds!r}")
    return None if seconds > MAX_DEADLINE_S else seconds


class deadline:
    """Give the enclosed block at most ``seconds`` (a number >= 0, or None for no limit).

    Usable as ``with`` and ``async with``. A nested deadline never extends an outer one; None, or
    a budget above ten years (:data:`MAX_DEADLINE_S`), keeps the outer deadline unchanged.
    ``clock`` (monotonic seconds) defaults to the default registry's clock
    (``ragguard.configure(clock=...)``). ``set_by`` says what set this deadline, as a
    :class:`~ragguard.DeadlineExceeded` and the front doors' answers tell it: ``"handler"`` (the
    default: the code's own), ``"client"`` (a budget the caller sent, as a front door reads it)
    or ``"tenant"``. Raises :class:`~ragguard.ConfigError` (a ValueError) for a negative, NaN or
    non-number value, or another ``set_by``.
    """

    __slots__ = ("_clock", "_expiry", "_seconds", "_set_by", "_token")

    def __init__(
        self, seconds: float | None, *, clock: Clock | None = None, set_by: str = "handler"
    ) -> None:
        self._seconds = seconds_of(seconds)
        if clock is not None and not callable(clock):
            raise ConfigError(f"deadline: clock must be a callable returning seconds, got {shown(clock)}")
        if not isinstance(set_by, str) or set_by not in SET_BY:
            raise ConfigError(f"deadline: set_by must be one of {', '.join(SET_BY)}, got {shown(set_by)}")
        self._set_by = set_by
        self._clock = clock
        self._token: Token[Expiry | None] | None = None
        self._expiry: Expiry | None = None

    def __enter__(self) -> deadline:
        if self._token is not None:
            raise RuntimeError("deadline(...) is not reentrant; create a new one per block")
        if self._seconds is not None:
            clock = self._clock
            if clock is None:
                clock = self._clock = _default.clock()
            self._token = narrow(self._seconds, clock, self._set_by)
        self._expiry = _deadline.get()
        if self._token is None:
            self._token = _deadline.set(self._expiry)  # so exit restores exactly what was there
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        token, self._token = self._token, None
        if token is not None:
            _deadline.reset(token)

    async def __aenter__(self) -> deadline:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    @property
    def expires_at(self) -> float | None:
        """This block's effective deadline as a time on its clock (None: no deadline)."""
        return None if self._expiry is None else self._expiry.at

    def remaining(self) -> float | None:
        """Seconds left in this block's effective deadline (>= 0), or None without one."""
        expiry = self._expiry
        return None if expiry is None else max(0.0, expiry.left())
