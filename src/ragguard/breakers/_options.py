"""A breaker's options, declared once: :class:`BreakerConfig`, one frozen, validated object.

Each option is one field of :class:`BreakerConfig` with its default, its range (the rule that
checks one value, and the range as the docs show it) and its meaning (:func:`option_info`); the
rules between options are :meth:`BreakerConfig.__post_init__`'s. Everything else reads it:

- :class:`~ragguard.breakers.CircuitBreaker` builds one from its keywords (:class:`BreakerOptions`
  types them) and exposes it as ``breaker.config``; a typed breaker's defaults are a dict of
  these names (``breakers/_typed.py``);
- :class:`ragguard.BreakerPolicy` (a stage's breaker in a policy) holds the same names, each
  checked by the same rule (:func:`check_option`), and builds its stage's config once
  (``BreakerPolicy.config()``);
- the Redis-shared breaker reads the wrapped breaker's config, and the Lua scripts get the options
  they run on from it, named by field (``ragguard.redis._scripts.BREAKER_OPTION_ARGS``);
- docs/policy.md shows each option's range from here (``ragguard_tools.policy_doc``).

So a value the breaker refuses is refused everywhere, by the same rule and with the same message
(a :class:`~ragguard.ConfigError` naming the option). Names after resilience4j's, in seconds and
percent; "year" is 365 days.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import Field, dataclass, field, fields
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypedDict

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
    "OPTIONS",
    "BreakerConfig",
    "BreakerOptions",
    "Classifier",
    "OptionInfo",
    "check_option",
    "option_info",
]

Classifier = Callable[[BaseException], bool]
"""A failure classifier: ``classifier(exc)`` is True when ``exc`` counts."""

MAX_WINDOW_CALLS = 1_000_000
MAX_WINDOW_SECONDS = 86_400
MAX_PERMITS = 100_000
MAX_DURATION_S = 365 * 86_400.0
MAX_BACKOFF_MULTIPLIER = 100.0


class OptionInfo(NamedTuple):
    """What the docs and the checks know of one number option: the rule that checks one value
    (``rule(name, value)``, raising ConfigError naming it), its range as the docs show it, and what
    it means."""

    rule: Callable[[str, object], Any]
    shown: str
    doc: str


def _option(default: Any, rule: Callable[[str, object], Any], shown: str, doc: str) -> Any:
    return field(default=default, metadata={"option": OptionInfo(rule, shown, doc)})


def _duration(option: str, value: object) -> float:
    return v.seconds(option, value, max_s=MAX_DURATION_S)


def _calls(option: str, value: object) -> int:
    return v.count(option, value, 1, MAX_WINDOW_CALLS)


def _permits(option: str, value: object) -> int:
    return v.count(option, value, 1, MAX_PERMITS)


def _multiplier(option: str, value: object) -> float:
    return v.number(option, value, low=1.0, high=MAX_BACKOFF_MULTIPLIER)


def _jitter(option: str, value: object) -> float:
    return v.fraction(option, value, below_one=True)


def _window_type(option: str, value: object) -> str:
    if value not in ("count", "time"):
        raise ConfigError(f"{option} must be 'count' or 'time', got {v.shown(value)}", field=option)
    return value


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    """How a circuit breaker decides, validated once at construction.

    The options (:data:`OPTIONS`: each field's default, range and meaning: :func:`option_info`; the table
    of docs/policy.md) and three more: ``classifier`` (``exc -> bool``, True when an error counts
    as a failure; None given to :meth:`of` means :func:`~ragguard.breakers.counts_by_default`),
    ``slow_classifier`` (``exc -> bool`` or None: errors that count as slow whatever their
    duration) and ``error_class`` (the :class:`ragguard.BreakerOpen` subclass raised on a
    rejection). Durations are seconds as floats (a :class:`~datetime.timedelta` is accepted and
    converted). Raises :class:`~ragguard.ConfigError` whose ``field`` names the option when a
    value is out of range. :meth:`of` builds one from a breaker's keyword options.
    """

    failure_rate_threshold: float = _option(
        50.0, v.percent, "(0, 100]",
        "trip when at least this percentage of the window's calls failed (resilience4j's "
        "``failureRateThreshold``).",
    )  # fmt: skip
    slow_call_rate_threshold: float = _option(
        100.0, v.percent, "(0, 100]",
        "trip when at least this percentage of the window's calls were slow (longer than "
        "``slow_call_duration_s``; slow successes and slow failures both count).",
    )  # fmt: skip
    slow_call_duration_s: float = _option(
        60.0, _duration, "(0, 1 year] seconds", "a call lasting longer is slow (seconds)."
    )
    consecutive_failures_threshold: int | None = _option(
        None, _calls, "1..1,000,000, or None (off)",
        "trip after this many failures in a row (a success resets the run; ignored errors and "
        "rejections do not).",
    )  # fmt: skip
    rejection_rate_threshold: float | None = _option(
        90.0, v.percent, "(0, 100], or None (off)",
        "trip when at least this percentage of the window's calls were turned away by the "
        "dependency with a wait that is not a rate limit (a 503 stating a wait, 529, an overload "
        "event inside a stream: :func:`~ragguard.breakers.counts_overloads`; never a 429: that "
        "only throttles): rejections that persist are an outage. The failure and slow-call rates "
        "are then of the other calls. None: such rejections are not counted at all.",
    )  # fmt: skip
    minimum_calls: int = _option(
        100, _calls, "count: 1..`window_size`; time: 1..1,000,000",
        "no rule trips before the window holds this many calls (``minimumNumberOfCalls``).",
    )  # fmt: skip
    window_type: Literal["count", "time"] = _option(
        "count", _window_type, '`"count"` or `"time"`',
        "``count`` (the last ``window_size`` calls) or ``time`` (the calls of the last "
        "``window_size`` seconds of the clock, in one-second buckets).",
    )  # fmt: skip
    window_size: int = _option(
        100, _calls, "count: 1..1,000,000 calls; time: 1..86,400 seconds",
        "calls (count window) or seconds (time window).",
    )  # fmt: skip
    half_open_permits: int = _option(
        10, _permits, "1..100,000",
        "trial calls admitted while half-open; further callers are rejected at once "
        "(``permittedNumberOfCallsInHalfOpenState``). When all are done, their rates against the "
        "same thresholds decide: closed (window cleared) or open again.",
    )  # fmt: skip
    open_for_s: float = _option(
        60.0, _duration, "(0, 1 year] seconds",
        "how long the breaker stays open after a trip (seconds; ``waitDurationInOpenState``).",
    )  # fmt: skip
    open_backoff_multiplier: float = _option(
        1.0, _multiplier, "[1, 100]",
        "each reopening from half-open multiplies the open time by this (1: constant); closing "
        "resets it.",
    )  # fmt: skip
    open_max_s: float | None = _option(
        None, _duration, "[`open_for_s`, 1 year] seconds, or None (no cap below a year)",
        "the open time's cap (seconds; None: a year).",
    )  # fmt: skip
    open_jitter: float = _option(
        0.0, _jitter, "[0, 1)",
        "each open time is spread uniformly by up to this fraction either way (never above the "
        "cap), drawn from the breaker's ``rng``.",
    )  # fmt: skip
    classifier: Callable[[BaseException], bool] = counts_by_default
    slow_classifier: Callable[[BaseException], bool] | None = None
    error_class: type[BreakerOpen] = BreakerOpen

    def __post_init__(self) -> None:
        put = object.__setattr__
        for name in OPTIONS:
            value = getattr(self, name)
            if value is not None:
                put(self, name, check_option(name, value))
        if self.window_type == "time":
            v.count("window_size", self.window_size, 1, MAX_WINDOW_SECONDS, hint="seconds of a time window")
        else:
            v.count("minimum_calls", self.minimum_calls, 1, self.window_size,
                    hint="at most window_size of a count window")  # fmt: skip
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


def _info(f: Field[Any]) -> OptionInfo | None:
    info = f.metadata.get("option")
    return info if isinstance(info, OptionInfo) else None


_FIELDS = frozenset(f.name for f in fields(BreakerConfig))
_INFO: dict[str, OptionInfo] = {f.name: info for f in fields(BreakerConfig) if (info := _info(f)) is not None}
OPTIONS: tuple[str, ...] = tuple(_INFO)
"""The breaker's options proper, each with a one-value rule (:func:`check_option`): every field
of :class:`BreakerConfig` but the classifiers and the error class (which are code, not data), in
the order of its fields."""


def option_info(name: str) -> OptionInfo:
    """The rule, the range shown and the meaning of option ``name`` (one of :data:`OPTIONS`;
    KeyError for another name)."""
    return _INFO[name]


def check_option(name: str, value: object) -> Any:
    """``value`` checked and normalised by the one-value rule of breaker option ``name`` (a
    number option, not None): the rule :class:`BreakerConfig` applies before its cross-option
    rules (``minimum_calls`` <= ``window_size`` of a count window, at most a day for a time
    window, ``open_max_s`` >= ``open_for_s``). Raises ConfigError naming ``name``; KeyError for a
    name that has no such rule."""
    return _INFO[name].rule(name, value)


class BreakerOptions(TypedDict, total=False):
    """The keyword options of :class:`~ragguard.breakers.CircuitBreaker`: the fields of
    :class:`BreakerConfig` (their defaults, units and ranges are there), a whole ``config``
    instead of them, and the breaker's randomness and time (``rng``, ``clock``), which are not
    options of its behaviour. tests/breakers/test_breaker_config.py holds it to the config's
    fields."""

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
    classifier: Classifier | None
    slow_classifier: Classifier | None
    error_class: type[BreakerOpen]
    config: BreakerConfig
    rng: random.Random | None
    clock: Callable[[], float]
