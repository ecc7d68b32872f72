"""Issue 13 #6: a deadline of about 1.8e305 seconds or more (or any budget past what a timer can
hold) must not make guarded calls and streams raise OverflowError, count against the breaker, or
leave the dependency's coroutine never awaited; on asyncio and on trio."""

from __future__ import annotations

import gc
import warnings
from contextlib import aclosing
from typing import Any

import pytest

from ragguard import BreakerPolicy, Guard, Policy, StagePolicy, deadline, remaining

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(20)]

HUGE = [1.8e305, 1e308, float("inf"), 10**300, 5 * 365 * 86400.0, 1e8, 1e8 - 1]


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _guard() -> Guard:
    breaker = BreakerPolicy(kind="generic", minimum_calls=1, window_size=1, failure_rate_threshold=100)
    return Guard(
        Policy(
            stages={
                "s": StagePolicy(timeout_s=30.0, breaker=breaker),
                "untimed": StagePolicy(breaker=breaker),
            }
        )
    )


@pytest.mark.parametrize("seconds", HUGE, ids=str)
async def test_guarded_calls_and_streams_run_under_a_huge_deadline(seconds: float) -> None:
    g = _guard()
    awaited: list[str] = []

    async def dependency(stage: str) -> str:
        awaited.append(stage)
        return "ok"

    @g.guard("s")
    async def timed() -> str:
        return await dependency("s")

    @g.guard("untimed")
    async def untimed() -> str:
        return await dependency("untimed")

    @g.guard("untimed")
    async def tokens() -> Any:
        yield await dependency("stream")
        yield "more"

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with deadline(seconds):
            left = remaining()
            assert left is None or left > 1e7
            assert await timed() == "ok"
            assert await untimed() == "ok"
            async with aclosing(tokens()) as stream:
                assert [item async for item in stream] == ["ok", "more"]
            async with g.deadline(seconds):
                assert await untimed() == "ok"
        gc.collect()
    assert awaited == ["s", "untimed", "stream", "untimed"]
    assert not [w for w in caught if "never awaited" in str(w.message)]
    for stage in ("s", "untimed"):
        metrics = g.breaker(stage).metrics()
        assert metrics.failed_calls == 0 and metrics.calls >= 1


async def test_a_huge_outer_deadline_still_lets_an_inner_one_bound_the_call() -> None:
    g = _guard()

    @g.guard("untimed")
    async def untimed() -> float | None:
        return remaining()

    async with deadline(1.8e305), deadline(5.0):
        left = await untimed()
    assert left is not None and 0 < left <= 5.0
