"""HTTP field names and values shared by the ASGI middleware and the httpx transport.

Both sides use the same names, so a ragguard service calling another through
``ragguard.httpx`` hands it its tenant and what is left of its deadline:

====================  ===============================================================
field                 value
====================  ===============================================================
``x-tenant-id``       the tenant id (``ragguard.current_tenant()``)
``x-request-timeout-  the caller's remaining budget in milliseconds, a non-negative
ms``                  number (``"250"``, ``"12.5"``); relative, so clocks need not agree
``retry-after``       RFC 9110: whole seconds, rounded up, at least 1
``retry-after-ms``    the exact wait in whole milliseconds, rounded up
``ragguard-degraded`` the fallbacks that served the answer, comma separated
====================  ===============================================================
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from typing import Any

from ._errors import ConfigError, InvalidInput
from ._validate import bounded
from ._waits import clamped

__all__ = [
    "DEGRADED_HEADER",
    "RETRY_AFTER_HEADER",
    "RETRY_AFTER_MS_HEADER",
    "TENANT_HEADER",
    "TIMEOUT_HEADER",
    "check_field_name",
    "field_name",
    "format_retry_after",
    "format_retry_after_ms",
    "format_timeout_ms",
    "parse_reset",
    "parse_retry_after",
    "parse_retry_after_ms",
    "parse_timeout_ms",
    "stated_wait",
]

TENANT_HEADER = "x-tenant-id"
TIMEOUT_HEADER = "x-request-timeout-ms"
RETRY_AFTER_HEADER = "retry-after"
RETRY_AFTER_MS_HEADER = "retry-after-ms"
DEGRADED_HEADER = "ragguard-degraded"

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]+")  # RFC 9110 token, lowercase
_MILLISECONDS = re.compile(r"[0-9]{1,10}(\.[0-9]{1,6})?")
_DELAY_SECONDS = re.compile(r"[0-9]{1,40}(\.[0-9]{1,9})?")
_MAX_SHOWN = 40


def check_field_name(option: str, name: object) -> str:
    """``name`` when it is a lowercase HTTP field name, else ConfigError naming ``option``."""
    if not isinstance(name, str) or not _TOKEN.fullmatch(name):
        rule = "must be a lowercase HTTP field name (an RFC 9110 token)"
        raise ConfigError(f"{option} {rule}, got {name!r:.80}")
    return name


def field_name(option: str, name: object) -> str:
    """``name`` lowercased when it is an HTTP field name in any case (field names are
    case-insensitive), else ConfigError naming ``option``."""
    return check_field_name(option, name.lower() if isinstance(name, str) else name)


def _whole(value: float) -> int:
    # ceil, after rounding away float noise: 0.3 * 1000 is 300.00000000000006, not 301 ms
    return math.ceil(round(value, 6))


def format_retry_after(seconds: float) -> str:
    """``Retry-After`` for a wait of ``seconds``: whole seconds, rounded up, at least 1 (a wait
    beyond a day, infinity or NaN included, is said as a day; never raises)."""
    return str(max(1, _whole(clamped(seconds))))


def format_retry_after_ms(seconds: float) -> str:
    """``retry-after-ms`` for a wait of ``seconds``: whole milliseconds, rounded up (clamped as
    :func:`format_retry_after`)."""
    return str(_whole(clamped(seconds) * 1000.0))


def format_timeout_ms(seconds: float) -> str:
    """The timeout field for ``seconds`` left: whole milliseconds, rounded down, so a caller
    never hands on more time than it has."""
    return str(max(0, math.floor(round(seconds * 1000.0, 6))))


def parse_timeout_ms(value: str, field: str = TIMEOUT_HEADER) -> float:
    """A timeout field value in seconds; raises InvalidInput naming ``field`` when it is not a
    non-negative number of milliseconds (up to 10 digits, 6 decimals)."""
    text = value.strip()
    if not _MILLISECONDS.fullmatch(text):
        raise InvalidInput(
            f"{field} must be a non-negative number of milliseconds, got {bounded(text, _MAX_SHOWN)!r}"
        )
    return float(text) / 1000.0


def parse_retry_after(value: object, *, now: float | None = None) -> float | None:
    """A ``Retry-After`` value in seconds: delay-seconds (a decimal is accepted too) or an
    HTTP-date (its distance from ``now``, wall-clock seconds, default ``time.time()``). None when
    it is neither. Clamped to [0, :data:`~ragguard.outcomes.MAX_STATED_WAIT_S`]; never raises."""
    text = _text(value)
    if text is None:
        return None
    if _DELAY_SECONDS.fullmatch(text):
        return clamped(float(text))
    if len(text) > _MAX_DATE or not text[:1].isalpha():
        return None
    try:
        when = parsedate_to_datetime(text)
        if when.tzinfo is None:
            return None  # an HTTP-date is always GMT; a zone-less date is not one
        wall = time.time() if now is None else now
        return clamped(when.timestamp() - wall)
    except Exception:  # TypeError, ValueError, IndexError, OverflowError: not a date
        return None


def parse_retry_after_ms(value: object) -> float | None:
    """A ``retry-after-ms`` value (milliseconds) in seconds, or None when it is not a number >= 0;
    clamped as :func:`parse_retry_after`."""
    text = _text(value)
    if text is None or not _DELAY_SECONDS.fullmatch(text):
        return None
    return clamped(float(text) / 1000.0)


_DURATION = re.compile(r"(?:([0-9]{1,6})h)?(?:([0-9]{1,6})m(?!s))?(?:([0-9]{1,9}(?:\.[0-9]{1,9})?)s)?"
                       r"(?:([0-9]{1,9}(?:\.[0-9]{1,9})?)ms)?")


def parse_reset(value: object) -> float | None:
    """A rate-limit reset value in seconds: a duration as OpenAI writes it (``"6m0s"``,
    ``"1h2m3.5s"``, ``"20ms"``, ``"1s"``) or a plain number of seconds (``"0.5"``). None when it
    is neither; clamped as :func:`parse_retry_after`; never raises."""
    text = _text(value)
    if text is None:
        return None
    if _DELAY_SECONDS.fullmatch(text):
        return clamped(float(text))
    match = _DURATION.fullmatch(text)
    if match is None or not any(match.groups()):
        return None
    hours, minutes, seconds, millis = (float(g) if g else 0.0 for g in match.groups())
    return clamped(hours * 3600.0 + minutes * 60.0 + seconds + millis / 1000.0)


def stated_wait(headers: Any, *, now: float | None = None) -> float | None:
    """The wait, in seconds, that response ``headers`` state, or None when they state none.

    ``retry-after-ms`` when readable (exact), else ``Retry-After`` (seconds or an HTTP-date),
    else the rate-limit resets (``x-ratelimit-reset-requests`` / ``-tokens``): the reset of the
    limit whose ``x-ratelimit-remaining-*`` is 0, else the later of the two. ``headers`` is any
    mapping with ``get`` (httpx's, a dict, a list of pairs); names are matched case-insensitively.
    Clamped to [0, :data:`~ragguard.outcomes.MAX_STATED_WAIT_S`]; never raises.
    """
    try:
        get = _getter(headers)
        exact = parse_retry_after_ms(get(RETRY_AFTER_MS_HEADER))
        if exact is not None:
            return exact
        plain = parse_retry_after(get(RETRY_AFTER_HEADER), now=now)
        if plain is not None:
            return plain
        resets = []
        for limit in _RESET_LIMITS:
            reset = parse_reset(get(f"x-ratelimit-reset-{limit}"))
            if reset is not None:
                spent = (_text(get(f"x-ratelimit-remaining-{limit}")) or "") == "0"
                resets.append((spent, reset))
        if not resets:
            return None
        spent_resets = [reset for spent, reset in resets if spent]
        return max(spent_resets or [reset for _, reset in resets])
    except Exception:  # headers of an unexpected shape: no wait stated
        return None


_RESET_LIMITS = ("requests", "tokens")
_MAX_DATE = 64
_MAX_VALUE = 128


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if not isinstance(value, str) or len(value) > _MAX_VALUE:
        return None
    return value.strip()


def _getter(headers: Any) -> Any:
    """A case-insensitive ``get(name)`` over ``headers``."""
    if headers is None:
        return lambda name: None
    if isinstance(headers, Mapping) and type(headers) in (dict,):
        lowered = {str(k).lower(): v for k, v in headers.items()}
        return lowered.get
    get = getattr(headers, "get", None)
    if callable(get) and not isinstance(headers, (list, tuple)):
        def fetch(name: str) -> Any:
            value = get(name)
            return value if value is not None else get(name.title())
        return fetch
    pairs: dict[str, Any] = {}
    for item in headers:
        key, value = item[0], item[1]
        key = key.decode("latin-1") if isinstance(key, bytes) else str(key)
        pairs.setdefault(key.lower(), value)
    return pairs.get
