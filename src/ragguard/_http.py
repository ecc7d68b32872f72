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
from email.utils import parsedate_to_datetime

from ._errors import ConfigError, InvalidInput
from ._validate import bounded

__all__ = [
    "DEGRADED_HEADER",
    "RETRY_AFTER_HEADER",
    "RETRY_AFTER_MS_HEADER",
    "TENANT_HEADER",
    "TIMEOUT_HEADER",
    "check_field_name",
    "format_retry_after",
    "format_retry_after_ms",
    "format_timeout_ms",
    "parse_retry_after",
    "parse_retry_after_ms",
    "parse_timeout_ms",
]

TENANT_HEADER = "x-tenant-id"
TIMEOUT_HEADER = "x-request-timeout-ms"
RETRY_AFTER_HEADER = "retry-after"
RETRY_AFTER_MS_HEADER = "retry-after-ms"
DEGRADED_HEADER = "ragguard-degraded"

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]+")  # RFC 9110 token, lowercase
_MILLISECONDS = re.compile(r"[0-9]{1,10}(\.[0-9]{1,6})?")
_DELAY_SECONDS = re.compile(r"[0-9]{1,10}(\.[0-9]{1,6})?")
_MAX_SHOWN = 40


def check_field_name(option: str, name: object) -> str:
    """``name`` when it is a lowercase HTTP field name, else ConfigError naming ``option``."""
    if not isinstance(name, str) or not _TOKEN.fullmatch(name):
        raise ConfigError(f"{option} must be a lowercase HTTP field name (an RFC 9110 token), got {name!r}")
    return name


def _whole(value: float) -> int:
    # ceil, after rounding away float noise: 0.3 * 1000 is 300.00000000000006, not 301 ms
    return math.ceil(round(value, 6))


def format_retry_after(seconds: float) -> str:
    """``Retry-After`` for a wait of ``seconds``: whole seconds, rounded up, at least 1."""
    return str(max(1, _whole(max(0.0, seconds))))


def format_retry_after_ms(seconds: float) -> str:
    """``retry-after-ms`` for a wait of ``seconds``: whole milliseconds, rounded up."""
    return str(_whole(max(0.0, seconds) * 1000.0))


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


def parse_retry_after(value: str, *, now: float | None = None) -> float | None:
    """A ``Retry-After`` value in seconds: delay-seconds (a decimal is accepted too) or an
    HTTP-date (its distance from ``now``, wall-clock seconds, default ``time.time()``, at least 0).
    None when it is neither."""
    text = value.strip()
    if _DELAY_SECONDS.fullmatch(text):
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None  # an HTTP-date is always GMT; a zone-less date is not one
    wall = time.time() if now is None else now
    return max(0.0, when.timestamp() - wall)


def parse_retry_after_ms(value: str) -> float | None:
    """A ``retry-after-ms`` value (milliseconds) in seconds, or None when it is not a number >= 0."""
    text = value.strip()
    if not _MILLISECONDS.fullmatch(text):
        return None
    return float(text) / 1000.0
