"""Client-side adaptive throttling: refuse locally a share of the calls a rejecting dependency
would refuse anyway (Google SRE book; see :mod:`ragguard.overload._throttle`).

A gate of attempt scope, outside the adaptive limit and the breaker. ``enter`` counts the attempt
and refuses it with the throttle's probability (:class:`~ragguard.Overloaded`, reason
``throttled``); ``exit`` counts it accepted unless the dependency rejected it (a ``REJECTION`` as
:func:`ragguard.outcomes.classify` says: 429, 529, ``RESOURCE_EXHAUSTED``, an overload event in a
stream; or a nested stage's quota or overload refusal). An attempt that never reached
the dependency (this stage's own breaker or limit refused it, or the deadline was spent) is not
counted at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field

from .._context import current_tenant
from .._errors import BreakerOpen, DeadlineExceeded, Overloaded
from ..options._base import Options
from ..overload import AdaptiveThrottle, Throttled, is_rejection, throttle_for
from ..overload._priority import current_priority
from ..pipeline import Call, Scope

if TYPE_CHECKING:
    from ._stage import Bound, Stage

__all__ = ["ThrottleLayer", "ThrottlePolicy", "build"]

class ThrottlePolicy(Options):
    """Client-side adaptive throttling of a stage whose dependency rejects calls (Google SRE book,
    "Handling Overload"): a call is refused locally with probability
    ``min(max_reject, max(0, (requests - k * accepts) / (requests + 1)))`` over the last
    ``window_s`` seconds of the Guard's clock.

    - ``k``: how many times the accepted calls the client may send, >= 1 (the book's 2).
    - ``window_s``: seconds of history, (0, 3600] (the book's two minutes; default 60).
    - ``max_reject``: the highest refusal probability, [0, 1): a trickle always probes.
    """

    k: float = Field(default=2.0, ge=1, le=100)
    window_s: float = Field(default=60.0, gt=0, le=3600)
    max_reject: float = Field(default=0.9, ge=0, lt=1)


class ThrottleLayer:
    """Throttles the attempts of stage ``stage`` through ``throttle``."""

    scope: ClassVar[Scope] = "attempt"
    __slots__ = ("_bus", "_classify", "_quota_of", "stage", "throttle")

    def __init__(self, stage: Stage, throttle: AdaptiveThrottle) -> None:
        self.stage = stage.name
        self.throttle = throttle
        self._quota_of = stage.context.quota_of
        self._bus = stage.context.bus
        self._classify = stage.context.classify

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
        elif not is_rejection(exc, self._classify):
            throttle.accepted()
        return None


def build(stage: Stage, bound: Bound) -> ThrottleLayer | None:
    if stage.policy.throttle is None:
        return None
    return ThrottleLayer(stage, throttle_for(stage))
