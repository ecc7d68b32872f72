"""A Hypothesis state machine drives a breaker and a small reference model side by side.

Random calls, outcomes (success, slow success, failure, slow failure, a 503 stating a wait, a
429, ignored error, cancellation), clock jumps and operator actions; after every step the breaker
must agree with the model on state, admissions, ``retry_after_s`` and the window's counts, and a
half-open breaker must always have a trial in flight or a permit to give.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import httpx
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ragguard import BreakerOpen, FakeClock
from ragguard.breakers import BreakerState, CircuitBreaker

SLOW_S = 1.0
OPEN_FOR_S = 5.0
OPEN_MAX_S = 20.0
KINDS = [
    "success", "slow_success", "failure", "slow_failure", "rejection", "rate_limited", "ignored", "cancelled",
]
_REQUEST = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")


def _status_error(status: int) -> httpx.HTTPStatusError:
    """What httpx raises for ``status`` with ``Retry-After: 1``: a rejection (503 stating a wait,
    counted by the rejection rate; 429, a rate limit, never counted)."""
    response = httpx.Response(status, headers={"retry-after": "1"}, request=_REQUEST)
    return httpx.HTTPStatusError(f"{status}", request=_REQUEST, response=response)


@dataclass
class Model:
    """The breaker's rules, written the obvious way: lists, recomputed every time."""

    window_type: str
    size: int
    min_calls: int
    fail_pct: float
    slow_pct: float
    consecutive_limit: int | None
    permits: int
    multiplier: float
    rejection_pct: float | None = None
    state: str = "closed"
    epoch: int = 0
    # (second, failed, slow, rejected)
    outcomes: list[tuple[int, bool, bool, bool]] = field(default_factory=list)
    consecutive: int = 0
    open_until: float = 0.0
    open_s: float = 0.0
    permits_left: int = 0
    trials: list[tuple[bool, bool, bool]] = field(default_factory=list)

    def window(self, now: float) -> list[tuple[int, bool, bool, bool]]:
        if self.window_type == "count":
            return self.outcomes[-self.size:]
        return [o for o in self.outcomes if o[0] > math.floor(now) - self.size]

    def move(self, state: str) -> None:
        if state == "open":
            self.open_s = OPEN_FOR_S if self.state != "half_open" else min(self.open_s * self.multiplier,
                                                                           OPEN_MAX_S)
        if state == "half_open":
            self.permits_left, self.trials = self.permits, []
        if state == "closed":
            self.outcomes, self.consecutive = [], 0
        self.state = state
        self.epoch += 1

    def acquire(self, now: float) -> tuple[int | None, float | None]:
        """(token, None) when admitted, else (None, retry_after_s)."""
        if self.state == "open":
            if now < self.open_until:
                return None, self.open_until - now
            self.move("half_open")
        if self.state == "half_open":
            if self.permits_left == 0:
                return None, 0.0
            self.permits_left -= 1
        if self.state == "forced_open":
            return None, None
        return self.epoch, None

    def trip(self, now: float) -> None:
        self.move("open")
        self.open_until = now + self.open_s

    def over(self, outcomes: list[tuple[bool, bool, bool]]) -> bool:
        """Whether ``(failed, slow, rejected)`` outcomes trip a rate rule: the failure and slow-call
        rates of the calls not turned away, the rejection rate of them all."""
        n = len(outcomes)
        rejected = sum(r for _, _, r in outcomes)
        served = n - rejected
        return (
            (served > 0 and sum(f for f, _, _ in outcomes) * 100 >= self.fail_pct * served)
            or (served > 0 and sum(s for _, s, _ in outcomes) * 100 >= self.slow_pct * served)
            or (rejected > 0 and self.rejection_pct is not None and rejected * 100 >= self.rejection_pct * n)
        )

    def finish(self, token: int, kind: str, now: float) -> None:
        if token != self.epoch or self.state == "disabled":
            return
        uncounted = kind in ("ignored", "cancelled", "rate_limited")
        if uncounted or (kind == "rejection" and self.rejection_pct is None):
            if self.state == "half_open":
                self.permits_left += 1
            return
        failed, slow, rejected = kind.endswith("failure"), kind.startswith("slow"), kind == "rejection"
        if self.state == "half_open":
            self.trials.append((failed, slow, rejected))
            if len(self.trials) == self.permits:
                if self.over(self.trials):
                    self.trip(now)
                else:
                    self.move("closed")
            return
        self.outcomes.append((math.floor(now), failed, slow, rejected))
        if not rejected:  # a rejection neither extends nor ends a run of failures
            self.consecutive = self.consecutive + 1 if failed else 0
        window = self.window(now)
        if len(window) < self.min_calls:
            return
        if self.over([o[1:] for o in window]) or (
            self.consecutive_limit is not None and self.consecutive >= self.consecutive_limit
        ):
            self.trip(now)


class BreakerVsModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock(100.0)
        self.inflight: list[tuple[int, int]] = []  # (breaker token, model token)

    @initialize(
        window_type=st.sampled_from(["count", "time"]),
        size=st.integers(1, 6),
        min_calls=st.integers(1, 6),
        fail_pct=st.sampled_from([25.0, 50.0, 100.0]),
        slow_pct=st.sampled_from([50.0, 100.0]),
        consecutive=st.sampled_from([None, 2, 3]),
        permits=st.integers(1, 3),
        multiplier=st.sampled_from([1.0, 2.0]),
        rejection_pct=st.sampled_from([None, 50.0, 90.0, 100.0]),
    )
    def build(self, window_type: str, size: int, min_calls: int, fail_pct: float, slow_pct: float,
              consecutive: int | None, permits: int, multiplier: float, rejection_pct: float | None) -> None:
        if window_type == "count":
            min_calls = min(min_calls, size)
        self.breaker = CircuitBreaker(
            "model", window_type=window_type, window_size=size, minimum_calls=min_calls,  # type: ignore[arg-type]
            failure_rate_threshold=fail_pct, slow_call_rate_threshold=slow_pct,
            consecutive_failures_threshold=consecutive, half_open_permits=permits,
            slow_call_duration_s=SLOW_S, open_for_s=OPEN_FOR_S, open_backoff_multiplier=multiplier,
            open_max_s=OPEN_MAX_S, classifier=lambda e: isinstance(e, ConnectionResetError), clock=self.clock,
            rejection_rate_threshold=rejection_pct,
        )
        self.model = Model(window_type, size, min_calls, fail_pct, slow_pct, consecutive, permits, multiplier,
                           rejection_pct)

    @rule()
    def start_call(self) -> None:
        now = self.clock()
        token, retry_after = self.model.acquire(now)
        if token is None:
            with pytest.raises(BreakerOpen) as info:
                self.breaker.acquire()
            if retry_after is None:
                assert info.value.retry_after_s is None
            else:
                assert info.value.retry_after_s == pytest.approx(retry_after, abs=1e-9)
        elif len(self.inflight) < 12:
            self.inflight.append((self.breaker.acquire(), token))
        else:  # bound the number of calls in flight; hand the permit straight back
            self.breaker.release(self.breaker.acquire())
            self.model.finish(token, "cancelled", now)

    @precondition(lambda self: bool(self.inflight))
    @rule(index=st.integers(0, 11), kind=st.sampled_from(KINDS))
    def finish_call(self, index: int, kind: str) -> None:
        token, model_token = self.inflight.pop(index % len(self.inflight))
        duration = 2.0 if kind.startswith("slow") else 0.1
        if kind == "cancelled":
            self.breaker.release(token)
        elif kind == "ignored":
            self.breaker.on_result(token, 0.1, ValueError("caller's input"))
        elif kind in ("rejection", "rate_limited"):
            self.breaker.on_result(token, 0.1, _status_error(503 if kind == "rejection" else 429))
        elif kind.endswith("failure"):
            self.breaker.on_result(token, duration, ConnectionResetError("reset"))
        else:
            self.breaker.on_result(token, duration, None)
        self.model.finish(model_token, kind, self.clock())

    @rule(n=st.integers(1, 8), slow_last=st.booleans())
    def burst_of_successes(self, n: int, slow_last: bool) -> None:
        """Several calls in a row, each admitted and ended before the next, with no read of the
        window in between (a clean closed window takes them in bulk: they must all count)."""
        for i in range(n):
            now = self.clock()
            token, _ = self.model.acquire(now)
            if token is None:
                with pytest.raises(BreakerOpen):
                    self.breaker.acquire()
                continue
            kind = "slow_success" if slow_last and i == n - 1 else "success"
            self.breaker.on_result(self.breaker.acquire(), 2.0 if kind == "slow_success" else 0.1, None)
            self.model.finish(token, kind, now)

    @rule(fails=st.booleans())
    def through_call(self, fails: bool) -> None:
        """One call through ``CircuitBreaker.call`` (its own inlined paths), on the clock."""
        import asyncio

        now = self.clock()
        token, _ = self.model.acquire(now)

        async def dependency() -> int:
            if fails:
                raise ConnectionResetError("reset")
            return 1

        if token is None:
            with pytest.raises(BreakerOpen):
                asyncio.run(self.breaker.call(dependency))
            return
        if fails:
            with pytest.raises(ConnectionResetError):
                asyncio.run(self.breaker.call(dependency))
        else:
            assert asyncio.run(self.breaker.call(dependency)) == 1
        self.model.finish(token, "failure" if fails else "success", now)

    @rule(seconds=st.sampled_from([0.0, 0.25, 0.999, 1.0, 2.5, 5.0, 9.0, 30.0]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(action=st.sampled_from(["force_open", "disable", "reset"]))
    def operator(self, action: str) -> None:
        getattr(self.breaker, action)()
        self.model.move({"force_open": "forced_open", "disable": "disabled", "reset": "closed"}[action])

    @invariant()
    def agrees_with_the_model(self) -> None:
        if not hasattr(self, "model"):
            return
        assert self.breaker.state == BreakerState(self.model.state)
        metrics = self.breaker.metrics()
        if self.model.state == "closed":
            window = self.model.window(self.clock())
            assert metrics.calls == len(window)
            assert metrics.failed_calls == sum(o[1] for o in window)
            assert metrics.slow_calls == sum(o[2] for o in window)
            assert metrics.rejected_calls == sum(o[3] for o in window)
        if self.model.state == "half_open":
            trials_in_flight = sum(1 for _, t in self.inflight if t == self.model.epoch)
            assert metrics.trial_permits_left == self.model.permits_left
            assert metrics.trial_permits_left + trials_in_flight + metrics.trial_calls_done == \
                self.model.permits
            assert trials_in_flight > 0 or metrics.trial_permits_left > 0


TestBreakerVsModel = BreakerVsModel.TestCase
TestBreakerVsModel.settings = settings(
    max_examples=150, stateful_step_count=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
pytest.mark.timeout(60)(TestBreakerVsModel)
