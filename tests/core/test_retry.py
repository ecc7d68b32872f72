"""Deadline-aware retries: what is retried, how long it waits, and the retry budget."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import anyio
import pytest
import tenacity
from core_helpers import Recorder, SleepLog, no_sleep

import ragguard
from ragguard import (
    BreakerOpen,
    BreakerPolicy,
    BreakerState,
    DeadlineExceeded,
    Guard,
    Policy,
    QuotaExceeded,
    RetryPolicy,
    StagePolicy,
    deadline,
)
from ragguard.events import RetryBudgetExhausted, RetryScheduled

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


def _guard(
    *,
    breaker: BreakerPolicy | None = None,
    clock: Any = None,
    sleep: Any = no_sleep,
    min_attempt_s: float = 0.0,
    idempotent: bool = True,
    **retry: Any,
) -> Guard:
    retry.setdefault("jitter_s", 0.0)
    stage = StagePolicy(
        breaker=breaker or BreakerPolicy(kind="none"),
        retry=RetryPolicy(**retry),
        min_attempt_s=min_attempt_s,
        idempotent=idempotent,  # a read: these tests are about the retries themselves
    )
    options: dict[str, Any] = {"sleep": sleep}
    if clock is not None:
        options["clock"] = clock
    return Guard(Policy(stages={"s": stage}), **options)


class Flaky:
    """Raises ``errors`` in turn, then returns "ok"; counts its calls."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


# -- what is retried ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("retry_on", "error", "retried"),
    [
        (("connection",), ConnectionRefusedError("refused"), True),
        (("connection",), TimeoutError("slow"), False),
        (("timeout",), TimeoutError("slow"), True),
        (("connection", "timeout"), ValueError("bad input"), False),
        (("any",), KeyError("bug in the caller"), True),
        (("any",), ValueError("bad input"), False),
    ],
)
async def test_only_retryable_kinds_are_retried(
    retry_on: tuple[str, ...], error: Exception, retried: bool
) -> None:
    g = _guard(attempts=3, retry_on=retry_on)
    flaky = Flaky(error, error, error)
    fn = g.guard("s")(flaky)
    with pytest.raises(type(error)):
        await fn()
    assert flaky.calls == (3 if retried else 1)


async def test_a_retried_call_returns_the_later_success() -> None:
    g = _guard(attempts=3, retry_on=("connection",))
    flaky = Flaky(ConnectionResetError(), ConnectionResetError())
    assert await g.guard("s")(flaky)() == "ok"
    assert flaky.calls == 3


@pytest.mark.parametrize(
    "rejection",
    [BreakerOpen("other", 1.0), QuotaExceeded("acme", 0.5, "rate"), DeadlineExceeded("inner")],
    ids=["breaker_open", "quota_exceeded", "deadline_exceeded"],
)
async def test_ragguard_rejections_are_never_retried(rejection: Exception) -> None:
    g = _guard(attempts=5, retry_on=("any", "connection", "timeout"))
    flaky = Flaky(ConnectionError(), rejection, rejection, rejection)
    with pytest.raises(type(rejection)):
        await g.guard("s")(flaky)()
    assert flaky.calls == 2  # the first error was retried, the rejection was not


async def _instant(seconds: float) -> None:
    """An injected backoff sleep that returns at once without a checkpoint."""


@pytest.mark.parametrize("sleep", [_instant, no_sleep], ids=["no_checkpoint", "checkpoint"])
@pytest.mark.parametrize("retry_on", [("any",), ("connection", "timeout")])
async def test_cancellation_is_never_retried(retry_on: tuple[str, ...], sleep: Any) -> None:
    g = _guard(attempts=5, retry_on=retry_on, sleep=sleep)
    calls = []

    @g.guard("s")
    async def hangs() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("first attempt fails fast")
        await anyio.sleep(30)

    with anyio.move_on_after(0.05) as scope:
        await hangs()
    assert scope.cancelled_caught
    assert len(calls) == 2  # the cancelled second attempt was not retried


async def test_no_retry_after_the_breaker_opens() -> None:
    breaker = BreakerPolicy(kind="generic", minimum_calls=2, failure_rate_threshold=100, open_for_s=60)
    g = _guard(attempts=5, retry_on=("connection",), breaker=breaker)
    flaky = Flaky(*(ConnectionError() for _ in range(5)))
    with pytest.raises(BreakerOpen):
        await g.guard("s")(flaky)()
    assert flaky.calls == 2
    assert g.breaker("s").state is BreakerState.OPEN


