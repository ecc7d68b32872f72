"""Issue 13 #11 (stages): a Guard forgets the oldest idle stages past ``max_stages``, so generated
stage names cannot grow memory without bound; a stage in use or with a breaker that is not closed
is never forgotten."""

from __future__ import annotations

import gc
import logging
import tracemalloc

import pytest

from ragguard import BreakerPolicy, BreakerState, FakeClock, Guard, Policy, StagePolicy
from ragguard.breakers._live import live_breakers

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_a_hundred_thousand_generated_stage_names_keep_memory_bounded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    g = Guard(Policy(default_stage=StagePolicy(breaker=BreakerPolicy(kind="none"))), max_stages=1000)
    for i in range(1000):
        g.stage(f"warm-{i}")
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        with caplog.at_level(logging.WARNING, logger="ragguard"):
            for i in range(100_000):
                g.stage(f"tenant-{i}")
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(g.stage_names()) <= 1000
    assert grown < 2_000_000  # unbounded, 100,000 stages held tens of MB
    warned = [r for r in caplog.records if "max_stages" in r.getMessage()]
    assert len(warned) == 1  # said once, not once per forgotten stage


def test_the_breakers_of_forgotten_stages_are_freed() -> None:
    before = len(live_breakers())
    g = Guard(max_stages=100)
    for i in range(3000):
        g.breaker(f"tenant-{i}")
    gc.collect()
    assert len(g.stage_names()) <= 100
    assert len(live_breakers()) - before <= 100


@pytest.mark.parametrize("state", ["open", "half_open", "forced_open"])
def test_a_stage_whose_breaker_is_not_closed_is_never_forgotten(state: str) -> None:
    clock = FakeClock()
    breaker_policy = BreakerPolicy(
        kind="generic", minimum_calls=1, window_size=1, failure_rate_threshold=100, open_for_s=10
    )
    g = Guard(Policy(stages={"flaky": StagePolicy(breaker=breaker_policy)}), clock=clock, max_stages=10)
    breaker = g.breaker("flaky")
    if state == "forced_open":
        breaker.force_open()
    else:
        breaker.on_result(breaker.acquire(), 0.0, ConnectionRefusedError(), clock())
        if state == "half_open":
            clock.advance(10)
            breaker.release(breaker.acquire())
    assert breaker.state.value == state
    for i in range(500):
        g.stage(f"generated-{i}")
    assert "flaky" in g.stage_names()
    assert g.breaker("flaky") is breaker
    assert g.status()["open"] == ["flaky"]
    assert len(g.stage_names()) <= 10


async def test_a_stage_a_live_function_runs_is_never_forgotten() -> None:
    g = Guard(max_stages=10)

    @g.guard("search")
    async def search(q: str) -> str:
        return q

    assert await search("q") == "q"
    breaker = g.breaker("search")
    for i in range(500):
        g.stage(f"generated-{i}")
    assert "search" in g.stage_names()
    assert g.breaker("search") is breaker  # one breaker per stage: the one the function uses
    breaker.force_open()
    assert g.status()["open"] == ["search"]


async def test_stages_of_functions_that_are_gone_are_forgotten() -> None:
    g = Guard(max_stages=50)

    async def work() -> int:
        return 1

    for i in range(1000):  # stage names made per request, with a decorated function each time
        assert await g.guard(f"request-{i}")(work)() == 1
    gc.collect()
    assert len(g.stage_names()) <= 50


def test_a_forgotten_idle_stage_starts_afresh() -> None:
    g = Guard(max_stages=10)
    first = g.breaker("tenant-0")
    for i in range(1, 100):
        g.stage(f"tenant-{i}")
    assert "tenant-0" not in g.stage_names()
    assert g.breaker("tenant-0") is not first
    assert g.breaker("tenant-0").state is BreakerState.CLOSED
