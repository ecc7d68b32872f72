"""Client-side adaptive throttling: refuse locally a share of the calls a rejecting dependency
would refuse anyway (Google SRE book; see :mod:`ragguard.overload._throttle`).

A gate of attempt scope, outside the adaptive limit and the breaker. ``enter`` counts the attempt
and refuses it with the throttle's probability (:class:`~ragguard.Overloaded`, reason
``throttled``); ``exit`` counts it accepted unless the dependency rejected it (a ``REJECTION`` as
the chain classified the error, ``Call.outcome``: 429, 529, ``RESOURCE_EXHAUSTED``, an overload
event in a stream; or a nested stage's quota or overload refusal). An attempt that never reached
the dependency (this stage's own breaker or limit refused it, or the deadline was spent) is not
counted at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from .._context import current_tenant
from .._errors import BreakerOpen, DeadlineExceeded, Overloaded
from ..outcomes import outcome_of
from ..overload import Throttled
from ..overload._priority import current_priority
from ..overload._throttle import AdaptiveThrottle, rejects
from ..pipeline import Call, Scope

if TYPE_CHECKING:
    from ._shapes import Bound, Stage

__all__ = ["ThrottleLayer", "build", "throttle_for"]


class ThrottleLayer:
    """Throttles the attempts of stage ``stage`` through ``throttle``."""

    scope: ClassVar[Scope] = "attempt"
    __slots__ = ("_bus", "_quota_of", "stage", "throttle")

    def __init__(self, stage: Stage, throttle: AdaptiveThrottle) -> None:
        self.stage = stage.name
        self.throttle = throttle
        self._quota_of = stage.context.quota_of
        self._bus = stage.context.bus

    def enter(self, call: Call) -> Any:
        throttle = self.throttle
        if throttle.allow():
            return None
        tenant = current_tenant()
        if self._bus.active:
            self._bus.emit(Throttled(self.stage, tenant, throttle.probability()))
        priority = current_priority() or self._quota_of(tenant).priority
        raise Overloaded(self.stage, throttle.retry_after_s(), "throttled", priority=priority, tenant=tenant)

    async def enter_async(self, call: Call) -> Any:  # pragma: no cover - enter never waits
        return self.enter(call)

    def exit(self, call: Call, token: Any, exc: BaseException | None) -> BaseException | None:
        throttle = self.throttle
        if exc is None or not isinstance(exc, Exception):
            throttle.accepted()  # answered, or cancelled by us: not refused by the dependency
        elif isinstance(exc, (BreakerOpen, DeadlineExceeded)) or (
            isinstance(exc, Overloaded) and exc.stage == self.stage
        ):
            throttle.forget()  # refused here, before reaching the dependency
        elif not rejects(call.outcome or outcome_of(exc)):
            throttle.accepted()
        return None


def throttle_for(stage: Stage) -> AdaptiveThrottle:
    """The client-side throttle of ``stage`` (built once from its policy's ``throttle``)."""

    def make() -> AdaptiveThrottle:
        p = stage.policy.throttle
        if p is None:
            raise ValueError(f"stage {stage.name!r} has no throttle policy")
        return AdaptiveThrottle(**p.model_dump(), clock=stage.clock, rng=stage.context.rng)

    return stage.part("throttle", make)


def build(stage: Stage, bound: Bound) -> ThrottleLayer | None:
    if stage.policy.throttle is None:
        return None
    return ThrottleLayer(stage, throttle_for(stage))
