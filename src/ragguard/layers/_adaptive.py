"""The adaptive concurrency limit: each attempt of a stage takes a slot of its dependency's limit.

A gate of attempt scope, inside the retries and any hedge (so each attempt, and each hedged leg,
takes its own slot and a retry or a hedge into a full dependency is shed like any call) and
outside the breaker and the attempt timer (so a shed call never reaches the breaker, and the
latency sampled is the dependency's). ``enter`` admits at once while the stage's limiter has room
and nobody queues; otherwise the call queues by priority (``enter_async``) for at most the policy's
``max_wait_s``, cut to what the deadline leaves after ``min_attempt_s``, or is shed with
:class:`~ragguard.Overloaded` (see :mod:`ragguard.overload`). ``exit`` gives the slot back with
the attempt's latency as a sample: a success's latency; or, for an attempt that ran out of time
after longer than the baseline (its attempt timer or the deadline cut it, or it was cancelled once
the request's deadline had passed: the front doors cancel a handler then), a censored sample, "longer
than its caller allowed" (see :mod:`ragguard.overload._gradient`). Another cancellation or failure
gives it back unsampled, and an out-of-memory error backs the limit off (the ``out_of_memory``
signal). A stream holds its slot until it ends and feeds no samples.
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from .._clock import timers_of
from .._context import current_tenant
from .._deadline import current_expiry
from ..options import AdaptivePolicy
from ..outcomes import Kind, outcome_of
from ..overload._gradient import LimitSettings
from ..overload._limiter import AdaptiveLimiter, QueueSettings
from ..overload._priority import current_priority
from ..pipeline import WAIT, Call, Scope

if TYPE_CHECKING:
    from ._shapes import Bound, Stage

__all__ = ["AdaptiveLayer", "build", "limiter_for"]


class AdaptiveLayer:
    """Admits each attempt of stage ``stage`` through ``limiter`` (see the module docstring)."""

    scope: ClassVar[Scope] = "attempt"
    holds: ClassVar[bool] = True  # a permit: held until a sync call's worker thread returns
    __slots__ = ("_oom", "_quota_of", "clock", "limiter", "max_wait_s", "min_attempt_s")

    def __init__(self, stage: Stage, limiter: AdaptiveLimiter) -> None:
        policy = stage.policy.adaptive
        assert policy is not None
        self.limiter = limiter
        self.clock = stage.clock
        self.max_wait_s = policy.max_wait_s
        self.min_attempt_s = max(stage.policy.min_attempt_s, 0.0)
        self._oom = "out_of_memory" in policy.signals
        self._quota_of = stage.context.quota_of

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
        elif not isinstance(exc, Exception):  # cancelled: out of time if the deadline has passed
            expiry = current_expiry()
            if expiry is not None and expiry.left() <= 0.0:
                self._out_of_time(token)
            else:
                limiter.release(token, None)  # says nothing of the dependency
        elif (outcome := call.outcome or outcome_of(exc)).kind in _SLOW:
            self._out_of_time(token)
        else:
            limiter.release(token, None)
            if self._oom and outcome.out_of_memory:
                limiter.press("out_of_memory")
        return None

    def _out_of_time(self, token: Any) -> None:
        """Give back the slot of an attempt cut by its timer or the deadline: a censored sample
        when it had longer than the baseline (a shorter budget says nothing of the dependency)."""
        elapsed = self.clock() - token.started
        if elapsed > (self.limiter.gradient.min_rtt or 0.0):
            self.limiter.release(token, elapsed, cut=True)
        else:
            self.limiter.release(token, None)


_SLOW = frozenset({Kind.TIMEOUT, Kind.DEADLINE})  # the stage's timeout or the deadline cut the attempt
_S = TypeVar("_S")


def _settings(kind: type[_S], policy: AdaptivePolicy) -> _S:
    """The ``kind`` settings (LimitSettings, QueueSettings: the mechanism's own view of the
    options) read from ``policy``, field by field: the policy is where the options live
    (tests/core/test_option_shapes.py holds the settings' defaults to the policy's)."""
    given = type(policy).model_fields
    return kind(**{f.name: getattr(policy, f.name) for f in fields(kind) if f.name in given})  # type: ignore[arg-type]


def limiter_for(stage: Stage) -> AdaptiveLimiter:
    """The adaptive limiter of ``stage`` (built once from its policy's ``adaptive``)."""

    def make() -> AdaptiveLimiter:
        p = stage.policy.adaptive
        if p is None:
            raise ValueError(f"stage {stage.name!r} has no adaptive policy")
        quota_of = stage.context.quota_of
        return AdaptiveLimiter(
            stage.name,
            _settings(LimitSettings, p),
            _settings(QueueSettings, p),
            clock=stage.clock,
            rng=stage.context.rng,
            timers=timers_of(stage.clock),
            weight_of=lambda tenant: quota_of(tenant).weight,
            event_bus=stage.context.bus,
        )

    return stage.part("limiter", make)


def build(stage: Stage, bound: Bound) -> AdaptiveLayer | None:
    if stage.policy.adaptive is None:
        return None
    return AdaptiveLayer(stage, limiter_for(stage))
