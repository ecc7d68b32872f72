"""Option validators: the one place a caller's option value is checked and normalised.

Each validator takes the option's name as the caller wrote it and the value, returns the value
normalised (seconds as a float, counts as an int) and otherwise raises
:class:`~ragguard.ConfigError` whose ``field`` is the option's name and whose message shows at
most :data:`SHOWN_CHARS` characters of the value (:func:`shown`), so a huge or hostile value
never makes a huge message. ``bool`` is never a number here (``True`` is not a size), a huge
``int`` that no float can hold is refused rather than raising ``OverflowError``, and NaN and the
infinities are never seconds.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from ._errors import ConfigError

__all__ = [
    "MAX_SIZE",
    "SHOWN_CHARS",
    "bounded",
    "count",
    "for_cli",
    "fraction",
    "function",
    "number",
    "percent",
    "seconds",
    "shown",
    "size",
]

SHOWN_CHARS = 60
"""The most characters of a refused value an error message shows."""

_repr = reprlib.Repr()
_repr.maxstring = 40
_repr.maxother = 40
_repr.maxlong = 40
_repr.maxlist = _repr.maxtuple = _repr.maxset = _repr.maxfrozenset = _repr.maxdeque = 4
_repr.maxdict = 3
_repr.maxlevel = 2


def shown(value: object) -> str:
    """A repr of ``value`` cut to at most :data:`SHOWN_CHARS` characters, for error messages.

    Never raises: an int too long for ``repr`` (Python refuses more than 4,300 digits) is shown
    by its size, and an object whose ``__repr__`` raises by its type.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        digits = int(value.bit_length() * math.log10(2)) + 1
        return f"{'-' if value < 0 else ''}<an int of about {digits} digits>"
    try:
        text = _repr.repr(value)
    except Exception:
        text = f"<{type(value).__name__} object>"
    return bounded(text)


def bounded(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` cut to ``limit`` characters, the cut marked with ``...``."""
    return text if len(text) <= limit else text[: max(0, limit - 3)] + "..."


def for_cli(exc: ConfigError, flags: Mapping[str, str]) -> str:
    """``exc``'s message for a command line: its leading field name (``duration_s``) replaced by
    the option the user typed (``--duration``), when ``flags`` maps ``exc.field`` to one."""
    text = str(exc)
    flag = flags.get(exc.field or "")
    if flag is not None and exc.field and text.startswith(exc.field):
        return flag + text[len(exc.field) :]
    return text


def _fail(option: str, rule: str, value: object) -> ConfigError:
    return ConfigError(f"{option} must be {rule}, got {shown(value)}", field=option)


def _real(value: object) -> float | None:
    """``value`` as a float when it is a real number (never a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return float(value)
    except OverflowError:  # an int beyond any float
        return math.inf if value > 0 else -math.inf


def seconds(
    option: str, value: object, *, allow_zero: bool = False, max_s: float | None = None
) -> float:
    """A duration in seconds: a number or a :class:`~datetime.timedelta`, finite, > 0 (>= 0 with
    ``allow_zero``) and at most ``max_s`` when given. Returns it as a float."""
    x = value.total_seconds() if isinstance(value, timedelta) else _real(value)
    if (
        x is None
        or not math.isfinite(x)
        or x < 0.0
        or (x == 0.0 and not allow_zero)
        or (max_s is not None and x > max_s)
    ):
        bound = ">= 0" if allow_zero else "> 0"
        if max_s is not None:
            bound += f" and <= {max_s:,.0f}" if max_s == int(max_s) else f" and <= {max_s:g}"
        raise _fail(option, f"a finite number of seconds {bound}", value)
    return x


def number(
    option: str,
    value: object,
    *,
    low: float = -math.inf,
    high: float = math.inf,
    low_open: bool = False,
    high_open: bool = False,
    what: str = "a number",
) -> float:
    """A finite real number in the interval from ``low`` to ``high`` (each end closed unless
    ``low_open`` / ``high_open``). Returns it as a float."""
    x = _real(value)
    if (
        x is None
        or not math.isfinite(x)
        or (x <= low if low_open else x < low)
        or (x >= high if high_open else x > high)
    ):
        left = "(" if low_open else "["
        right = ")" if high_open or math.isinf(high) else "]"
        span = f"{left}{low:g}, {'inf' if math.isinf(high) else f'{high:g}'}{right}"
        raise _fail(option, f"{what} in {span}", value)
    return x


def percent(option: str, value: object) -> float:
    """A percentage in (0, 100]."""
    return number(option, value, low=0.0, high=100.0, low_open=True, what="a percentage")


def fraction(option: str, value: object, *, below_one: bool = False) -> float:
    """A fraction in [0, 1], or [0, 1) with ``below_one``."""
    return number(option, value, low=0.0, high=1.0, high_open=below_one, what="a fraction")


def count(option: str, value: object, low: int = 0, high: int | None = None, *, hint: str = "") -> int:
    """An ``int`` (never a bool) in [``low``, ``high``] (no upper bound when ``high`` is None).
    ``hint`` says where a bound comes from (``"at most window_size"``)."""
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or value < low
        or (high is not None and value > high)
    ):
        rule = f"an int >= {low}" if high is None else f"an int in [{low}, {high}]"
        raise _fail(option, f"{rule}{f' ({hint})' if hint else ''}", value)
    return value


MAX_SIZE = 2**63 - 1
"""The largest size any option takes (what a C ``ssize_t`` holds)."""


def size(option: str, value: object, *, low: int = 1, high: int = MAX_SIZE, unit: str = "bytes") -> int:
    """A size: an ``int`` (never a bool) of ``unit`` in [``low``, ``high``]."""
    return count(option, value, low, high, hint=unit)


def function(option: str, value: object, what: str) -> Callable[..., Any]:
    """A callable; ``what`` describes it in the error (``"exc -> bool"``)."""
    if not callable(value):
        raise _fail(option, f"a callable {what}", value)
    return value
