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

import bisect
import math
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._deadline import current_expiry, restore, shorten
from .._errors import DeadlineExceeded
from ..pipeline import NO_EXIT, Call
from ._earlier import EarlierDeadline
from ._share import note_share

if TYPE_CHECKING:
    from ..options import ReservePolicy
    from ._shapes import Bound, Stage

__all__ = ["Reserve", "ReserveLayer", "build", "learner"]


class Reserve:
    """A stage's reserve (one per stage, shared by its functions): :meth:`seconds` for a call
    that starts with ``left`` seconds, learnt by :meth:`observe` from the fallback's latencies."""

    __slots__ = (
        "_margin", "_max_s", "_min_s", "_order", "_rank", "_sorted", "_window", "keep_s", "max_share",
    )  # fmt: skip

    def __init__(self, policy: ReservePolicy) -> None:
        self.max_share = policy.max_share
        self._min_s = policy.min_s
        self._max_s = policy.max_s
        self._rank = policy.percentile / 100.0
        self._margin = policy.margin
        self._window = policy.window
        self._order: deque[float] = deque()  # the recent latencies, oldest first
        self._sorted: list[float] = []  # the same, in order (the percentile is one index away)
        self.keep_s = policy.min_s if policy.fixed_s is None else policy.fixed_s
        """The reserve before the share cap, seconds: the fixed one, or the learnt one (the floor
        until a fallback has answered)."""

    @property
    def learnt_s(self) -> float:
        """The learnt reserve, seconds (the fixed one when the policy fixes it)."""
        return self.keep_s

    def seconds(self, left: float) -> float:
        """The time to keep back from a deadline ``left`` seconds away (0 when off)."""
        cap = self.max_share * left
        return self.keep_s if self.keep_s < cap else cap

    def observe(self, latency_s: float) -> None:
        """The fallback chain answered ``latency_s`` seconds after the failure it replaced. O(log
        n) to find, O(n) pointer moves for the window's n (at most 10,000) sorted latencies."""
        if not 0.0 <= latency_s < math.inf:  # NaN, negative, infinite: no clock measures that
            return
        order, ordered = self._order, self._sorted
        if len(order) == self._window:
            del ordered[bisect.bisect_left(ordered, order.popleft())]
        order.append(latency_s)
        bisect.insort(ordered, latency_s)
        keep = ordered[math.ceil(self._rank * len(ordered)) - 1] * self._margin  # nearest rank
        self.keep_s = self._min_s if keep < self._min_s else self._max_s if keep > self._max_s else keep

    @property
    def latencies(self) -> tuple[float, ...]:
        """The fallback's recent latencies the reserve is learnt from, oldest first."""
        return tuple(self._order)


class ReserveLayer(EarlierDeadline):
    """Runs what is inside it under the request's deadline less ``reserve.seconds(left)``; with
    ``share`` below 1 (the share layer fused in, see :mod:`ragguard.layers._registry`), under the
    stage's share of the deadline less the reserve, the share's deadline left on the call
    (``Call.share_at``) for the fallback outside it to serve under."""

    __slots__ = ("_rest", "reserve", "share", "stage")

    def __init__(self, stage: str, reserve: Reserve | None, share: float = 1.0) -> None:
        self.stage = stage
        self.reserve = reserve  # None: the stage's share alone (no reserve kept)
        self.share = share
        self._rest = 1.0 - share

    def enter(self, call: Call) -> Any:
        expiry = current_expiry()
        if expiry is None:
            return NO_EXIT
        if call.items:  # a stream's later item: no fallback serves it, only its share holds
            own = call.share_expiry
            if own is None or own.at >= expiry.at:
                return NO_EXIT
            return shorten(own)
        at = expiry.at
        left = at - expiry.clock()
        if left <= 0.0:
            return NO_EXIT  # spent: the layers inside refuse the call themselves
        rest = self._rest
        if rest:  # ShareLayer.enter's deadline, which the fallback serves under too
            cut = rest * left
            at -= cut
            left -= cut
            call.share_at = at
            if call.stream:
                call.share_expiry = expiry.sooner(at)
        reserve = self.reserve
        if reserve is not None:
            keep, cap = reserve.keep_s, reserve.max_share * left  # reserve.seconds(left), inlined
            if cap < keep:
                keep = cap
            if keep > 0.0:
                return shorten(expiry.sooner(at - keep))
        if not rest:
            return NO_EXIT
        return shorten(call.share_expiry if call.stream else expiry.sooner(at))

    def exit(self, call: Call, token: Any, exc: BaseException | None) -> BaseException | None:
        restore(token)
        if self._rest and exc is not None and isinstance(exc, DeadlineExceeded):
            outer = current_expiry()
            if outer is not None and outer.left() > 0.0:  # the share ran out, not the request
                note_share(exc, self.stage, self.share)
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
