"""The retry layer: what it retries, how long it waits (on the FakeClock), the budget."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from layer_helpers import Script, make_call

from ragguard import (
    BreakerOpen,
    DeadlineExceeded,
    FakeClock,
    QuotaExceeded,
    RetryPolicy,
    StageTimeout,
    deadline,
)
from ragguard.breakers import counts_by_default
from ragguard.events import RetryBudgetExhausted, RetryScheduled
from ragguard.layers._retry import RetryBudget, RetryLayer
from ragguard.testing import EventRecorder

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]


class Waits:
    """The retry layer's ``sleep``: records each wait and lets it pass on the FakeClock."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.log: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.log.append(seconds)
        await self.clock.sleep(seconds)


class Busy(ConnectionError):
    """A dependency's refusal that names a wait (as an HTTP 503 with Retry-After would)."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"busy, retry after {retry_after_s}s")
        self.retry_after_s = retry_after_s


def _layer(
    clock: FakeClock,
    *,
    min_attempt_s: float = 0.0,
    ratio: float = 1.0,
    min_per_s: float = 100.0,
    **policy: Any,
) -> tuple[RetryLayer, Waits]:
    policy.setdefault("attempts", 3)
    policy.setdefault("jitter_s", 0.0)
    policy.setdefault("initial_backoff_s", 0.1)
    waits = Waits(clock)
    budget = RetryBudget(ratio=ratio, min_per_s=min_per_s, window_s=10, clock=clock)
    layer = RetryLayer(
        "s",
        RetryPolicy(**policy),
        budget=budget,
        counts=counts_by_default,
        min_attempt_s=min_attempt_s,
        clock=clock,
        rng=random.Random(0),
        sleep=waits,
    )
    return layer, waits


async def test_a_retryable_failure_is_retried_with_exponential_backoff_on_the_clock() -> None:
    clock = FakeClock()
    layer, waits = _layer(clock, attempts=4)
    call = make_call()
    again = Script(ConnectionResetError("1"), TimeoutError("2"), "ok")
    assert await layer.recover(call, ConnectionRefusedError("0"), again) == "ok"
    assert again.calls == 3
    assert call.attempt == 4  # raised before each retry
    assert waits.log == pytest.approx([0.1, 0.2, 0.4])
    assert clock() == pytest.approx(0.7)  # time passed on the FakeClock only


async def test_attempts_bound_the_retries_and_the_last_error_is_raised() -> None:
    clock = FakeClock()
    layer, _ = _layer(clock, attempts=3)
    last = ConnectionResetError("last")
    again = Script(ConnectionResetError("1"), last)
    with pytest.raises(ConnectionResetError) as raised:
        await layer.recover(make_call(), ConnectionRefusedError("0"), again)
    assert raised.value is last
    assert again.calls == 2  # 3 attempts in all, the first being the failure recovered


@pytest.mark.parametrize(
    "error",
    [
        ValueError("bad input"),
        BreakerOpen("s", 3.0),
        QuotaExceeded("acme", 1.0, "rate"),
        DeadlineExceeded("s"),
    ],
    ids=["caller-error", "breaker-open", "quota", "deadline"],
)
async def test_errors_outside_retry_on_and_ragguard_rejections_are_not_retried(error: Exception) -> None:
    layer, waits = _layer(FakeClock())
    again = Script("never")
    with pytest.raises(type(error)) as raised:
        await layer.recover(make_call(), error, again)
    assert raised.value is error
    assert again.calls == 0 and waits.log == []


async def test_a_stage_timeout_is_retried_as_a_timeout() -> None:
    layer, _ = _layer(FakeClock(), retry_on=("timeout",))
    again = Script("ok")
    assert await layer.recover(make_call(), StageTimeout("s", 1.0), again) == "ok"
    assert layer.retryable(StageTimeout("s", 1.0))
    assert not layer.retryable(ConnectionRefusedError())  # only the kinds named


async def test_a_cancellation_during_a_retry_is_never_retried() -> None:
    layer, _ = _layer(FakeClock(), attempts=5)
    again = Script(asyncio.CancelledError(), "never")
    with pytest.raises(asyncio.CancelledError):
        await layer.recover(make_call(), ConnectionRefusedError(), again)
    assert again.calls == 1


async def test_retry_after_s_makes_the_wait_at_least_that_long() -> None:
    clock = FakeClock()
    layer, waits = _layer(clock, attempts=2, max_backoff_s=0.5)
    again = Script("ok")
    assert await layer.recover(make_call(), Busy(3.0), again) == "ok"
    assert waits.log == [3.0]  # above max_backoff_s: the dependency asked for it


async def test_retry_after_s_within_the_deadline_is_honoured_and_never_passes_it() -> None:
    clock = FakeClock()
    layer, waits = _layer(clock, attempts=2, min_attempt_s=0.5)
    again = Script("ok")
    with deadline(10.0, clock=clock):
        assert await layer.recover(make_call(), Busy(3.0), again) == "ok"
    assert waits.log == [3.0]
    assert clock() <= 10.0 - 0.5


async def test_no_retry_when_the_asked_wait_cannot_fit_the_deadline() -> None:
    clock = FakeClock()
    layer, waits = _layer(clock, attempts=5, min_attempt_s=0.5)
    again = Script("never")
    error = Busy(3.0)
    with deadline(3.2, clock=clock), pytest.raises(Busy) as raised:
        await layer.recover(make_call(), error, again)
    assert raised.value is error  # the original failure, at once
    assert again.calls == 0 and waits.log == [] and clock() == 0.0


async def test_backoff_is_cut_so_the_retry_starts_before_the_deadline() -> None:
    clock = FakeClock()
    layer, waits = _layer(
        clock, attempts=3, initial_backoff_s=1.0, multiplier=4.0, max_backoff_s=60, min_attempt_s=0.25
    )
    again = Script(ConnectionResetError(), ConnectionResetError("last"))
    with deadline(3.0, clock=clock), pytest.raises(ConnectionResetError, match="last"):
        await layer.recover(make_call(), ConnectionRefusedError(), again)
    assert waits.log[0] == 1.0
    assert waits.log[1] == pytest.approx(3.0 - 1.0 - 0.25)  # 4 s of backoff cut to the deadline
    assert clock() == pytest.approx(3.0 - 0.25)  # the last attempt still had min_attempt_s


async def test_first_attempts_feed_the_budget_and_a_spent_budget_stops_retries() -> None:
    clock = FakeClock()
    layer, _ = _layer(clock, attempts=3, ratio=0.5, min_per_s=0.0)
    call = make_call()
    for _ in range(2):
        layer.enter(call)  # two first attempts: one retry allowed (50%)
    retry = make_call()
    retry.attempt = 2
    layer.enter(retry)  # a retry's pass is not counted as a call
    with EventRecorder() as seen:
        assert await layer.recover(make_call(), ConnectionRefusedError(), Script("ok")) == "ok"
        error = ConnectionRefusedError("refused")
        again = Script("never")
        with pytest.raises(ConnectionRefusedError):
            await layer.recover(make_call(), error, again)
        assert again.calls == 0
        await seen.settle()
    assert [e.stage for e in seen.of(RetryBudgetExhausted)] == ["s"]
    assert [(e.attempt, e.error) for e in seen.of(RetryScheduled)] == [(2, "ConnectionRefusedError")]


async def test_the_budget_forgets_calls_outside_its_window() -> None:
    clock = FakeClock()
    budget = RetryBudget(ratio=1.0, min_per_s=0.0, window_s=2, clock=clock)
    budget.on_call(clock())
    assert budget.try_spend()
    assert not budget.try_spend()
    budget.on_call(clock())
    clock.advance(5)
    assert not budget.try_spend()  # both calls left the window


async def test_an_error_an_outer_layer_recovers_is_left_to_it() -> None:
    layer, waits = _layer(FakeClock(), retry_on=("out_of_memory",))
    call = make_call()
    call.recoverable = lambda exc: isinstance(exc, MemoryError)  # the rerank chunker's
    again = Script("never")
    with pytest.raises(MemoryError):
        await layer.recover(call, MemoryError("batch too big"), again)
    assert again.calls == 0 and waits.log == []  # the chunker shrinks instead: no retry at one size
    call.recoverable = None
    assert await layer.recover(call, MemoryError("at the floor"), Script("ok")) == "ok"


async def test_a_retried_rerank_shrinks_at_once_instead_of_retrying_the_same_batch() -> None:
    from ragguard import Guard, Policy, StagePolicy

    policy = RetryPolicy(attempts=3, retry_on=("out_of_memory",), jitter_s=0.0)
    g = Guard(Policy(stages={"rerank": StagePolicy(retry=policy, rerank_min_batch=2)}), clock=FakeClock())
    batches: list[int] = []

    @g.guard("rerank")
    async def rerank(query: str, docs: list[dict[str, float]]) -> list[dict[str, float]]:
        batches.append(len(docs))
        if len(docs) > 5:
            raise MemoryError("CUDA out of memory")
        return sorted(docs, key=lambda d: d["score"], reverse=True)

    got = await rerank("q", [{"score": float(i)} for i in range(20)])
    assert len(got) == 20
    assert batches == [20, 10, 5, 5, 5, 5]
