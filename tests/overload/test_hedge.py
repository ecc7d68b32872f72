"""Hedged requests on the fake clock: the delay, first success wins, errors cannot win, the budget,
and every slot released on cancellation."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from overload_helpers import settle

from ragguard import AdaptivePolicy, FakeClock, Guard, HedgePolicy, Policy, StagePolicy
from ragguard.layers._hedge import hedge_state
from ragguard.overload import limiters


def _guard(clock: FakeClock, **hedge: Any) -> Guard:
    hedge.setdefault("budget_min_per_s", 1.0)  # a quiet stage may hedge its first calls
    policy = Policy(stages={"search": StagePolicy(
        idempotent=True,
        hedge=HedgePolicy(min_samples=5, **hedge),
        adaptive=AdaptivePolicy(min_limit=32, initial_limit=32, max_limit=32, probe_limit=32, max_queue=0.0,
                                early_queue=0.0),
    )})
    g = Guard(policy, clock=clock, rng=random.Random(1))
    return g


def _warm(g: Guard, latency_s: float = 0.1) -> None:
    state = hedge_state(g.stage("search"))
    for _ in range(20):
        state.tracker.add(latency_s)


class Dependency:
    """Answers after the latency (fake seconds) given per call, in order; raises an error given instead."""

    def __init__(self, clock: FakeClock, plan: list[Any]) -> None:
        self.clock = clock
        self.plan = plan
        self.started = 0
        self.cancelled = 0
        self.finished = 0

    async def __call__(self, q: str) -> str:
        i = self.started
        self.started += 1
        latency, outcome = self.plan[i]
        try:
            await self.clock.sleep(latency)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.finished += 1
        if isinstance(outcome, BaseException):
            raise outcome
        return f"{outcome}"


@pytest.mark.anyio
async def test_a_slow_call_is_hedged_after_the_p95_and_the_first_success_wins() -> None:
    clock = FakeClock(auto_advance=False)
    g = _guard(clock)
    _warm(g, 0.1)
    dep = Dependency(clock, [(5.0, "slow"), (0.05, "hedge")])
    call = g.guard("search")(dep)
    task = asyncio.create_task(call("q"))
    await settle()
    assert dep.started == 1
    clock.advance(0.099)
    await settle()
    assert dep.started == 1  # not before the delay
    clock.advance(0.002)
    await settle()
    assert dep.started == 2  # the hedge
    clock.advance(0.05)
    await settle()
    assert await task == "hedge"
    assert dep.cancelled == 1  # the loser was cancelled...
    lim = limiters(g)["search"]
    assert lim.in_flight == 0  # ...and both legs' slots are back
    state = hedge_state(g.stage("search"))
    assert (state.fired, state.won) == (1, 1)


@pytest.mark.anyio
async def test_a_fast_call_is_not_hedged() -> None:
    clock = FakeClock(auto_advance=False)
    g = _guard(clock)
    _warm(g, 0.1)
    dep = Dependency(clock, [(0.01, "fast")])
    task = asyncio.create_task(g.guard("search")(dep)("q"))
    await settle()
    clock.advance(0.01)
    await settle()
    assert await task == "fast"
    clock.advance(1.0)
    await settle()
    assert dep.started == 1 and hedge_state(g.stage("search")).fired == 0


@pytest.mark.anyio
async def test_a_fast_error_of_the_hedge_never_wins() -> None:
    clock = FakeClock(auto_advance=False)
    g = _guard(clock)
    _warm(g, 0.1)
    dep = Dependency(clock, [(0.5, "primary"), (0.0, ConnectionResetError("hedge failed fast"))])
    task = asyncio.create_task(g.guard("search")(dep)("q"))
    await settle()
    clock.advance(0.11)
    await settle()
    assert dep.started == 2 and not task.done()  # the hedge failed: set aside, the first leg runs on
    clock.advance(0.4)
    await settle()
    assert await task == "primary"
    assert limiters(g)["search"].in_flight == 0


@pytest.mark.anyio
async def test_when_the_first_leg_fails_the_hedge_under_way_still_answers() -> None:
    clock = FakeClock(auto_advance=False)
    g = _guard(clock)
    _warm(g, 0.1)
    dep = Dependency(clock, [(0.2, ConnectionResetError("primary failed")), (0.3, "hedge")])
    task = asyncio.create_task(g.guard("search")(dep)("q"))
    await settle()
    clock.advance(0.11)
    await settle()
    clock.advance(0.1)  # the first leg fails at 0.2 while the hedge (sent at 0.1) runs
    await settle()
    assert not task.done()
    clock.advance(0.3)
    await settle()
    assert await task == "hedge"


@pytest.mark.anyio
async def test_both_legs_failing_raises_the_first_legs_error() -> None:
    clock = FakeClock(auto_advance=False)
    g = _guard(clock)
    _warm(g, 0.1)
    dep = Dependency(clock, [(0.2, ConnectionResetError("primary")), (0.05, ConnectionResetError("hedge"))])
    task = asyncio.create_task(g.guard("search")(dep)("q"))
    await settle()
    clock.advance(0.11)
    await settle()
    clock.advance(0.1)
    await settle()
    with pytest.raises(ConnectionResetError, match="primary"):
        await task


@pytest.mark.anyio
async def test_hedges_stay_within_their_budget_of_calls() -> None:
    clock = FakeClock(auto_advance=False)
    # max_delay_s keeps every call wanting a hedge after 0.1 s, whatever the latencies seen
    g = _guard(clock, budget_ratio=0.1, budget_window_s=1000.0, budget_min_per_s=0.0, max_delay_s=0.1)
    _warm(g, 0.1)
    dep = Dependency(clock, [(1.0, "slow")] * 400)
    call = g.guard("search")(dep)
    for _ in range(10):  # 10 rounds of 10 concurrent slow calls
        tasks = [asyncio.create_task(call("q")) for _ in range(10)]
        await settle()
        for _ in range(12):
            clock.advance(0.1)
            await settle()
        await asyncio.gather(*tasks)
    state = hedge_state(g.stage("search"))
    assert 1 <= state.fired <= 10  # at most 10% of the 100 calls
    assert state.refused >= 80
    assert dep.started == 100 + state.fired


@pytest.mark.anyio
async def test_cancelling_a_hedged_call_releases_every_slot() -> None:
    clock = FakeClock(auto_advance=False)
    g = _guard(clock)
    _warm(g, 0.1)
    before = asyncio.all_tasks()
    dep = Dependency(clock, [(5.0, "a"), (5.0, "b")])
    task = asyncio.create_task(g.guard("search")(dep)("q"))
    await settle()
    clock.advance(0.11)
    await settle()
    lim = limiters(g)["search"]
    assert dep.started == 2 and lim.in_flight == 2
    task.cancel()
    await settle()
    assert task.cancelled()
    assert dep.cancelled == 2 and lim.in_flight == 0
    assert asyncio.all_tasks() == before  # the hedge helper is gone too


@pytest.mark.anyio
async def test_on_the_loops_clock_the_hedge_starts_from_a_timer_and_fast_calls_make_no_task() -> None:
    """A Guard on real monotonic time: the hedge's start is a loop timer (a task only when a hedge
    is sent). Real time, kept to tens of milliseconds."""
    stage = StagePolicy(idempotent=True, hedge=HedgePolicy(min_samples=5, budget_min_per_s=10.0))
    g = Guard(Policy(stages={"search": stage}), rng=random.Random(1))
    state = hedge_state(g.stage("search"))
    for _ in range(20):
        state.tracker.add(0.02)
    created: list[Any] = []
    loop = asyncio.get_running_loop()
    factory = loop.get_task_factory()
    loop.set_task_factory(lambda lp, coro, **kw: created.append(coro) or asyncio.Task(coro, loop=lp, **kw))
    try:
        calls = {"n": 0}

        @g.guard("search")
        async def search(q: str) -> str:
            calls["n"] += 1
            await asyncio.sleep(0.001 if q == "fast" else (1.0 if calls["n"] == 2 else 0.005))
            return f"{q}-{calls['n']}"

        assert await search("fast") == "fast-1"
        assert created == []  # answered before the delay: no task at all
        t0 = loop.time()
        assert await search("slow") == "slow-3"  # the first leg (call 2) sleeps 1 s; the hedge wins
        assert loop.time() - t0 < 0.5 and (state.fired, state.won) == (1, 1)
        assert len(created) == 1
    finally:
        loop.set_task_factory(factory)


@pytest.mark.anyio
async def test_a_hedged_stage_on_the_documented_test_guard_keeps_fake_time() -> None:
    """fresh_guard's auto-advancing FakeClock: the hedge's start is the clock's timer, which never
    moves time by itself, so a 10 ms call under a 50 ms deadline answers at 10 ms; a slow call is
    hedged at its delay, on the same discrete-event time."""
    from ragguard.testing import fresh_guard

    hedge = {"min_samples": 5, "budget_min_per_s": 1.0}
    policy = {"stages": {"search": {"idempotent": True, "hedge": hedge}}}
    with fresh_guard(policy) as g:
        clock = g.clock
        assert isinstance(clock, FakeClock)
        _warm(g, 0.1)
        latencies = [0.01]

        @g.guard("search")
        async def search(q: str) -> str:
            latency = latencies.pop(0)
            await clock.sleep(latency)
            return f"{q} after {latency}"

        with g.deadline(0.05):
            assert await search("fast") == "fast after 0.01"
        assert clock() == pytest.approx(0.01)
        state = hedge_state(g.stage("search"))
        assert (state.fired, state.refused, state.skipped) == (0, 0, 0)

        latencies[:] = [5.0, 0.02]  # the first leg hangs; the hedge, sent at 0.1 s, answers at 0.12 s
        start = clock()
        assert await search("slow") == "slow after 0.02"
        assert clock() - start == pytest.approx(0.12)
        assert (state.fired, state.won) == (1, 1)


@pytest.mark.anyio
async def test_concurrent_hedged_calls_overlap_on_the_fake_clock() -> None:
    from ragguard.testing import fresh_guard

    hedge = {"min_samples": 5, "budget_min_per_s": 10.0}
    policy = {"stages": {"search": {"idempotent": True, "hedge": hedge}}}
    with fresh_guard(policy) as g:
        clock = g.clock
        assert isinstance(clock, FakeClock)
        _warm(g, 0.1)
        plan = [0.05] * 9 + [3.0, 0.04]  # the tenth call hangs; its hedge answers

        @g.guard("search")
        async def search(i: int) -> float:
            await clock.sleep(plan.pop(0))
            return clock()

        done = await asyncio.gather(*(search(i) for i in range(10)))
    assert done == [pytest.approx(0.05)] * 9 + [pytest.approx(0.14)]
    assert hedge_state(g.stage("search")).won == 1


@pytest.mark.anyio
async def test_a_hedge_with_no_time_left_is_neither_sent_nor_charged() -> None:
    """At the hedge delay the deadline leaves less than min_attempt_s: the timeout layer would refuse
    the leg, so no hedge is counted, announced or charged to the budget (one hedge per window here),
    and the next slow call still gets its hedge."""
    from ragguard.events import bus
    from ragguard.testing import EventRecorder

    clock = FakeClock(auto_advance=False)
    policy = Policy(stages={"search": StagePolicy(min_attempt_s=0.05, idempotent=True, hedge=HedgePolicy(
        min_samples=5, budget_ratio=0.0, budget_min_per_s=0.1, budget_window_s=10.0))})
    g = Guard(policy, clock=clock, rng=random.Random(1))
    _warm(g, 0.1)
    dep = Dependency(clock, [(0.11, "first"), (1.0, "slow"), (0.05, "hedge")])
    search = g.guard("search")(dep)
    state = hedge_state(g.stage("search"))

    async def within_deadline() -> str:
        with g.deadline(0.12):
            return await search("q")

    with EventRecorder(bus) as seen:
        first = asyncio.create_task(within_deadline())
        await settle()
        clock.advance(0.1)  # the hedge delay: only 0.02 s of the deadline are left
        await settle()
        assert state.fired == 0 and dep.started == 1
        clock.advance(0.01)
        await settle()
        assert await first == "first"
        second = asyncio.create_task(search("q"))
        await settle()
        clock.advance(0.1)
        await settle()
        assert dep.started == 3  # the one hedge of the window was not spent above
        clock.advance(0.05)
        await settle()
        assert await second == "hedge"
        await seen.settle()
    assert (state.fired, state.won, state.refused, state.skipped) == (1, 1, 0, 1)
    assert [type(e).__name__ for e in seen.events if type(e).__name__ == "HedgeFired"] == ["HedgeFired"]


@pytest.mark.anyio
async def test_a_hedge_an_inner_layer_refuses_gives_its_budget_back() -> None:
    """The adaptive limit sheds the second leg before it reaches the dependency: not counted as sent,
    its budget given back (one hedge per window here), so a later call can still hedge."""
    clock = FakeClock(auto_advance=False)
    policy = Policy(stages={"search": StagePolicy(
        idempotent=True,
        hedge=HedgePolicy(min_samples=5, budget_ratio=0.0, budget_min_per_s=0.1, budget_window_s=10.0),
        adaptive=AdaptivePolicy(min_limit=1, initial_limit=1, max_limit=1, probe_limit=1, probe_samples=1,
                                max_queue=0.0, early_queue=0.0),
    )})
    g = Guard(policy, clock=clock, rng=random.Random(1))
    _warm(g, 0.1)
    dep = Dependency(clock, [(0.01, "probe"), (0.5, "first")])
    search = g.guard("search")(dep)
    for expected in ("probe", "first"):  # the first ends the limit's start-up probe: the limit is 1
        task = asyncio.create_task(search("q"))
        for _ in range(60):
            await settle()
            clock.advance(0.01)
        assert await task == expected
    state = hedge_state(g.stage("search"))
    assert state.fired == 0 and dep.started == 2  # the second call's hedge was shed by the limit of 1
    assert limiters(g)["search"].shed_reasons == {"limit": 1}
    assert state.blocked == 1
    assert state.budget.try_spend()  # type: ignore[attr-defined]  # the window's one hedge is still there


@pytest.mark.anyio
@pytest.mark.ragguard_policy(
    {"stages": {"search": {"idempotent": True, "hedge": {"min_samples": 5, "budget_min_per_s": 1.0}}}}
)
async def test_the_pytest_guard_fixture_hedges_on_fake_time(guard: Any, fake_clock: FakeClock) -> None:
    """The plugin's ``guard`` fixture (a fresh Guard on ``fake_clock``): a fast call keeps its time
    under a deadline shorter than the hedge delay, a hung one is hedged at the delay."""
    _warm(guard, 0.1)
    dep = Dependency(fake_clock, [(0.01, "fast"), (60.0, "hung"), (0.03, "hedge")])
    search = guard.guard("search")(dep)
    with guard.deadline(0.05):
        assert await search("q") == "fast"
    assert fake_clock() == pytest.approx(0.01)
    assert await search("q") == "hedge"
    assert fake_clock() == pytest.approx(0.01 + 0.1 + 0.03)
