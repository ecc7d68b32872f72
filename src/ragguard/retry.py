"""Deadline-aware retries (run by tenacity) and the retry budget that stops retry storms."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import Any

import tenacity

from .deadline import remaining
from .policy import RetryPolicy

__all__ = ["RetryBudget", "deadline_aware_retrying"]


class RetryBudget:
    """Retries may add at most ``ratio`` of the calls seen in the last ``window_s`` seconds, plus
    ``min_per_s`` retries per second (after Envoy's retry budget and Finagle's RetryBudget).

    Calls are counted in one-second buckets of the injected ``clock`` (monotonic seconds).
    """

    __slots__ = ("_buckets", "_clock", "_cur", "_cur_calls", "_cur_retries", "min_per_s", "ratio", "window_s")

    def __init__(
        self, *, ratio: float, min_per_s: float, window_s: float, clock: Callable[[], float]
    ) -> None:
        self.ratio = ratio
        self.min_per_s = min_per_s
        self.window_s = max(1, round(window_s))
        self._clock = clock
        self._buckets: dict[int, tuple[int, int]] = {}
        self._cur = -1
        self._cur_calls = 0
        self._cur_retries = 0

    def _rotate(self, sec: int) -> None:
        if self._cur >= 0 and (self._cur_calls or self._cur_retries):
            self._buckets[self._cur] = (self._cur_calls, self._cur_retries)
        self._cur, self._cur_calls, self._cur_retries = sec, 0, 0
        horizon = sec - self.window_s
        for old in [k for k in self._buckets if k <= horizon]:
            del self._buckets[old]

    def on_call(self, now: float) -> None:
        """Count one first attempt made at clock time ``now``."""
        sec = int(now)
        if sec != self._cur:
            self._rotate(sec)
        self._cur_calls += 1

    def try_spend(self) -> bool:
        """Take one retry from the budget; False when the budget is spent."""
        sec = int(self._clock())
        if sec != self._cur:
            self._rotate(sec)
        calls = self._cur_calls + sum(c for c, _ in self._buckets.values())
        retries = self._cur_retries + sum(r for _, r in self._buckets.values())
        if retries + 1 > self.ratio * calls + self.min_per_s * self.window_s:
            return False
        self._cur_retries += 1
        return True


class _DeadlineStop(tenacity.stop.stop_base):
    """Stop when the next attempt could not start before the deadline with ``min_attempt_s`` left.

    tenacity's ``stop_after_delay`` is checked against the time already spent, so its last sleep can
    carry an attempt past the deadline; this one looks at the upcoming sleep as well.
    """

    def __init__(self, min_attempt_s: float) -> None:
        self.min_attempt_s = max(min_attempt_s, 0.001)

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        left = remaining()
        return left is not None and left - retry_state.upcoming_sleep < self.min_attempt_s


class _CutWait(tenacity.wait.wait_base):
    """Exponential backoff with seeded jitter, cut so that ``min_attempt_s`` stays for the retry."""

    def __init__(self, policy: RetryPolicy, min_attempt_s: float, rng: random.Random) -> None:
        self.base = tenacity.wait_exponential(
            multiplier=policy.initial_backoff_s, exp_base=policy.multiplier, max=policy.max_backoff_s
        )
        self.jitter_s = policy.jitter_s
        self.min_attempt_s = max(min_attempt_s, 0.001)
        self.rng = rng

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        wait = float(self.base(retry_state))
        if self.jitter_s:
            wait += self.rng.uniform(0.0, self.jitter_s)
        left = remaining()
        if left is not None:
            wait = min(wait, max(0.0, left - self.min_attempt_s))
        return wait


class _BudgetStop(tenacity.stop.stop_base):
    """Stop when the retry budget refuses the retry; checked last, so only retries that would
    otherwise happen are charged to the budget."""

    def __init__(self, spend: Callable[[], bool]) -> None:
        self.spend = spend

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return not self.spend()


def deadline_aware_retrying(
    policy: RetryPolicy,
    *,
    retryable: Callable[[BaseException], bool],
    budget: Callable[[], bool] | None = None,
    min_attempt_s: float,
    rng: random.Random,
    sleep: Callable[[float], Awaitable[Any]],
    before_sleep: Callable[[tenacity.RetryCallState], Any] | None = None,
) -> tenacity.AsyncRetrying:
    """A fresh tenacity ``AsyncRetrying`` for one call (retry state is never shared by callers).

    ``retryable(exc)`` says whether an error may be retried; ``budget()`` takes one retry from a
    retry budget (False: refused). The stop conditions run in order and short-circuit, so the
    budget is asked only when the attempt count and the deadline both allow the retry.
    """
    stop = tenacity.stop_after_attempt(policy.attempts) | _DeadlineStop(min_attempt_s)
    if budget is not None:
        stop = stop | _BudgetStop(budget)
    return tenacity.AsyncRetrying(
        stop=stop,
        wait=_CutWait(policy, min_attempt_s, rng),
        retry=tenacity.retry_if_exception(retryable),
        sleep=sleep,
        before_sleep=before_sleep,
        reraise=True,
    )
