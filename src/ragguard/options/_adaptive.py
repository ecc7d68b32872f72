"""The adaptive layer's options (:mod:`ragguard.layers._adaptive`): the adaptive concurrency limit,
its queue and the signals that press it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ._base import Options

__all__ = ["AdaptivePolicy", "OverloadSignal"]


OverloadSignal = Literal["loop_lag", "pool_wait", "out_of_memory"]


class AdaptivePolicy(Options):
    """An adaptive concurrency limit on a stage's calls to its dependency (see
    :mod:`ragguard.overload`): the limit follows the dependency's latency, and calls over it queue
    by priority or are shed with :class:`~ragguard.Overloaded`.

    - ``min_limit`` (floor) <= ``initial_limit`` <= ``max_limit`` (ceiling): calls in flight at
      once, 1-100,000.
    - ``tolerance``: how far above the baseline latency (``min_rtt``) a window's latency may be
      before the limit shrinks, as a share (0.5 = 50%; Envoy's ``buffer``), 0-10.
    - ``percentile``: the latency of a window is this quantile of its samples (0-1], Envoy's p50.
    - ``window_s``: the limit is recomputed at most once per window (seconds, (0, 60]), from at
      least ``min_samples`` finished calls.
    - ``smoothing``: the share of the way to the new target the limit moves per window, (0, 1].
    - ``growth``: the limit grows only up to ``growth`` x the most calls in flight in the window
      (failsafe-go's rule: a limit nobody uses does not climb), >= 1.
    - baseline probes: every ``probe_interval_s`` seconds (plus up to ``probe_jitter`` of it, drawn
      from the Guard's rng) the limit is pinned to ``probe_limit`` for ``probe_samples`` calls
      admitted after the probe began to re-measure ``min_rtt`` (Envoy's minRTT window); the first
      probe runs at start.
    - queue: over the limit a call waits up to ``max_wait_s`` seconds (cut to its deadline); the
      queue holds ``max_queue`` x limit calls, and from ``early_queue`` x limit on it sheds calls
      with a rising probability (lowest priority, then heaviest tenant first). ``max_queue: 0``
      sheds at once.
    - ``usage_window_s``: the time constant (seconds) of a tenant's recent calls (admitted or
      shed), counted in its usage when choosing whom to shed.
    - ``signals``: outside pressure that backs the limit off by ``backoff`` (a factor in (0, 1)),
      at most once per window: ``loop_lag`` (a loop stall of ``loop_lag_s`` seconds or more
      reported by :class:`ragguard.monitors.StallDetector`), ``pool_wait`` (a Redis pool monitor's
      slow acquire or timeout), ``out_of_memory`` (a call that ran out of memory).
    """

    min_limit: int = Field(default=1, ge=1, le=100_000)
    max_limit: int = Field(default=256, ge=1, le=100_000)
    initial_limit: int = Field(default=16, ge=1, le=100_000)
    tolerance: float = Field(default=0.5, ge=0, le=10)
    percentile: float = Field(default=0.5, gt=0, le=1)
    window_s: float = Field(default=0.25, gt=0, le=60)
    min_samples: int = Field(default=8, ge=1, le=100_000)
    smoothing: float = Field(default=0.5, gt=0, le=1)
    growth: float = Field(default=2.0, ge=1, le=100)
    probe_interval_s: float = Field(default=30.0, gt=0, le=86_400)
    probe_jitter: float = Field(default=0.15, ge=0, le=1)
    probe_samples: int = Field(default=25, ge=1, le=100_000)
    probe_limit: int = Field(default=3, ge=1, le=100_000)
    backoff: float = Field(default=0.8, gt=0, lt=1)
    max_queue: float = Field(default=2.0, ge=0, le=100)
    early_queue: float = Field(default=1.0, ge=0, le=100)
    max_wait_s: float = Field(default=1.0, ge=0, le=3600)
    usage_window_s: float = Field(default=1.0, gt=0, le=3600)
    signals: tuple[OverloadSignal, ...] = ("loop_lag", "out_of_memory")
    loop_lag_s: float = Field(default=0.05, gt=0, le=60)

    @model_validator(mode="after")
    def _ordered(self) -> AdaptivePolicy:
        if not self.min_limit <= self.initial_limit <= self.max_limit:
            raise ValueError(
                f"need min_limit <= initial_limit <= max_limit, got {self.min_limit}, "
                f"{self.initial_limit}, {self.max_limit}"
            )
        if self.early_queue > self.max_queue:
            raise ValueError(f"early_queue ({self.early_queue}) must be <= max_queue ({self.max_queue})")
        return self
