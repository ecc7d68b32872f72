"""100 concurrent callers against a half-open breaker, on asyncio and trio (anyio's plugin)."""

from __future__ import annotations

import anyio
import pytest

from ragguard import BreakerOpen, FakeClock
from ragguard.breakers import BreakerState, CircuitBreaker

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

CALLERS = 100


def half_open_ready(clock: FakeClock, permits: int) -> CircuitBreaker:
    breaker = CircuitBreaker("concurrent", minimum_calls=1, window_size=1, half_open_permits=permits,
                             open_for_s=5.0, clock=clock)
    token = breaker.acquire()
    breaker.on_result(token, 0.0, ConnectionResetError())
    assert breaker.state is BreakerState.OPEN
    clock.advance(5.0)
    return breaker


@pytest.mark.parametrize("permits", [1, 7])
async def test_half_open_admits_exactly_the_permits(permits: int) -> None:
    clock = FakeClock()
    breaker = half_open_ready(clock, permits)
    release = anyio.Event()
    admitted = rejected = 0

    async def trial() -> None:
        await release.wait()

    async def caller() -> None:
        nonlocal admitted, rejected
        try:
            await breaker.call(trial)
        except BreakerOpen as exc:
            rejected += 1
            assert exc.retry_after_s == 0.0
        else:
            admitted += 1

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for _ in range(CALLERS):
                tg.start_soon(caller)
            while rejected < CALLERS - permits:  # the surplus is rejected at once; fail_after bounds it
                await anyio.sleep(0)
            assert breaker.metrics().trial_permits_left == 0
            release.set()
    assert (admitted, rejected) == (permits, CALLERS - permits)
    assert breaker.state is BreakerState.CLOSED


async def test_cancelled_trials_give_their_permits_back() -> None:
    clock = FakeClock()
    breaker = half_open_ready(clock, 3)
    started = 0

    async def hang() -> None:
        nonlocal started
        started += 1
        await anyio.sleep_forever()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(breaker.call, hang)
            while started < 3:
                await anyio.sleep(0)
            with pytest.raises(BreakerOpen):
                await breaker.call(hang)
            tg.cancel_scope.cancel()
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.metrics().trial_permits_left == 3
    assert breaker.metrics().trial_calls_done == 0


async def test_events_are_delivered_on_both_backends() -> None:
    clock = FakeClock()
    breaker = half_open_ready(clock, 1)
    seen: list[object] = []
    breaker.add_listener(seen.append)

    async def ok() -> int:
        return 1

    assert await breaker.call(ok) == 1
    for _ in range(5):
        await anyio.sleep(0)
    kinds = [type(e).__name__ for e in seen]
    assert kinds == ["BreakerTransition", "BreakerCallOutcome", "BreakerTransition"]
