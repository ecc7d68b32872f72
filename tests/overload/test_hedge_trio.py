"""Hedged requests on trio (the core runs on asyncio and trio): the same race as on asyncio, its
helper in a nursery that ends before the call returns, on a FakeClock and on trio's own clock."""

from __future__ import annotations

import random
from typing import Any

import pytest
import trio
import trio.testing

from ragguard import AdaptivePolicy, FakeClock, Guard, HedgePolicy, Policy, StagePolicy
from ragguard.layers._hedge import hedge_state
from ragguard.overload import limiters

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(20)]


@pytest.fixture
def anyio_backend() -> Any:
    return "trio"


def _guard(clock: Any) -> Guard:
    policy = Policy(stages={"search": StagePolicy(
        idempotent=True,
        hedge=HedgePolicy(min_samples=5, budget_min_per_s=1.0),
        adaptive=AdaptivePolicy(min_limit=32, initial_limit=32, max_limit=32, probe_limit=32, max_queue=0.0,
                                early_queue=0.0),
    )})
    g = Guard(policy, clock=clock, rng=random.Random(1))
    state = hedge_state(g.stage("search"))
    for _ in range(20):
        state.tracker.add(0.1)
    return g


class Dependency:
    """Answers after the latency (seconds of ``sleep``) given per call, in order; raises an error
    given instead."""

    def __init__(self, sleep: Any, plan: list[Any]) -> None:
        self.sleep = sleep
        self.plan = plan
        self.started = 0
        self.cancelled = 0

    async def __call__(self, q: str) -> str:
        latency, outcome = self.plan[self.started]
        self.started += 1
        try:
            await self.sleep(latency)
        except trio.Cancelled:
            self.cancelled += 1
            raise
        if isinstance(outcome, BaseException):
            raise outcome
        return str(outcome)


async def test_a_hung_first_leg_is_hedged_on_trio_and_the_loser_released() -> None:
    clock = FakeClock()
    g = _guard(clock)
    dep = Dependency(clock.sleep, [(5.0, "hung"), (0.05, "hedge")])
    assert await g.guard("search")(dep)("q") == "hedge"
    assert clock() == pytest.approx(0.15)  # sent at the 0.1 s delay, answered 0.05 s later
    assert dep.cancelled == 1 and limiters(g)["search"].in_flight == 0
    state = hedge_state(g.stage("search"))
    assert (state.fired, state.won) == (1, 1)


async def test_a_fast_call_on_trio_is_not_hedged() -> None:
    clock = FakeClock()
    g = _guard(clock)
    dep = Dependency(clock.sleep, [(0.01, "fast")])
    assert await g.guard("search")(dep)("q") == "fast"
    await clock.sleep(1.0)  # long past the delay: no hedge was left waiting
    assert dep.started == 1 and hedge_state(g.stage("search")).fired == 0


async def test_on_trio_an_error_never_wins_and_both_failing_raise_the_first_legs() -> None:
    clock = FakeClock()
    g = _guard(clock)
    search = g.guard("search")(Dependency(clock.sleep, [
        (0.5, "primary"), (0.0, ConnectionResetError("hedge failed fast")),  # the hedge's error is set aside
        (0.2, ConnectionResetError("primary failed")), (0.3, "hedge"),      # the hedge under way answers
        (0.2, ConnectionResetError("primary")), (0.05, ConnectionResetError("hedge")),
    ]))
    assert await search("q") == "primary"
    assert await search("q") == "hedge"
    with pytest.raises(ConnectionResetError, match="primary"):  # the error itself, not an exception group
        await search("q")
    assert limiters(g)["search"].in_flight == 0


async def test_cancelling_a_hedged_call_on_trio_releases_both_legs() -> None:
    clock = FakeClock(auto_advance=False)
    g = _guard(clock)
    dep = Dependency(clock.sleep, [(5.0, "a"), (5.0, "b")])
    caught: list[BaseException] = []
    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def call() -> None:
            with scope:
                try:
                    await g.guard("search")(dep)("q")
                except BaseException as exc:
                    caught.append(exc)
                    raise

        nursery.start_soon(call)
        await clock.settle()
        clock.advance(0.11)
        await clock.settle()
        lim = limiters(g)["search"]
        assert dep.started == 2 and lim.in_flight == 2
        scope.cancel()
    assert [type(e) for e in caught] == [trio.Cancelled]  # a plain cancellation, not a group
    assert dep.cancelled == 2 and lim.in_flight == 0


@pytest.mark.parametrize("anyio_backend", [("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)})])
async def test_on_trios_own_clock_the_hedge_waits_on_trio_time() -> None:
    """A Guard on trio's clock (here trio's MockClock, which jumps while every task waits): the
    hedge's delay is a trio sleep."""
    g = _guard(trio.current_time)
    dep = Dependency(trio.sleep, [(30.0, "hung"), (0.05, "hedge")])
    start = trio.current_time()
    assert await g.guard("search")(dep)("q") == "hedge"
    assert trio.current_time() - start == pytest.approx(0.15)
    assert dep.cancelled == 1