# -- backoff and the deadline -----------------------------------------------------------------------


async def test_backoff_sleeps_are_injected_and_exponential() -> None:
    sleep = SleepLog()
    g = _guard(
        attempts=4,
        retry_on=("connection",),
        sleep=sleep,
        initial_backoff_s=0.1,
        multiplier=2.0,
        max_backoff_s=0.3,
    )
    flaky = Flaky(ConnectionError(), ConnectionError(), ConnectionError())
    started = time.monotonic()
    assert await g.guard("s")(flaky)() == "ok"
    assert time.monotonic() - started < 0.25  # nothing really slept
    assert sleep.waits == pytest.approx([0.1, 0.2, 0.3])  # capped at max_backoff_s


async def test_jitter_comes_from_the_guards_rng() -> None:
    waits = []
    for _ in range(2):
        sleep = SleepLog()
        g = Guard(
            Policy(
                stages={
                    "s": StagePolicy(
                        breaker=BreakerPolicy(kind="none"),
                        retry=RetryPolicy(
                            attempts=3, retry_on=("connection",), initial_backoff_s=0.1, jitter_s=0.05
                        ),
                        idempotent=True,
                    )
                }
            ),
            sleep=sleep,
            rng=__import__("random").Random(7),
        )
        await g.guard("s")(Flaky(ConnectionError(), ConnectionError()))()
        waits.append(sleep.waits)
    assert waits[0] == waits[1]  # same seed, same waits
    assert 0.1 <= waits[0][0] <= 0.15 and 0.2 <= waits[0][1] <= 0.25
    assert waits[0][0] != 0.1  # jitter was added


async def test_backoff_is_cut_to_the_deadline(deadline_clock: ragguard.FakeClock) -> None:
    sleep = SleepLog(deadline_clock)
    g = _guard(
        attempts=4,
        retry_on=("connection",),
        sleep=sleep,
        min_attempt_s=0.125,
        initial_backoff_s=0.25,
        multiplier=2.0,
        max_backoff_s=10.0,
    )
    starts: list[float] = []

    @g.guard("s")
    async def down() -> None:
        starts.append(deadline_clock())
        raise ConnectionError("down")

    t0 = deadline_clock()
    with deadline(1.0), pytest.raises((ConnectionError, DeadlineExceeded)):
        await down()
    # waits 0.25, 0.5, then 1.0 cut so that min_attempt_s (0.125) is left for the last attempt
    assert sleep.waits == pytest.approx([0.25, 0.5, 0.125])
    assert [s - t0 for s in starts] == pytest.approx([0.0, 0.25, 0.75, 0.875])
    assert all(s - t0 <= 1.0 - 0.125 for s in starts)  # every attempt had at least min_attempt_s


async def test_no_retry_when_less_than_min_attempt_is_left(deadline_clock: ragguard.FakeClock) -> None:
    sleep = SleepLog(deadline_clock)
    g = _guard(attempts=5, retry_on=("connection",), sleep=sleep, min_attempt_s=0.5, initial_backoff_s=0.1)
    calls = []

    @g.guard("s")
    async def slow_then_down() -> None:
        calls.append(1)
        deadline_clock.advance(0.6)  # the attempt spends 0.6 s of a 1.0 s budget
        raise ConnectionError("down")

    with deadline(1.0), pytest.raises(ConnectionError):  # the real error, at once
        await slow_then_down()
    assert calls == [1]
    assert sleep.waits == []


async def test_no_retry_starts_after_the_deadline_unlike_stop_after_delay(
    deadline_clock: ragguard.FakeClock,
) -> None:
    """The deadline is 0.2 s and backoff grows 0.15 s, 0.3 s, ...: tenacity in real time (its
    stop_after_delay reads the system's clock), ragguard on the fake clock."""
    budget = 0.2
    policy = {"initial_backoff_s": 0.15, "multiplier": 2.0, "max_backoff_s": 5.0}

    # tenacity's stop_after_delay checks the time already spent, before sleeping
    t_starts: list[float] = []
    t0 = time.monotonic()
    with pytest.raises(ConnectionError):
        async for attempt in tenacity.AsyncRetrying(
            stop=tenacity.stop_after_delay(budget) | tenacity.stop_after_attempt(4),
            wait=tenacity.wait_exponential(multiplier=0.15, exp_base=2.0, max=5.0),
            sleep=anyio.sleep,
            reraise=True,
        ):
            with attempt:
                t_starts.append(time.monotonic() - t0)
                raise ConnectionError()
    assert max(t_starts) > budget  # the overshoot ragguard must not inherit

    sleep = SleepLog(deadline_clock)
    g = _guard(attempts=4, retry_on=("connection",), sleep=sleep, **policy)
    starts: list[float] = []

    @g.guard("s")
    async def down() -> None:
        starts.append(deadline_clock() - f0)
        raise ConnectionError()

    f0 = deadline_clock()
    with pytest.raises((ConnectionError, DeadlineExceeded)):
        async with deadline(budget):
            await down()
    assert len(starts) >= 2
    assert max(starts) < budget
    assert deadline_clock() - f0 <= budget  # and the caller is answered by the deadline


