"""The shared breaker state a replica knew when Redis went away, held locally until it resolves.

A replica that loses Redis must not fall back to a blank, closed breaker: that lets a crowd through
to a dependency the fleet had tripped. :class:`LocalHold` keeps the last shared state and applies
the in-memory breaker's rules from there, on the replica's monotonic clock::

    open (the time left when last read) --time up--> half-open
    half-open: half_open_permits trials, less this replica's shared trials still running
        all done, rates under the thresholds --> closed: the wrapped breaker takes over, empty
        (the failure and slow-call rates of the trials not turned away, the rejection rate of all)
        a rate at or over a threshold        --> open again for open_base x multiplier (capped, jittered)
    forced open, disabled: held until an operator acts or Redis answers again

No I/O and no clock of its own: ``now`` is passed in. A closed shared state needs no hold.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import NoReturn

from ..breakers import BreakerConfig, BreakerState

__all__ = ["HoldTrial", "LocalHold"]

_OPEN = BreakerState.OPEN
_HALF_OPEN = BreakerState.HALF_OPEN
_FORCED_OPEN = BreakerState.FORCED_OPEN
_DISABLED = BreakerState.DISABLED
_CLOSED = BreakerState.CLOSED

_FAILED = 1


class HoldTrial:
    """Token of a trial call admitted by a hold in half-open ``round``."""

    __slots__ = ("round",)

    def __init__(self, round_: int) -> None:
        self.round = round_


class LocalHold:
    """``state`` (open, half-open, forced open or disabled) carried over from the shared breaker.

    ``open_left_s``: seconds left open; ``open_base_s``: the shared open duration before jitter
    (the next reopening multiplies it); ``trials_running``: this replica's shared half-open trials
    still in flight (they count here too). ``reject(state, retry_after_s)`` raises the breaker's
    error; ``moved(old, new, now, reason)`` reports a transition.
    """

    __slots__ = (
        "_config",
        "_moved",
        "_reject",
        "_rng",
        "base_s",
        "calls",
        "failures",
        "left",
        "rejected",
        "round",
        "slow",
        "state",
        "until",
    )

    def __init__(
        self,
        state: BreakerState,
        config: BreakerConfig,
        *,
        now: float,
        open_left_s: float,
        open_base_s: float,
        trials_running: int,
        rng: random.Random,
        reject: Callable[[BreakerState, float | None], NoReturn],
        moved: Callable[[BreakerState, BreakerState, float, str], None],
    ) -> None:
        self.state = state
        self.until = now + open_left_s
        self.base_s = open_base_s or config.open_for_s
        self._config = config  # the wrapped breaker's options: the rules are its rules
        self._rng = rng
        self._reject = reject
        self._moved = moved
        self.round = 0
        self.left = max(0, config.half_open_permits - trials_running)
        self.calls = self.failures = self.slow = self.rejected = 0

    @property
    def resolved(self) -> bool:
        """True once the trials passed: the wrapped breaker decides from now on."""
        return self.state is _CLOSED

    def retry_after_s(self, now: float) -> float | None:
        return max(0.0, self.until - now) if self.state is _OPEN else None

    def acquire(self, now: float) -> HoldTrial | None:
        """A trial token, None while disabled; raises the breaker's error when it rejects."""
        state = self.state
        if state is _DISABLED:
            return None
        if state is _FORCED_OPEN:
            self._reject(state, None)
        if state is _OPEN:
            if now < self.until:
                self._reject(state, self.until - now)
            self._to(_HALF_OPEN, now, "open duration elapsed (local)")
        if self.left <= 0:
            self._reject(_HALF_OPEN, 0.0)
        self.left -= 1
        return HoldTrial(self.round)

    def record(self, round_: int, code: int, now: float) -> None:
        """The outcome of a trial of ``round_``: code ``FAILED | SLOW`` bits or ``REJECTED`` (4),
        or < 0 (not counted)."""
        if round_ != self.round or self.state is not _HALF_OPEN:
            return
        if code < 0:
            self.left += 1
            return
        self.calls += 1
        self.failures += code & _FAILED
        self.slow += (code >> 1) & 1
        self.rejected += code >> 2
        done = self.calls
        config = self._config
        if done < config.half_open_permits:
            return
        served = done - self.rejected
        threshold = config.rejection_rate_threshold
        if served and self.failures * 100.0 >= config.failure_rate_threshold * served:
            self._reopen(now, f"{self.failures} of {done} trial calls failed (local)")
        elif served and self.slow * 100.0 >= config.slow_call_rate_threshold * served:
            self._reopen(now, f"{self.slow} of {done} trial calls were slow (local)")
        elif self.rejected and threshold is not None and self.rejected * 100.0 >= threshold * done:
            self._reopen(now, f"{self.rejected} of {done} trial calls were turned away (local)")
        else:
            self._to(_CLOSED, now, f"{done} trial calls passed (local)")

    def release(self, round_: int) -> None:
        """Give a trial permit of ``round_`` back unrecorded (cancelled or never ran)."""
        if round_ == self.round and self.state is _HALF_OPEN:
            self.left += 1

    def _reopen(self, now: float, reason: str) -> None:
        config = self._config
        cap, jitter = config.open_cap_s, config.open_jitter
        base = min(self.base_s * config.open_backoff_multiplier, cap)
        self.base_s = base
        duration = base
        if jitter:
            duration = min(base * (1.0 + jitter * (2.0 * self._rng.random() - 1.0)), cap)
        self.until = now + duration
        self._to(_OPEN, now, reason)

    def _to(self, new: BreakerState, now: float, reason: str) -> None:
        old = self.state
        self.state = new
        self.round += 1
        if new is _HALF_OPEN:
            self.left = self._config.half_open_permits
            self.calls = self.failures = self.slow = self.rejected = 0
        self._moved(old, new, now, reason)
