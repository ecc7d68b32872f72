"""The adaptive limits fed by the monitors: a real stall detector's loop lag, a pool monitor's waits."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from ragguard import AdaptivePolicy, FakeClock, Guard, Policy, StagePolicy
from ragguard.events import EventBus, bus
from ragguard.monitors import PoolExhausted, StallDetector
from ragguard.overload import limiters, watch


def _guard(clock: FakeClock) -> Guard:
    lagging = AdaptivePolicy(initial_limit=40, max_limit=100, probe_samples=1, backoff=0.5,
                             signals=("loop_lag",), loop_lag_s=0.05)
    pooled = AdaptivePolicy(initial_limit=40, max_limit=100, probe_samples=1, backoff=0.5,
                            signals=("pool_wait",))
    stages = {"embed": StagePolicy(adaptive=lagging), "cache": StagePolicy(adaptive=pooled)}
    return Guard(Policy(stages=stages), clock=clock, rng=random.Random(1))


async def _built(g: Guard) -> None:
    for stage in ("embed", "cache"):
        async def call() -> int:
            return 1

        await g.guard(stage)(call)()  # builds the stage's limiter and ends its first probe


@pytest.mark.anyio
async def test_a_real_loop_stall_presses_the_limits_that_listen_for_loop_lag() -> None:
    clock = FakeClock()
    g = _guard(clock)
    await _built(g)
    lims = limiters(g)
    assert lims["embed"].limit == 40 and lims["cache"].limit == 40
    private = EventBus(parent=bus)  # the monitors' own bus: guarded calls stay on the fast path
    stop = watch(g, private)
    assert not bus.active
    detector = StallDetector(threshold_s=0.02, bus=private).start()
    try:
        await asyncio.sleep(0.05)
        time.sleep(0.12)
        for _ in range(50):
            await asyncio.sleep(0.01)
            if lims["embed"].pressed:
                break
    finally:
        detector.stop()
        stop()
    assert detector.stalls >= 1
    assert lims["embed"].pressed == {"loop_lag": 1} and lims["embed"].limit == 20
    assert lims["cache"].pressed == {} and lims["cache"].limit == 40  # not listening for loop lag


@pytest.mark.anyio
async def test_pool_waits_press_the_limits_that_listen_for_them_and_short_stalls_are_ignored() -> None:
    clock = FakeClock()
    g = _guard(clock)
    await _built(g)
    lims = limiters(g)
    private = EventBus()
    stop = watch(g, private)
    try:
        private.emit(PoolExhausted("redis", "slow_acquire", 10, 0, 10, 3, 0.2, 0.0, 0.2))
        private.emit(PoolExhausted("redis", "headroom", 8, 2, 10, 0, 0.0, 0.0, 0.2))  # not a wait
        from ragguard.monitors import LoopStall

        private.emit(LoopStall(0.01, 0.0, 0.01, "", "", 0, ""))  # under loop_lag_s
        await asyncio.sleep(0.01)
    finally:
        stop()
    assert lims["cache"].pressed == {"pool_wait": 1} and lims["cache"].limit == 20
    assert lims["embed"].pressed == {}
