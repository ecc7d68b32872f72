"""A breaker's options as one frozen, validated object: :class:`BreakerConfig`.

:class:`~ragguard.breakers.CircuitBreaker` builds one from its keywords and exposes it as
``breaker.config``; the Redis-shared breaker, the guard's breaker layer and the policy loader
read options from it (or validate with it) instead of from a breaker's private attributes, so a
value the breaker refuses is refused everywhere, by the same rule and with the same message.

Ranges (names after resilience4j's, in seconds and percent; "year" is 365 days):

| option | range | default |
|---|---|---|
| ``failure_rate_threshold``, ``slow_call_rate_threshold`` | (0, 100] | 50, 100 |
| ``slow_call_duration_s``, ``open_for_s`` | (0, 1 year] seconds | 60, 60 |
| ``open_max_s`` | [``open_for_s``, 1 year] seconds, or None (no cap below a year) | None |
| ``consecutive_failures_threshold`` | 1..1,000,000, or None (off) | None |
| ``rejection_rate_threshold`` | (0, 100], or None (off) | 90 |
| ``window_type`` | ``"count"`` or ``"time"`` | count |
| ``window_size`` | count: 1..1,000,000 calls; time: 1..86,400 seconds | 100 |
| ``minimum_calls`` | count: 1..``window_size``; time: 1..1,000,000 | 100 |
| ``half_open_permits`` | 1..100,000 | 10 |
| ``open_backoff_multiplier`` | [1, 100] | 1 |
| ``open_jitter`` | [0, 1) | 0 |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from .. import _validate as v
from .._errors import BreakerOpen, ConfigError
from ._classify import counts_by_default

if TYPE_CHECKING:
    import random

__all__ = [
    "MAX_BACKOFF_MULTIPLIER",
    "MAX_DURATION_S",
    "MAX_PERMITS",
    "MAX_WINDOW_CALLS",
    "MAX_WINDOW_SECONDS",
    "NUMBER_OPTIONS",
    "BreakerConfig",
    "BreakerOptions",
    "Classifier",
    "check_option",
]

Classifier = Callable[[BaseException], bool]
"""A failure classifier: ``classifier(exc)`` is True when ``exc`` counts."""

MAX_WINDOW_CALLS = 1_000_000
MAX_WINDOW_SECONDS = 86_400
MAX_PERMITS = 100_000
MAX_DURATION_S = 365 * 86_400.0
MAX_BACKOFF_MULTIPLIER = 100.0


class BreakerOptions(TypedDict, total=False):
    """The keyword options of :class:`CircuitBreaker` (see :class:`BreakerConfig` for units and
    ranges; ``rng`` and ``clock`` are the breaker's randomness and time, not options of its
    behaviour, so they are not part of the config)."""

    failure_rate_threshold: float
    slow_call_rate_threshold: float
    slow_call_duration_s: float | timedelta
    consecutive_failures_threshold: int | None
    rejection_rate_threshold: float | None
    minimum_calls: int
    window_type: Literal["count", "time"]
    window_size: int
    half_open_permits: int
    open_for_s: float | timedelta
    open_backoff_multiplier: float
    open_max_s: float | timedelta | None
    open_jitter: float
    rng: random.Random | None
    classifier: Callable[[BaseException], bool] | None
    slow_classifier: Callable[[BaseException], bool] | None
    clock: Callable[[], float]
    error_class: type[BreakerOpen]
    config: BreakerConfig


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    """How a circuit breaker decides, validated once at construction (see the module docstring
    for every range).

    ``rejection_rate_threshold``: trip when at least this percentage of the window's calls were
    turned away by the dependency with a wait that is not a rate limit
    (:func:`~ragguard.breakers.counts_overloads`: a 503 stating a wait, 529, an overload event;
    never a 429); the failure and slow-call rates are then taken over the calls that were not
    turned away. None: such rejections are not counted at all.

    Durations are seconds as floats (a :class:`~datetime.timedelta` is accepted and converted);
    ``classifier`` is the resolved failure classifier (None given means
    :func:`~ragguard.breakers.counts_by_default`); ``slow_classifier`` may stay None.
    Raises :class:`~ragguard.ConfigError` whose ``field`` names the option when a value is out of
    range. :meth:`of` builds one from a breaker's keyword options.
    """

    failure_rate_threshold: float = 50.0
    slow_call_rate_threshold: float = 100.0
    slow_call_duration_s: float = 60.0
    consecutive_failures_threshold: int | None = None
    rejection_rate_threshold: float | None = 90.0
    minimum_calls: int = 100
    window_type: Literal["count", "time"] = "count"
    window_size: int = 100
    half_open_permits: int = 10
    open_for_s: float = 60.0
    open_backoff_multiplier: float = 1.0
    open_max_s: float | None = None
    open_jitter: float = 0.0
    classifier: Callable[[BaseException], bool] = counts_by_default
    slow_classifier: Callable[[BaseException], bool] | None = None
    error_class: type[BreakerOpen] = BreakerOpen

    def __post_init__(self) -> None:
        put = object.__setattr__
        for name in _RULES:
            value = getattr(self, name)
            if value is not None:
                put(self, name, check_option(name, value))
        window_type = self.window_type
        if window_type == "time":
            v.count("window_size", self.window_size, 1, MAX_WINDOW_SECONDS, hint="seconds of a time window")
        elif window_type == "count":
            v.count("minimum_calls", self.minimum_calls, 1, self.window_size,
                    hint="at most window_size of a count window")  # fmt: skip
        else:
            got = v.shown(window_type)
            raise ConfigError(f"window_type must be 'count' or 'time', got {got}", field="window_type")
        if self.open_max_s is not None and self.open_max_s < self.open_for_s:
            rule = f"open_max_s must be >= open_for_s ({self.open_for_s:g})"
            raise ConfigError(f"{rule}, got {v.shown(self.open_max_s)}", field="open_max_s")
        v.function("classifier", self.classifier, "exc -> bool")
        if self.slow_classifier is not None:
            v.function("slow_classifier", self.slow_classifier, "exc -> bool")
        if not (isinstance(self.error_class, type) and issubclass(self.error_class, BreakerOpen)):
            rule = "error_class must be a subclass of ragguard.BreakerOpen"
            raise ConfigError(f"{rule}, got {v.shown(self.error_class)}", field="error_class")

    @classmethod
    def of(cls, **options: Any) -> BreakerConfig:
        """A config from a breaker's keyword options (``rng`` and ``clock`` excluded); None for
        ``classifier`` means the default. Raises ConfigError naming an unknown option."""
        unknown = set(options) - _FIELDS
        if unknown:
            name = sorted(unknown)[0]
            raise ConfigError(f"{v.bounded(name)} is not a breaker option", field=name)
        if options.get("classifier", counts_by_default) is None:
            options["classifier"] = counts_by_default
        return cls(**options)

    @property
    def open_cap_s(self) -> float:
        """The longest an open state lasts, in seconds: ``open_max_s``, or a year when None."""
        return MAX_DURATION_S if self.open_max_s is None else self.open_max_s

    def options(self) -> dict[str, Any]:
        """The config as keyword options for :class:`CircuitBreaker` (a fresh dict)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


