"""Client-side adaptive throttling, after Google's SRE book (chapter 21, "Handling Overload").

Over the last ``window_s`` seconds of the Guard's clock, ``requests`` counts the calls the stage
wanted to make (those refused here included) and ``accepts`` the calls its dependency accepted
(did not reject as overloaded). A new call is refused locally with probability::

    P(reject) = min(max_reject, max(0, (requests - k * accepts) / (requests + 1)))

With ``k = 2`` the client sends up to about twice what the dependency accepts: while it accepts
everything nothing is refused; as it rejects more, the client backs off smoothly instead of in
open/closed steps, and ``max_reject`` (< 1) keeps a trickle of calls probing for its recovery.

Counts live in ``buckets`` slots of ``window_s / buckets`` seconds each, rotated on the clock, so
each call costs O(1).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from .._clock import Clock
from ..outcomes import Kind, Outcome, outcome_of

__all__ = ["AdaptiveThrottle", "is_rejection", "rejects"]


def rejects(outcome: Outcome) -> bool:
    """True when ``outcome`` says the dependency refused the call for lack of capacity
    (``REJECTION``: 429, 529, 503 with a stated wait, ``RESOURCE_EXHAUSTED``, ``UNAVAILABLE`` with
    pushback, Anthropic's ``overloaded_error`` inside a stream, the SDKs' ``RateLimitError``), or
    a :class:`~ragguard.QuotaExceeded` or :class:`~ragguard.Overloaded` raised by the dependency
    (a nested guarded stage). Not a timeout (a slow answer was still accepted) nor a failure (an
    outage is the breaker's)."""
    return outcome.kind is Kind.REJECTION or (
        outcome.kind is Kind.REFUSED and outcome.reason in ("quota", "overloaded")
    )


def is_rejection(exc: BaseException, classify: Callable[[BaseException], Outcome] = outcome_of) -> bool:
    """:func:`rejects` for the outcome of ``exc``: the one its chain recorded
    (:func:`ragguard.outcomes.outcome_of`), or ``classify``'s."""
    return rejects(classify(exc))


class AdaptiveThrottle:
    """The throttle of one stage (see the module docstring). ``clock``: monotonic seconds;
    ``rng``: a seeded random source for the refusals."""

    __slots__ = (
        "_accepts",
        "_cur",
        "_requests",
        "_slot_s",
        "_total_accepts",
        "_total_requests",
        "clock",
        "k",
        "max_reject",
        "refused",
        "rng",
    )

    def __init__(
        self,
        *,
        k: float = 2.0,
        window_s: float = 60.0,
        max_reject: float = 0.9,
        buckets: int = 20,
        clock: Clock,
        rng: random.Random,
    ) -> None:
        self.k = k
        self.max_reject = max_reject
        self.clock = clock
        self.rng = rng
        self._slot_s = window_s / buckets
        self._requests = [0] * buckets
        self._accepts = [0] * buckets
        self._total_requests = 0
        self._total_accepts = 0
        self._cur = math.floor(clock() / self._slot_s)
        self.refused = 0

    def _rotate(self) -> int:
        slot = math.floor(self.clock() / self._slot_s)
        cur = self._cur
        if slot != cur:
            n = len(self._requests)
            for s in range(cur + 1, min(slot, cur + n) + 1):
                i = s % n
                self._total_requests -= self._requests[i]
                self._total_accepts -= self._accepts[i]
                self._requests[i] = self._accepts[i] = 0
            self._cur = slot
        return slot % len(self._requests)

    def probability(self) -> float:
        """The current probability (0..``max_reject``) that a new call is refused."""
        self._rotate()
        requests = self._total_requests
        p = (requests - self.k * self._total_accepts) / (requests + 1)
        return 0.0 if p <= 0.0 else min(self.max_reject, p)

    def allow(self) -> bool:
        """Count one call the stage wants to make; False when it is refused here."""
        i = self._rotate()
        self._requests[i] += 1
        self._total_requests += 1
        requests = self._total_requests
        p = (requests - 1 - self.k * self._total_accepts) / requests  # as before this call
        if p > 0.0 and self.rng.random() < min(self.max_reject, p):
            self.refused += 1
            return False
        return True

    def forget(self) -> None:
        """Take back the last call counted by :meth:`allow`: it never reached the dependency."""
        i = self._rotate()
        if self._requests[i] > 0:
            self._requests[i] -= 1
            self._total_requests -= 1

    def accepted(self) -> None:
        """The dependency accepted a call (answered, or failed for a reason of its own)."""
        i = self._rotate()
        self._accepts[i] += 1
        self._total_accepts += 1

    @property
    def requests(self) -> int:
        self._rotate()
        return self._total_requests

    @property
    def accepts(self) -> int:
        self._rotate()
        return self._total_accepts

    def retry_after_s(self) -> float:
        """About when the refusal rate falls: one slot of the window (seconds)."""
        return self._slot_s
