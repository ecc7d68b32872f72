"""Overload protection: adaptive concurrency limits, priority shedding, client-side throttling, hedging.

Static quotas keep tenants from each other; these layers keep a dependency (and the service) from
more work than it can do. Each is configured per stage in its :class:`~ragguard.StagePolicy`::

    StagePolicy(
        adaptive=AdaptivePolicy(min_limit=2, max_limit=64),   # the limit follows the latency
        throttle=ThrottlePolicy(),                            # back off a rejecting dependency
        hedge=HedgePolicy(quantile=0.95),                     # idempotent stages only
    )

- :class:`AdaptiveLimiter`: the limit (a latency gradient, see :mod:`ragguard.overload._gradient`)
  and a bounded priority queue that sheds the lowest priority, then the heaviest tenant, gradually;
- :class:`AdaptiveThrottle`: Google SRE's client-side throttling;
- hedged requests: :mod:`ragguard.layers._hedge`.

The layers build these per stage (:func:`ragguard.layers._adaptive.limiter_for`,
:func:`ragguard.layers._throttle.throttle_for`); this package knows no Guard, stage or layer.

A request's priority comes from :func:`priority` (or a front door's ``x-priority`` header, which
lowers it and raises it only for a trusted caller), else
its tenant's quota (:class:`~ragguard.TenantQuota` ``priority``). Every refusal is a
:class:`~ragguard.Overloaded` carrying ``retry_after_s`` (UNAVAILABLE / 503 at the front doors).
Event-loop lag and Redis pool waits reach the limits through :func:`watch`; out-of-memory errors
are seen by the limit itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ..events import EventBus
from ._events import HedgeFired, LimitChanged, LoadShed, Throttled
from ._limiter import AdaptiveLimiter
from ._priority import priority

__all__ = ["HedgeFired", "LimitChanged", "LoadShed", "Throttled", "priority", "status", "watch"]


class Stages(Protocol):
    """What :func:`limiters`, :func:`status` and :func:`watch` read of a :class:`~ragguard.Guard`:
    its stages' names, and each stage's ``parts()`` (``"limiter"``, ``"throttle"``, ``"hedge"``:
    the overload layers' per-stage state) and ``policy``."""

    def stage_names(self) -> tuple[str, ...]: ...

    def stage(self, name: str) -> Any: ...


def limiters(guard: Stages) -> dict[str, AdaptiveLimiter]:
    """Stage name -> adaptive limiter, for every stage of ``guard`` that has built one."""
    out: dict[str, AdaptiveLimiter] = {}
    for name in guard.stage_names():
        limiter = guard.stage(name).parts().get("limiter")
        if limiter is not None:
            out[name] = limiter
    return out


def status(guard: Stages) -> dict[str, Any]:
    """A JSON-ready snapshot of ``guard``'s overload layers, per stage::

        {stage: {"limit": {...AdaptiveLimiter.status()}, "throttle": {"probability": float,
                 "requests": int, "accepts": int, "refused": int},
                 "hedge": {"delay_s": float | None, "fired": int, "won": int, "refused": int,
                           "skipped": int, "blocked": int}}}
    """
    out: dict[str, Any] = {}
    for name in guard.stage_names():
        parts = guard.stage(name).parts()
        entry: dict[str, Any] = {}
        limiter = parts.get("limiter")
        if limiter is not None:
            entry["limit"] = limiter.status()
        throttle = parts.get("throttle")
        if throttle is not None:
            entry["throttle"] = {
                "probability": round(throttle.probability(), 4),
                "requests": throttle.requests,
                "accepts": throttle.accepts,
                "refused": throttle.refused,
            }
        hedge = parts.get("hedge")
        if hedge is not None:
            entry["hedge"] = hedge.status()
        if entry:
            out[name] = entry
    return out


def watch(guard: Stages, bus: EventBus) -> Callable[[], None]:
    """Feed ``guard``'s adaptive limits from the monitors' events on ``bus``: a
    :class:`~ragguard.monitors.LoopStall` of at least a stage's ``loop_lag_s`` presses the stages
    with the ``loop_lag`` signal, a :class:`~ragguard.monitors.PoolExhausted` (slow acquire or
    timeout) those with ``pool_wait``. Returns the function that stops it.

    Subscribing to the global bus makes every guarded call build its events; give the monitors a
    bus of their own instead (``StallDetector(bus=b)`` with ``b = EventBus(parent=ragguard.events.bus)``
    still reaches the global listeners) and watch that one.
    """

    def on_event(event: Any) -> None:
        kind = type(event).__name__
        if kind == "LoopStall":
            lag = float(getattr(event, "duration_s", 0.0))
            for name, limiter in limiters(guard).items():
                p = guard.stage(name).policy.adaptive
                if p is not None and "loop_lag" in p.signals and lag >= p.loop_lag_s:
                    limiter.press("loop_lag")
        elif kind == "PoolExhausted" and getattr(event, "reason", "") in ("slow_acquire", "timeout"):
            for name, limiter in limiters(guard).items():
                p = guard.stage(name).policy.adaptive
                if p is not None and "pool_wait" in p.signals:
                    limiter.press("pool_wait")

    return bus.subscribe(on_event)
