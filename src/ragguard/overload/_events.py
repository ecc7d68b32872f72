"""The overload layers' events, emitted on :data:`ragguard.events.bus` when someone listens."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HedgeFired", "LimitChanged", "LoadShed", "Throttled"]


@dataclass(frozen=True, slots=True)
class LimitChanged:
    """Stage ``stage``'s adaptive limit went from ``old`` to ``new`` calls at clock time ``at``;
    ``min_rtt_s`` the baseline and ``rtt_s`` the last window's latency (seconds, None before the
    first measurement); ``probing``: a baseline probe pins the limit low."""

    stage: str
    old: int
    new: int
    min_rtt_s: float | None
    rtt_s: float | None
    probing: bool
    at: float


@dataclass(frozen=True, slots=True)
class LoadShed:
    """Stage ``stage`` shed a ``priority`` call of ``tenant`` for ``reason`` (``limit``, ``queue``
    or ``deadline``, as :class:`~ragguard.Overloaded` gives them) at clock time ``at``."""

    stage: str
    tenant: str
    priority: str
    reason: str
    at: float


@dataclass(frozen=True, slots=True)
class Throttled:
    """Stage ``stage`` refused a call locally: its dependency rejected most recent calls
    (``probability`` of refusal, 0..1)."""

    stage: str
    tenant: str
    probability: float


@dataclass(frozen=True, slots=True)
class HedgeFired:
    """Stage ``stage`` sent a second attempt after ``delay_s`` seconds without an answer: emitted
    when the second leg reaches the dependency (past the stage's throttle, adaptive limit, breaker
    and attempt timer), so a hedge an inner layer refused, or one the deadline left no time for,
    is never announced."""

    stage: str
    tenant: str
    delay_s: float
