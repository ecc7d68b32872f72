"""The generation preset's three stream budgets (first item, idle, total), on a FakeClock that the
test moves forward: each ends the stream with a StreamTimeout naming it, at the moment it runs out."""

from __future__ import annotations

from contextlib import aclosing
from typing import Any

import anyio
import pytest
from gen_helpers import Recorder, answer_policy, collect, drive, guard

import ragguard
from ragguard import (
    DeadlineExceeded,
    FakeClock,
    StageTimeout,
    StreamTimeout,
)
from ragguard.events import StreamCut

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(20)]


def paced_source(clock: FakeClock, gaps: list[float]) -> Any:
    """An async generator function yielding ``f"w{i} "`` after waiting ``gaps[i]`` clock seconds."""

    async def source() -> Any:
        for i, gap in enumerate(gaps):
            await clock.sleep(gap)
            yield f"w{i} "

    return source


async def test_the_first_item_budget_cuts_a_stream_whose_first_item_never_comes() -> None:
    clock = FakeClock(auto_advance=False)
    g = guard(answer_policy(first_item_s=2.0, idle_s=0.5), clock)
    answer = g.guard("answer")(paced_source(clock, [30.0, 0.1]))
    got: list[str] = []
    with pytest.raises(StreamTimeout) as cut:
        await drive(clock, collect(answer(), got))
    assert got == []
    assert (cut.value.budget, cut.value.items, cut.value.timeout_s) == ("first_item", 0, 2.0)
    assert 2.0 <= clock() <= 2.05  # cut when the budget ran out, not when the item would have come
    assert isinstance(cut.value, StageTimeout) and isinstance(cut.value, TimeoutError)
    assert "first_item budget of 2.000s ran out after 0 items" in str(cut.value)


async def test_a_slow_first_item_passes_a_long_first_item_budget_then_idle_applies() -> None:
    # a reasoning model: thinks for 40 s, then streams quickly; a short idle budget still holds
    clock = FakeClock(auto_advance=False)
    g = guard(answer_policy(first_item_s=60.0, idle_s=1.0), clock)
    answer = g.guard("answer")(paced_source(clock, [40.0, 0.5, 0.5, 0.5]))
    assert await drive(clock, collect(answer())) == ["w0 ", "w1 ", "w2 ", "w3 "]

    stalls = g.guard("answer")(paced_source(clock, [40.0, 0.5, 0.5, 3.0, 0.5]))
    got: list[str] = []
    started = clock()
    with pytest.raises(StreamTimeout) as cut:
        await drive(clock, collect(stalls(), got))
    assert got == ["w0 ", "w1 ", "w2 "]
    assert (cut.value.budget, cut.value.items, cut.value.timeout_s) == ("idle", 3, 1.0)
    assert 42.0 <= clock() - started <= 42.1  # 40 + 0.5 + 0.5, then 1 s idle


async def test_the_total_budget_sums_the_waits_for_items() -> None:
    clock = FakeClock(auto_advance=False)
    g = guard(answer_policy(first_item_s=5.0, idle_s=1.0, total_s=4.0), clock)
    # each wait is under the idle budget, but together they pass the total
    answer = g.guard("answer")(paced_source(clock, [0.9] * 10))
    got: list[str] = []
    with pytest.raises(StreamTimeout) as cut:
        await drive(clock, collect(answer(), got))
    assert (cut.value.budget, cut.value.items, cut.value.timeout_s) == ("total", 4, 4.0)
    assert len(got) == 4  # 4 x 0.9 = 3.6 s; the fifth wait is cut at 4.0
    assert 4.0 <= clock() <= 4.05


async def test_the_callers_own_time_between_items_is_not_the_streams_total() -> None:
    clock = FakeClock(auto_advance=False)
    g = guard(answer_policy(total_s=2.0), clock)
    answer = g.guard("answer")(paced_source(clock, [0.5] * 3))

    async def slow_reader() -> list[str]:
        got = []
        async with aclosing(answer()) as stream:
            async for item in stream:
                got.append(item)
                await clock.sleep(5.0)  # the consumer is slow; the producer spent 0.5 s per item
        return got

    assert await drive(clock, slow_reader(), step=0.05) == ["w0 ", "w1 ", "w2 "]
    assert clock() >= 15.0


