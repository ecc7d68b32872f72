"""Events of ragguard's own use of Redis, emitted on :data:`ragguard.events.bus`."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SharedStateDegraded", "SharedStateRestored"]


@dataclass(frozen=True, slots=True)
class SharedStateDegraded:
    """``component`` (``"breaker:<name>"`` or ``"quotas"``) lost Redis and now runs on local state.

    ``reason`` names the error that tipped it (e.g. ``"TimeoutError"``, ``"ConnectionError: ..."``).
    Exporters turn it into a gauge ``ragguard_shared_state_degraded{component} = 1``.
    """

    component: str
    reason: str


@dataclass(frozen=True, slots=True)
class SharedStateRestored:
    """``component`` reached Redis again and is back on shared state after ``degraded_for_s`` seconds."""

    component: str
    degraded_for_s: float
