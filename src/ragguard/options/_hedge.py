"""The hedge layer's options (:mod:`ragguard.layers._hedge`): when a second attempt is sent.
"""

from __future__ import annotations

from pydantic import Field

from ._base import Options

__all__ = ["HedgePolicy"]


class HedgePolicy(Options):
    """Hedged requests for an idempotent stage (retrieval, rerank): when an attempt has not
    answered after about the stage's ``quantile`` latency, a second attempt is sent; the first
    success wins and the other is cancelled; an error never wins the race.

    - ``quantile``: the hedge delay is this quantile of the stage's recent attempt latencies,
      (0, 1) (0.95: the P95), at least ``min_delay_s`` and at most ``max_delay_s`` (seconds; None:
      no cap); no hedge until ``min_samples`` latencies were seen (of the last ``samples``).
    - budget, as the retry budget's: hedges add at most ``budget_ratio`` of the stage's calls
      over ``budget_window_s`` seconds, plus ``budget_min_per_s`` per second (default 10%, 0).
    """

    quantile: float = Field(default=0.95, gt=0, lt=1)
    min_delay_s: float = Field(default=0.001, ge=0, le=3600)
    max_delay_s: float | None = Field(default=None, gt=0, le=3600)
    min_samples: int = Field(default=20, ge=1, le=100_000)
    samples: int = Field(default=256, ge=16, le=100_000)
    budget_ratio: float = Field(default=0.1, ge=0, le=1)
    budget_min_per_s: float = Field(default=0.0, ge=0, le=1e6)
    budget_window_s: float = Field(default=10.0, gt=0, le=3600)