# -- per-call state and the retry budget -------------------------------------------------------------


async def test_fifty_concurrent_callers_each_see_attempts_1_2_3(events: Recorder) -> None:
    g = _guard(attempts=3, retry_on=("connection",))
    seen: dict[int, list[int]] = {i: [] for i in range(50)}
    results: dict[int, str] = {}

    @g.guard("s")
    async def call(i: int) -> str:
        seen[i].append(len(seen[i]) + 1)
        await anyio.sleep(0)  # interleave the callers
        if len(seen[i]) < 3:
            raise ConnectionResetError(f"caller {i}")
        return f"ok {i}"

    async def caller(i: int) -> None:
        results[i] = await call(i)

    async with anyio.create_task_group() as tg:
        for i in range(50):
            tg.start_soon(caller, i)
    assert all(attempts == [1, 2, 3] for attempts in seen.values())
    assert results == {i: f"ok {i}" for i in range(50)}
    await events.settle()
    scheduled = Counter(e.attempt for e in events.of(RetryScheduled) if e.stage == "s")
    assert scheduled == {2: 50, 3: 50}


async def test_retry_budget_stops_a_retry_storm(events: Recorder) -> None:
    clock = ragguard.FakeClock()
    g = _guard(
        attempts=3,
        retry_on=("connection",),
        clock=clock,
        budget_ratio=0.2,
        budget_min_per_s=0.0,
        budget_window_s=10.0,
    )
    flaky = Flaky()

    @g.guard("s")
    async def down() -> None:
        flaky.calls += 1
        raise ConnectionError("down")

    calls = 1000
    for _ in range(calls):  # 10 calls per simulated second for 100 s
        with pytest.raises(ConnectionError):
            await down()
        clock.advance(0.1)
    retries = flaky.calls - calls
    # without a budget this storm would make 2000 retries; the budget allows 20 % of the calls
    assert retries <= 0.2 * calls
    assert retries >= 0.18 * calls
    await events.settle()
    assert events.of(RetryBudgetExhausted)


async def test_retry_budget_is_spent_only_on_retries_that_happen(events: Recorder) -> None:
    # ratio 0: only the floor of 1 retry/s over a 10 s window, i.e. 10 retries in total
    clock = ragguard.FakeClock()
    g = _guard(
        attempts=2,
        retry_on=("connection",),
        clock=clock,
        budget_ratio=0.0,
        budget_min_per_s=1.0,
        budget_window_s=10.0,
    )
    flaky = Flaky()

    @g.guard("s")
    async def down() -> None:
        flaky.calls += 1
        raise ConnectionError("down")

    for _ in range(10):
        with pytest.raises(ConnectionError):
            await down()
    assert flaky.calls - 10 == 10  # every call got its one retry: attempts ran out, not the budget
    await events.settle()
    assert events.of(RetryBudgetExhausted) == []  # and no call was told the budget was spent
    with pytest.raises(ConnectionError):
        await down()
    assert flaky.calls == 21  # the eleventh call finds the budget spent
    await events.settle()
    assert len(events.of(RetryBudgetExhausted)) == 1


async def test_the_budget_refills_as_the_window_moves() -> None:
    clock = ragguard.FakeClock()
    g = _guard(
        attempts=2,
        retry_on=("connection",),
        clock=clock,
        budget_ratio=0.0,
        budget_min_per_s=0.5,
        budget_window_s=2.0,
    )
    flaky = Flaky()

    @g.guard("s")
    async def down() -> None:
        flaky.calls += 1
        raise ConnectionError("down")

    for _ in range(3):
        with pytest.raises(ConnectionError):
            await down()
    assert flaky.calls == 4  # one retry in the window
    clock.advance(5.0)
    flaky.calls = 0
    with pytest.raises(ConnectionError):
        await down()
    assert flaky.calls == 2  # the old retry left the window
