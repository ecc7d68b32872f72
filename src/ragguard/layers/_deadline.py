"""The deadline check: a call that cannot finish in time is refused before it queues or starts.

A gate of call scope, outermost of the admission gates: when the request's deadline (the caller's,
the tenant's ``timeout_s``, whichever is sooner; see :mod:`ragguard._deadline`) leaves less than the
stage's ``min_attempt_s``, the call raises :class:`~ragguard.DeadlineExceeded` at once instead of
taking a quota slot or a breaker permit for work it cannot finish. Each attempt is then bounded by
the timeout layer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from .._deadline import current_expiry
from .._errors import DeadlineExceeded
from ..pipeline import NO_EXIT, Call, Scope

if TYPE_CHECKING:
    from ._shapes import Bound, Stage

__all__ = ["DeadlineLayer", "build"]


class DeadlineLayer:
    """Refuses a call with less than ``min_attempt_s`` seconds (and never with none) left."""

    scope: ClassVar[Scope] = "call"
    __slots__ = ("_min_left", "stage")

    def __init__(self, stage: str, min_attempt_s: float) -> None:
        self.stage = stage
        self._min_left = min_attempt_s

    def enter(self, call: Call) -> Any:
        expiry = current_expiry()
        if expiry is not None:
            left = expiry.left()
            if left <= 0.0 or left < self._min_left:
                budget = None if left <= 0.0 else left
                raise DeadlineExceeded(
                    self.stage, budget, "no budget left", expiry.budget_s, set_by=expiry.set_by
                )
        return NO_EXIT

    async def enter_async(self, call: Call) -> Any:  # pragma: no cover - enter never waits
        return self.enter(call)

    def exit(self, call: Call, token: Any, exc: BaseException | None) -> BaseException | None:
        return None  # pragma: no cover - enter answers NO_EXIT


def build(stage: Stage, bound: Bound) -> DeadlineLayer | None:
    """Only where something can queue before the first attempt (a quota or limit admission, a
    preset layer): elsewhere the timeout layer's own check at each attempt is the same check."""
    if not stage.admits_before_attempt(bound):
        return None
    return DeadlineLayer(stage.name, max(stage.policy.min_attempt_s, 0.0))
