"""Attempt timeouts: the asyncio timer wheel and trio's CancelScope behind ``call_with_timeout``."""

from __future__ import annotations

import random
import time

import anyio
import pytest
from core_helpers import virtual_time_backends

from ragguard import BreakerPolicy, BreakerState, Guard, Policy, StagePolicy
from ragguard._timeouts import AttemptTimeout, call_with_timeout

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(20)]


async def _sleep_then(value: str, seconds: float) -> str:
    await anyio.sleep(seconds)
    return value


async def test_no_timeout_and_a_fast_call() -> None:
    assert await call_with_timeout(_sleep_then("a", 0), None) == "a"
    assert await call_with_timeout(_sleep_then("b", 0), 5.0) == "b"


async def test_a_slow_call_times_out_as_a_timeout_error() -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        await call_with_timeout(_sleep_then("late", 10), 0.03)
    assert isinstance(info.value, AttemptTimeout)
    assert 0.025 <= time.monotonic() - started < 0.5


# On virtual time: a call of sleep(0) finishes before its 10 ms timeout however long the machine
# stalls the loop (on the real clock a stall of 10 ms timed such a call out), and a stale timer
# still fires, at its time, in the sleep below.
@pytest.mark.parametrize("anyio_backend", virtual_time_backends())
async def test_a_finished_call_leaves_no_timer_behind() -> None:
    for _ in range(50):
        await call_with_timeout(_sleep_then("x", 0), 0.01)
    await anyio.sleep(0.05)  # a stale timer would cancel this sleep
    assert await call_with_timeout(_sleep_then("y", 0.001), 1.0) == "y"


# On virtual time: the loop's clock moves only when every task waits, so which timer fires first
# depends on the timers alone. On the real clock a CPU stall longer than the margin between a
# call's end and its timeout (30 ms here) makes both due in one loop iteration, and the timeout
# cancels a call that had finished in time.
@pytest.mark.parametrize("anyio_backend", virtual_time_backends())
async def test_a_shorter_timeout_registered_later_fires_first() -> None:
    results: dict[str, tuple[str, float]] = {}

    async def run(name: str, timeout: float, duration: float) -> None:
        started = anyio.current_time()
        try:
            await call_with_timeout(_sleep_then(name, duration), timeout)
            results[name] = ("ok", anyio.current_time() - started)
        except TimeoutError:
            results[name] = ("timeout", anyio.current_time() - started)

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, "long", 2.0, 0.3)
        await anyio.sleep(0.01)
        tg.start_soon(run, "short", 0.03, 5.0)
    assert results["short"][0] == "timeout" and results["short"][1] < 0.2
    assert results["long"][0] == "ok" and results["long"][1] < 2.0


@pytest.mark.parametrize("anyio_backend", virtual_time_backends())
async def test_many_concurrent_timeouts_fire_for_exactly_the_slow_calls() -> None:
    rng = random.Random(5)
    plans = []
    for i in range(150):
        timeout = rng.choice([0.03, 0.06, 0.09, 0.12])
        slow = rng.random() < 0.5
        duration = timeout + 0.15 if slow else max(0.0, timeout - 0.03 - rng.random() * 0.02)
        plans.append((i, timeout, duration, slow))
    outcome: dict[int, tuple[bool, float]] = {}

    async def run(i: int, timeout: float, duration: float) -> None:
        started = anyio.current_time()
        try:
            await call_with_timeout(_sleep_then("x", duration), timeout)
            outcome[i] = (False, anyio.current_time() - started)
        except TimeoutError:
            outcome[i] = (True, anyio.current_time() - started)

    async with anyio.create_task_group() as tg:
        for i, timeout, duration, _ in plans:
            tg.start_soon(run, i, timeout, duration)
    for i, timeout, _, slow in plans:
        timed_out, took = outcome[i]
        assert timed_out == slow, (i, timeout, took)
        if slow:  # on time: the wheel fires at most one 1 ms bucket late
            assert timeout <= took < timeout + 0.002, (i, timeout, took)


async def test_an_outer_stage_timeout_cancels_an_inner_guarded_call_without_counting_it() -> None:
    counted = BreakerPolicy(kind="generic", minimum_calls=1, failure_rate_threshold=100, open_for_s=60)
    g = Guard(
        Policy(
            stages={
                "outer": StagePolicy(timeout_s=0.05, breaker=counted),
                "inner": StagePolicy(timeout_s=5.0, breaker=counted),
            }
        )
    )

    @g.guard("inner")
    async def inner() -> None:
        await anyio.sleep(10)

    @g.guard("outer")
    async def outer() -> None:
        await inner()

    with pytest.raises(TimeoutError):
        await outer()
    assert g.breaker("outer").state is BreakerState.OPEN
    assert g.breaker("inner").state is BreakerState.CLOSED  # cancelled, not failed
    assert g.breaker("inner").metrics().calls == 0


async def test_an_external_cancel_stays_a_cancellation() -> None:
    with anyio.move_on_after(0.02) as scope:
        await call_with_timeout(_sleep_then("x", 10), 5.0)
    assert scope.cancelled_caught
    # and the task is usable afterwards: no stray cancellation pending
    assert await call_with_timeout(_sleep_then("after", 0.01), 1.0) == "after"


async def test_an_awaitable_that_fails_early_leaves_no_timer_to_cancel_the_task_later(
    anyio_backend: str,
) -> None:
    """A call that raises before its timeout must take its timer with it: left armed, the timer
    would cancel the task later, in the middle of whatever it does next."""

    async def refused() -> None:
        raise ConnectionRefusedError("down")

    for _ in range(3):
        with pytest.raises(ConnectionRefusedError):
            await call_with_timeout(refused(), 0.02)
    await anyio.sleep(0.06)  # past every timeout armed above: none may fire on this task now
    assert await _sleep_then("still running", 0.01) == "still running"
