"""Sliding windows of call outcomes (after resilience4j's count- and time-based windows).

Both keep running totals, so recording a call and reading the rates are O(1):

* :class:`CountWindow` remembers the outcome codes of the last ``size`` calls in a ring buffer;
  recording a call evicts the oldest one from the totals.
* :class:`TimeWindow` keeps one bucket per second for the last ``size`` seconds. Moving into a
  new second clears the buckets that fell out of the window (each bucket is cleared at most once
  per second of clock time, so the cost is amortised O(1) per call).

An outcome code is ``FAILED | SLOW`` bits: 0 success, 1 failure, 2 slow success, 3 slow failure;
or ``REJECTED`` (4) alone: the dependency turned the call away with a wait (see
:func:`~ragguard.breakers.counts_overloads`).

A window holding no failure, no slow call and no rejection (*clean*) can take successes in bulk:
:meth:`~CountWindow.add_successes` records ``n`` of them at once, for a breaker that counts the
successes of its clean, closed window and records them only when the window is next read (see
``CircuitBreaker``: a success that cannot trip anything then costs one increment).
"""

from __future__ import annotations

import math
from math import floor as _floor

__all__ = ["FAILED", "REJECTED", "SLOW", "CountWindow", "TimeWindow"]

FAILED = 1
SLOW = 2
REJECTED = 4


class CountWindow:
    """The outcomes of the last ``size`` recorded calls (``size`` >= 1)."""

    __slots__ = ("_codes", "_pos", "_size", "calls", "failures", "rejected", "slow")

    def __init__(self, size: int) -> None:
        self._size = size
        self._codes = bytearray(size)
        self._pos = 0
        self.calls = 0
        self.failures = 0
        self.slow = 0
        self.rejected = 0

    def record(self, code: int, now: float) -> None:
        """Add one call's outcome ``code``; ``now`` is unused (same signature as TimeWindow)."""
        pos = self._pos
        if self.calls == self._size:
            old = self._codes[pos]
            if old:
                self.failures -= old & FAILED
                self.slow -= (old >> 1) & 1
                self.rejected -= old >> 2
        else:
            self.calls += 1
        self._codes[pos] = code
        if code:
            self.failures += code & FAILED
            self.slow += (code >> 1) & 1
            self.rejected += code >> 2
        pos += 1
        self._pos = 0 if pos == self._size else pos

    def add_successes(self, n: int) -> None:
        """Record ``n`` fast successes at once; only for a clean window (every code in the ring is
        0 there, so only the position and the count move)."""
        size = self._size
        self._pos = (self._pos + n) % size
        calls = self.calls + n
        self.calls = calls if calls < size else size

    def clean_until(self) -> float:
        """The clock time before which successes may be added in bulk: never after it for a window
        holding a failure, a slow call or a rejection (-inf), else always (inf)."""
        return -math.inf if self.failures or self.slow or self.rejected else math.inf

    def expire(self, now: float) -> None:
        """Nothing expires by time in a count window."""

    def clear(self) -> None:
        self._codes[:] = bytes(self._size)
        self._pos = self.calls = self.failures = self.slow = self.rejected = 0


_NEVER = -(1 << 62)


class TimeWindow:
    """The outcomes recorded in the last ``size`` whole seconds of the clock (``size`` >= 1).

    A call recorded at clock time ``t`` lands in bucket ``floor(t)``; the window at time ``now``
    holds the buckets ``floor(now) - size + 1 .. floor(now)``. The latest second's bucket (the
    head) is kept in plain fields until the clock moves past it: recording a call there costs a few
    increments, no list index (a failing dependency has every attempt recorded here).
    """

    __slots__ = (
        "_bcalls",
        "_bfailures",
        "_brejected",
        "_bslow",
        "_hcalls",
        "_head",
        "_hfailures",
        "_hrejected",
        "_hslow",
        "_next",
        "_size",
        "calls",
        "failures",
        "rejected",
        "slow",
    )

    def __init__(self, size: int) -> None:
        self._size = size
        self._bcalls = [0] * size
        self._bfailures = [0] * size
        self._bslow = [0] * size
        self._brejected = [0] * size
        self._head = _NEVER
        self._next = float(_NEVER + 1)  # the clock time the head second ends: _head + 1
        self._hcalls = self._hfailures = self._hslow = self._hrejected = 0  # the head's bucket
        self.calls = 0
        self.failures = 0
        self.slow = 0
        self.rejected = 0

    def record(self, code: int, now: float) -> None:
        """Add one call's outcome ``code`` at clock time ``now`` (seconds)."""
        if now >= self._next:  # floor(now) > _head, without the floor() while in the head second
            self._advance(_floor(now))
        self._hcalls += 1
        self.calls += 1
        if code & FAILED:
            self._hfailures += 1
            self.failures += 1
        if code & SLOW:
            self._hslow += 1
            self.slow += 1
        if code & REJECTED:
            self._hrejected += 1
            self.rejected += 1

    def add_successes(self, n: int) -> None:
        """Record ``n`` fast successes at once, in the window's latest second (its head); only
        for a clean window, at a time before :meth:`clean_until`."""
        self._hcalls += n
        self.calls += n

    def clean_until(self) -> float:
        """The clock time before which successes may be added in bulk: the end of the window's
        latest second when it holds no failure, no slow call and no rejection (a later success may
        expire buckets first), else -inf."""
        dirty = self.failures or self.slow or self.rejected
        return -math.inf if dirty or self._head == _NEVER else self._head + 1.0

    def expire(self, now: float) -> None:
        """Drop the buckets older than the window at clock time ``now``."""
        sec = _floor(now)
        if sec > self._head:
            self._advance(sec)

    def _advance(self, sec: int) -> None:
        size = self._size
        if sec - self._head >= size:
            self.clear()
        else:
            calls, failures, slow, rejected = self._bcalls, self._bfailures, self._bslow, self._brejected
            i = self._head % size  # the head's bucket goes into its slot
            calls[i], failures[i], slow[i] = self._hcalls, self._hfailures, self._hslow
            rejected[i] = self._hrejected
            self._hcalls = self._hfailures = self._hslow = self._hrejected = 0
            for s in range(self._head + 1, sec + 1):
                i = s % size
                self.calls -= calls[i]
                self.failures -= failures[i]
                self.slow -= slow[i]
                self.rejected -= rejected[i]
                calls[i] = failures[i] = slow[i] = rejected[i] = 0
        self._head = sec
        self._next = sec + 1.0

    def clear(self) -> None:
        size = self._size
        self._bcalls[:] = [0] * size
        self._bfailures[:] = [0] * size
        self._bslow[:] = [0] * size
        self._brejected[:] = [0] * size
        self._hcalls = self._hfailures = self._hslow = self._hrejected = 0
        self.calls = self.failures = self.slow = self.rejected = 0