async def test_a_budget_set_to_none_is_not_applied() -> None:
    clock = FakeClock(auto_advance=False)
    g = guard(answer_policy(first_item_s=None, idle_s=None, total_s=None), clock)
    answer = g.guard("answer")(paced_source(clock, [100.0, 200.0]))
    assert await drive(clock, collect(answer()), step=1.0) == ["w0 ", "w1 "]


async def test_the_request_deadline_cuts_with_deadline_exceeded_and_the_item_count() -> None:
    clock = FakeClock(auto_advance=False)
    g = guard(answer_policy(first_item_s=10.0, idle_s=10.0, total_s=100.0), clock)
    answer = g.guard("answer")(paced_source(clock, [1.0, 1.0, 5.0]))
    got: list[str] = []

    async def within_deadline() -> None:
        with g.deadline(3.0):
            await collect(answer(), got)

    with pytest.raises(DeadlineExceeded) as cut:
        await drive(clock, within_deadline())
    assert got == ["w0 ", "w1 "]
    assert cut.value.items == 2  # the deadline's error carries the count too
    assert not isinstance(cut.value, StageTimeout)  # the caller's budget, not the model's
    assert 3.0 <= clock() <= 3.05
    assert g.breaker("answer").metrics().failed_calls == 0


async def test_the_stages_own_timeout_s_still_bounds_each_item() -> None:
    clock = FakeClock(auto_advance=False)
    g = guard(answer_policy(timeout_s=0.5, idle_s=5.0), clock)
    answer = g.guard("answer")(paced_source(clock, [0.1, 2.0]))
    got: list[str] = []
    with pytest.raises(StageTimeout) as cut:
        await drive(clock, collect(answer(), got))
    assert type(cut.value) is StageTimeout and cut.value.items == 1
    assert got == ["w0 "]


async def test_a_cut_counts_once_against_the_breaker_and_is_announced(events: Recorder) -> None:
    clock = FakeClock(auto_advance=False)
    g = guard(answer_policy(idle_s=1.0), clock)
    answer = g.guard("answer")(paced_source(clock, [0.1, 0.1, 0.1, 9.0]))
    with pytest.raises(StreamTimeout):
        async with g.tenant("acme"):
            await drive(clock, collect(answer()))
    metrics = g.breaker("answer").metrics()
    assert (metrics.calls, metrics.failed_calls) == (1, 1)  # one stream, one failure, not per item
    await events.settle()
    assert [(e.stage, e.tenant, e.budget, e.items) for e in events.of(StreamCut)] == [
        ("answer", "acme", "idle", 3)
    ]

    assert await drive(clock, collect(g.guard("answer")(paced_source(clock, [0.1] * 20))())) != []
    metrics = g.breaker("answer").metrics()
    assert (metrics.calls, metrics.failed_calls) == (2, 1)  # twenty items, one success


async def test_an_outside_cancellation_stays_a_cancellation() -> None:
    clock = FakeClock(auto_advance=False)
    g = guard(answer_policy(idle_s=1.0), clock)
    answer = g.guard("answer")(paced_source(clock, [0.1, 30.0]))

    async def cancelled_at_half_a_second() -> bool:
        with anyio.CancelScope() as scope:
            async for _ in answer():
                clock.advance(0.5)
                scope.cancel()
        return scope.cancelled_caught

    assert await drive(clock, cancelled_at_half_a_second())
    assert g.breaker("answer").metrics().calls == 0  # released, not counted


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_the_budgets_run_on_the_real_clock_too(anyio_backend: str) -> None:
    # no FakeClock: the loop's timer wheel on asyncio, a cancel scope on trio
    g = ragguard.Guard(answer_policy(first_item_s=5.0, idle_s=0.05))

    @g.guard("answer")
    async def stalls() -> Any:
        yield "a "
        await anyio.sleep(30)
        yield "never "

    got: list[str] = []
    with anyio.fail_after(5):
        with pytest.raises(StreamTimeout) as cut:
            await collect(stalls(), got)
    assert (got, cut.value.budget, cut.value.items) == (["a "], "idle", 1)
