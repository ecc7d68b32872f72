"""The adaptive concurrency limit: each attempt of a stage takes a slot of its dependency's limit.

A gate of attempt scope, inside the retries and any hedge (so each attempt, and each hedged leg,
takes its own slot and a retry or a hedge into a full dependency is shed like any call) and
outside the breaker and the attempt timer (so a shed call never reaches the breaker, and the
latency sampled is the dependency's). ``enter`` admits at once while the stage's limiter has room
and nobody queues; otherwise the call queues by priority (``enter_async``) for at most the policy's
``max_wait_s``, cut to what the deadline leaves after ``min_attempt_s``, or is shed with
:class:`~ragguard.Overloaded` (see :mod:`ragguard.overload`). ``exit`` gives the slot back with
the attempt's latency as a sample: a success, or a timeout (the dependency was slow); a
cancellation or another failure gives it back unsampled, and an out-of-memory error backs the
limit off (the ``out_of_memory`` signal). A stream holds its slot until it ends and feeds no
samples.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, model_validator

from .._context import current_tenant
from .._errors import DeadlineExceeded
from ..deadline import current_expiry
from ..options._base import Options
from ..outcomes import Kind
from ..overload import AdaptiveLimiter, limiter_for
from ..overload._priority import current_priority
from ..pipeline import WAIT, Call, Scope

if TYPE_CHECKING:
    from ._stage import Bound, Stage

__all__ = ["AdaptiveLayer", "AdaptivePolicy", "build"]

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
      from the Guard's rng) the limit is pinned to ``probe_limit`` for ``probe_samples`` calls to
      re-measure ``min_rtt`` (Envoy's minRTT window); the first probe runs at start.
    - queue: over the limit a call waits up to ``max_wait_s`` seconds (cut to its deadline); the
      queue holds ``max_queue`` x limit calls, and from ``early_queue`` x limit on it sheds calls
      with a rising probability (lowest priority, then heaviest tenant first). ``max_queue: 0``
      sheds at once.
    - ``usage_window_s``: the time constant (seconds) of a tenant's recent admissions, counted in
      its usage when choosing whom to shed.
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


class AdaptiveLayer:
    """Admits each attempt of stage ``stage`` through ``limiter`` (see the module docstring)."""

    scope: ClassVar[Scope] = "attempt"
    holds: ClassVar[bool] = True  # a permit: held until a sync call's worker thread returns
    __slots__ = ("_classify", "_oom", "_quota_of", "clock", "limiter", "max_wait_s", "min_attempt_s")

    def __init__(self, stage: Stage, limiter: AdaptiveLimiter) -> None:
        policy = stage.policy.adaptive
        assert policy is not None
        self.limiter = limiter
        self.clock = stage.clock
        self.max_wait_s = policy.max_wait_s
        self.min_attempt_s = max(stage.policy.min_attempt_s, 0.0)
        self._oom = "out_of_memory" in policy.signals
        self._quota_of = stage.context.quota_of
        self._classify = stage.context.classify

    def enter(self, call: Call) -> Any:
        permit = self.limiter.try_acquire(current_tenant())
        return WAIT if permit is None else permit

    async def enter_async(self, call: Call) -> Any:
        tenant = current_tenant()
        priority = current_priority() or self._quota_of(tenant).priority
        wait = self.max_wait_s
        by_deadline = False
        expiry = current_expiry()
        if expiry is not None:
            left = expiry.left() - self.min_attempt_s
            if left < wait:
                wait, by_deadline = left, True
        return await self.limiter.acquire(tenant, priority, wait, by_deadline)

    def exit(self, call: Call, token: Any, exc: BaseException | None) -> BaseException | None:
        limiter = self.limiter
        if call.stream:
            limiter.release(token, None)
        elif exc is None:
            limiter.release(token, self.clock() - token.started)
        elif not isinstance(exc, Exception):
            limiter.release(token, None)  # cancelled: says nothing of the dependency
        elif (outcome := self._classify(exc)).kind is Kind.TIMEOUT or isinstance(exc, DeadlineExceeded):
            elapsed = self.clock() - token.started
            base = limiter.gradient.min_rtt or 0.0
            limiter.release(token, elapsed if elapsed > base else None)  # slow: a (long) sample
        else:
            limiter.release(token, None)
            if self._oom and outcome.out_of_memory:
                limiter.press("out_of_memory")
        return None


def build(stage: Stage, bound: Bound) -> AdaptiveLayer | None:
    if stage.policy.adaptive is None:
        return None
    return AdaptiveLayer(stage, limiter_for(stage))