_FIELDS = frozenset(f.name for f in fields(BreakerConfig))


def check_option(name: str, value: object) -> Any:
    """``value`` checked and normalised by the one-value rule of breaker option ``name`` (a
    number option, not None): the rule :class:`BreakerConfig` applies before its cross-option
    rules (``minimum_calls`` <= ``window_size`` of a count window, at most a day for a time
    window, ``open_max_s`` >= ``open_for_s``). Raises ConfigError naming ``name``; KeyError for a
    name that has no such rule."""
    return _RULES[name](name, value)


def _duration(option: str, value: object) -> float:
    return v.seconds(option, value, max_s=MAX_DURATION_S)


def _calls(option: str, value: object) -> int:
    return v.count(option, value, 1, MAX_WINDOW_CALLS)


_RULES: dict[str, Callable[[str, object], Any]] = {
    "failure_rate_threshold": v.percent,
    "slow_call_rate_threshold": v.percent,
    "rejection_rate_threshold": v.percent,
    "slow_call_duration_s": _duration,
    "consecutive_failures_threshold": _calls,
    "minimum_calls": _calls,
    "window_size": _calls,
    "half_open_permits": lambda option, value: v.count(option, value, 1, MAX_PERMITS),
    "open_for_s": _duration,
    "open_backoff_multiplier": lambda option, value: v.number(
        option, value, low=1.0, high=MAX_BACKOFF_MULTIPLIER
    ),
    "open_max_s": _duration,
    "open_jitter": lambda option, value: v.fraction(option, value, below_one=True),
}
NUMBER_OPTIONS: tuple[str, ...] = tuple(_RULES)
"""The breaker options that are numbers, each with a one-value rule (:func:`check_option`)."""
