"""The Generic Cell Rate Algorithm: one rate limit kept as one number, for requests and tokens alike.

GCRA is the virtual scheduling algorithm of the ATM Forum's Traffic Management Specification 4.0
(af-tm-0056.000, 1996, section 4.4.2; ITU-T I.371). It admits exactly what a token bucket of
``burst`` tokens refilled at ``rate`` tokens per second admits, but keeps a single number per
limited thing instead of a count and a timestamp: the theoretical arrival time ``tat``, the time at
which the bucket would be full again. A step of ``n`` tokens (a request costs 1; a stream's tokens
cost their count) at time ``now``::

    interval  = 1 / rate                   seconds per token (the spec's increment T)
    tolerance = burst * interval           how far tat may run ahead of now (the spec's tau + T)
    tat'      = max(tat, now) + n * interval
    wait      = tat' - now - tolerance     <= EPSILON_S: the n tokens fit now; else seconds until

Taking the step stores ``tat'``; giving ``n`` tokens back subtracts ``n * interval`` from ``tat``
(a tat in the past is a full bucket, so a refund never credits more than ``burst``). Every operation
is O(1) and reads no clock: ``now`` is passed in. A :class:`Rate` holds no tat of its own, so one
object serves every tenant of one quota (the tenants keep only their floats).

The local quotas (requests: :mod:`ragguard.quotas._local`), the token accounts (pacing and token
quotas: :mod:`ragguard.quotas._tokens`) and the Redis backends' Lua scripts (``GCRA`` in
:mod:`ragguard.redis._scripts`, tested against this module on a real redis-server) all step with
this arithmetic.
"""

from __future__ import annotations

__all__ = ["EPSILON_S", "Rate"]

EPSILON_S = 1e-9
"""A wait this short is float noise of a bucket already due: the tokens fit now."""


class Rate:
    """``rate_per_s`` tokens per second (> 0) with a burst of ``burst`` tokens (>= 1; a quota's
    ``rate_burst`` when it sets none): ``interval_s`` seconds per token and ``tolerance_s`` seconds
    of tolerance (see the module docstring). The ``tat`` is the caller's."""

    __slots__ = ("burst", "interval_s", "tolerance_s")

    def __init__(self, rate_per_s: float, burst: int) -> None:
        self.burst = burst
        self.interval_s = 1.0 / rate_per_s
        self.tolerance_s = self.burst * self.interval_s

    def step(self, tat: float, now: float, n: float = 1) -> tuple[float, float]:
        """``(tat', wait)`` of ``n`` tokens at ``now`` from a bucket at ``tat``; nothing is kept."""
        after = (tat if tat > now else now) + n * self.interval_s
        return after, after - now - self.tolerance_s

    def take(self, tat: float, now: float) -> float | None:
        """The ``tat'`` after one token taken at ``now`` if it fits now, else None."""
        after = (tat if tat > now else now) + self.interval_s  # step(tat, now), inlined: the hot path
        return after if after - now - self.tolerance_s <= EPSILON_S else None

    def give_back(self, tat: float, n: float = 1) -> float:
        """The ``tat`` after ``n`` tokens taken earlier are given back (n < 0: charged late)."""
        return tat - n * self.interval_s

    def __repr__(self) -> str:
        return f"Rate({1.0 / self.interval_s:g}/s, burst={self.burst})"
