"""The bound on any wait a server states, and how every reader and writer of one keeps to it.

A dependency's ``Retry-After``, ``retry-after-ms``, rate-limit reset or gRPC pushback, and the waits
ragguard's own front doors state, are read and written clamped to [0, :data:`MAX_STATED_WAIT_S`]:
:func:`clamp_wait` (None for what is not a number), :func:`clamped` (0 for it). Never raises.
"""

from __future__ import annotations

import math

__all__ = ["MAX_STATED_WAIT_S", "clamp_wait", "clamped"]


MAX_STATED_WAIT_S = 86_400.0
"""The longest wait (seconds) a parsed or formatted wait can be: one day. A dependency stating more
(``Retry-After: 9999999999``, a date decades ahead, ``1e308``) is read as stating this much."""


def clamp_wait(seconds: object) -> float | None:
    """``seconds`` as a stated wait: a float in [0, :data:`MAX_STATED_WAIT_S`], None when it is
    not a number (NaN, a string, a bool). Never raises: ``inf`` and ``1e308`` clamp to the cap."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        return None
    try:
        value = float(seconds)
    except (OverflowError, ValueError):  # an int too large for a float
        return MAX_STATED_WAIT_S if seconds > 0 else 0.0
    if math.isnan(value):
        return None
    if value <= 0.0:
        return 0.0
    return value if value < MAX_STATED_WAIT_S else MAX_STATED_WAIT_S


def clamped(seconds: float) -> float:
    """``seconds`` in [0, :data:`MAX_STATED_WAIT_S`] (NaN is 0): what any wait may be once parsed."""
    wait = clamp_wait(seconds)
    return 0.0 if wait is None else wait
