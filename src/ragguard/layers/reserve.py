"""The reserve: time a stage with a fallback keeps for it under a deadline.

A gate of item scope, just inside the fallback. Under a deadline, the layers inside it (the
deadline check, the retries and their backoff, each attempt's timer) run under a deadline that
ends ``reserve`` seconds before the request's, so a primary that hangs is cut while the fallback
can still answer in time; the fallback runs after the gate has put the request's deadline back.
Without it, a fallback of a hung stage answers just after the deadline: at a front door, a 504.

How long (:class:`ragguard.ReservePolicy`): by default learnt from what the fallback chain took
when it answered (from the failure to the answer, earlier fallbacks' misses included: the chain
as it really runs, not only its first fallback), the ``percentile`` of the last ``window`` such
latencies times ``margin``, within ``[min_s, max_s]``; or ``fixed_s``. Never more than
``max_share`` of the time left when the stage starts. A stream keeps it until its first item (the
commit point: its fallback serves only before it), and its fallback's latency runs to its first
item. The latencies are this process's own (a fallback is a local answer).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from ..deadline import Expiry, current_expiry, restore, shorten
from ..pipeline import Call, Scope

if TYPE_CHECKING:
    from ..policy import ReservePolicy
    from ._stage import Bound, Stage

__all__ = ["Reserve", "ReserveLayer", "build", "learner"]


class Reserve:
    """A stage's reserve (one per stage, shared by its functions): :meth:`seconds` for a call
    that starts with ``left`` seconds, learnt by :meth:`observe` from the fallback's latencies."""

    __slots__ = ("_latencies", "_margin", "_max_s", "_min_s", "_quantile", "fixed_s", "learnt_s", "max_share")

    def __init__(self, policy: ReservePolicy) -> None:
        self.fixed_s = policy.fixed_s
        self.max_share = policy.max_share
        self._min_s = policy.min_s
        self._max_s = policy.max_s
        self._quantile = policy.percentile / 100.0
        self._margin = policy.margin
        self._latencies: deque[float] = deque(maxlen=policy.window)
        self.learnt_s = policy.min_s
        """The learnt reserve, seconds: the floor until a fallback has answered."""

    def seconds(self, left: float) -> float:
        """The time to keep back from a deadline ``left`` seconds away (0 when off)."""
        keep = self.learnt_s if self.fixed_s is None else self.fixed_s
        cap = self.max_share * left
        return keep if keep < cap else cap

    def observe(self, latency_s: float) -> None:
        """The fallback chain answered ``latency_s`` seconds after the failure it replaced."""
        if not latency_s >= 0.0 or math.isinf(latency_s):
            return
        latencies = self._latencies
        latencies.append(latency_s)
        ordered = sorted(latencies)  # at most ``window`` (100) values, once per fallback answer
        at = ordered[max(0, math.ceil(self._quantile * len(ordered)) - 1)]  # nearest rank
        self.learnt_s = min(max(at * self._margin, self._min_s), self._max_s)

    @property
    def latencies(self) -> tuple[float, ...]:
        """The fallback's recent latencies the reserve is learnt from, oldest first."""
        return tuple(self._latencies)


class ReserveLayer:
    """Runs what is inside it under the request's deadline less ``reserve.seconds(left)``."""

    scope: ClassVar[Scope] = "item"
    exits_none: ClassVar[bool] = False  # nothing kept back: nothing to put back
    __slots__ = ("reserve", "stage")

    def __init__(self, stage: str, reserve: Reserve) -> None:
        self.stage = stage
        self.reserve = reserve

    def enter(self, call: Call) -> Any:
        if call.items:  # past a stream's commit point no fallback serves it: nothing to keep
            return None
        expiry = current_expiry()
        if expiry is None:
            return None
        left = expiry.left()
        if left <= 0.0:
            return None
        keep = self.reserve.seconds(left)
        if keep <= 0.0:
            return None
        return shorten(Expiry(expiry.at - keep, expiry.clock))

    async def enter_async(self, call: Call) -> Any:  # pragma: no cover - enter never waits
        return self.enter(call)

    def exit(self, call: Call, token: Any, exc: BaseException | None) -> BaseException | None:
        if token is None:  # the stream driver exits every gate it entered
            return None
        restore(token)
        return None


def _reserve(stage: Stage) -> Reserve:
    return stage.part("reserve", lambda: Reserve(stage.policy.reserve))


def learner(stage: Stage) -> Callable[[float], None] | None:
    """What the fallback layer tells a fallback's latency to (None: the reserve learns nothing,
    being fixed or off)."""
    policy = stage.policy.reserve
    if policy.fixed_s is not None:
        return None
    return _reserve(stage).observe


def build(stage: Stage, bound: Bound) -> ReserveLayer | None:
    """Only for a stage with fallbacks that may answer a deadline (a route's answer only a
    caller's error) and a reserve that is not off."""
    if stage.policy.reserve.off or not stage.fallbacks_for(bound):
        return None
    return ReserveLayer(stage.name, _reserve(stage))
