"""What hedged requests need besides the race itself: the stage's recent latencies.

:class:`LatencyTracker` keeps the last ``size`` latencies of a stage's attempts in a ring and
answers a quantile of them, recomputed every ``size // 16`` samples at most (a sorted copy of a
few hundred floats), so asking on every call costs a comparison.
"""

from __future__ import annotations

import math

__all__ = ["HedgeState", "LatencyTracker"]


class LatencyTracker:
    """The ``quantile`` (0..1) of the last ``size`` latencies (seconds); None until ``min_samples``
    were recorded."""

    __slots__ = ("_cached", "_count", "_every", "_i", "_ring", "_since", "min_samples", "quantile")

    def __init__(self, *, quantile: float = 0.95, size: int = 256, min_samples: int = 20) -> None:
        self.quantile = quantile
        self.min_samples = min_samples
        self._ring: list[float] = [0.0] * size
        self._i = 0
        self._count = 0
        self._since = 0
        self._every = max(1, size // 16)
        self._cached: float | None = None

    def add(self, latency_s: float) -> None:
        """Record one attempt's latency in seconds."""
        ring = self._ring
        ring[self._i] = latency_s
        self._i = (self._i + 1) % len(ring)
        if self._count < len(ring):
            self._count += 1
        self._since += 1
        if self._cached is None or self._since >= self._every:
            self._cached = None

    def value(self) -> float | None:
        """The quantile of the recorded latencies (seconds), None before ``min_samples``."""
        if self._count < self.min_samples:
            return None
        cached = self._cached
        if cached is None:
            ordered = sorted(self._ring[: self._count])
            rank = min(len(ordered) - 1, max(0, math.ceil(self.quantile * len(ordered)) - 1))
            cached = self._cached = ordered[rank]
            self._since = 0
        return cached

    @property
    def samples(self) -> int:
        return self._count


class HedgeState:
    """One stage's hedging state: its latency tracker, its budget (any object with ``on_call(now)``,
    ``try_spend() -> bool`` and ``refund()``, e.g. :class:`ragguard.layers._retry.RetryBudget`), and
    counters: ``fired`` hedges sent (their leg reached the dependency), ``won`` hedges that answered
    first, ``refused`` hedges the budget refused, ``skipped`` hedges not started because the
    deadline left too little time, ``blocked`` hedges started but refused by an inner layer (or
    cancelled) before they reached the dependency (their budget given back)."""

    __slots__ = (
        "blocked",
        "budget",
        "fired",
        "max_delay_s",
        "min_delay_s",
        "refused",
        "skipped",
        "tracker",
        "won",
    )

    def __init__(
        self, tracker: LatencyTracker, budget: object, *, min_delay_s: float, max_delay_s: float | None
    ) -> None:
        self.tracker = tracker
        self.budget = budget
        self.min_delay_s = min_delay_s
        self.max_delay_s = max_delay_s
        self.fired = 0
        self.won = 0
        self.refused = 0
        self.skipped = 0
        self.blocked = 0

    def delay(self) -> float | None:
        """Seconds to wait before hedging a call now, None while too few latencies are known."""
        q = self.tracker.value()
        if q is None:
            return None
        q = max(q, self.min_delay_s)
        if self.max_delay_s is not None and q > self.max_delay_s:
            q = self.max_delay_s
        return q

    def status(self) -> dict[str, object]:
        return {
            "delay_s": self.delay(),
            "fired": self.fired,
            "won": self.won,
            "refused": self.refused,
            "skipped": self.skipped,
            "blocked": self.blocked,
        }
