"""The commit point of a stream: fallbacks and retries serve only until the first item reached the
caller; after it the error reaches the caller with the count of items it had (gRPC's "committed"
rule), and the breaker counts the stream's failure once, whenever it happens."""

from __future__ import annotations

from typing import Any

import pytest
from gen_helpers import answer_policy, collect, drive, guard

import ragguard
from ragguard import (
    BreakerPolicy,
    DeadlineExceeded,
    FakeClock,
    Policy,
    StagePolicy,
    StreamTimeout,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(20)]


class Model:
    """A model's stream that stalls (``stall_at`` items in) or fails, and counts its calls."""

    def __init__(self, clock: FakeClock, *, stall_at: int | None = None, fail_at: int | None = None) -> None:
        self.clock = clock
        self.stall_at = stall_at
        self.fail_at = fail_at
        self.calls = 0
        self.closed = 0

    async def __call__(self, prompt: str) -> Any:
        self.calls += 1
        try:
            for i in range(5):
                if i == self.stall_at:
                    await self.clock.sleep(1000)
                if i == self.fail_at:
                    raise ConnectionResetError("the model dropped the stream")
                await self.clock.sleep(0.1)
                yield f"{prompt}{i} "
        finally:
            self.closed += 1


def stream_of(model: Model) -> Any:
    async def model_stream(prompt: str) -> Any:
        async for item in model(prompt):
            yield item

    return model_stream


def extractive(prompt: str) -> list[str]:
    return ["from ", "the ", "passages"]


async def served(stream: Any, got: list[Any] | None = None) -> tuple[list[Any], tuple[str, ...]]:
    """The items of ``stream`` and the fallbacks that served it (as the task that read it saw)."""
    items = await collect(stream, got)
    return items, ragguard.degraded()


async def test_a_fallback_serves_a_stream_whose_first_item_never_came() -> None:
    clock = FakeClock(auto_advance=False)
    g = guard(answer_policy(first_item_s=2.0, idle_s=1.0), clock)
    model = Model(clock, stall_at=0)
    answer = g.guard("answer", fallback=extractive)(stream_of(model))
    assert await drive(clock, served(answer("q"))) == (["from ", "the ", "passages"], ("extractive",))
    assert model.closed == 1  # the stalled stream was closed, not abandoned


async def test_no_fallback_after_the_first_item_the_error_carries_the_count() -> None:
    clock = FakeClock(auto_advance=False)
    g = guard(answer_policy(first_item_s=2.0, idle_s=1.0), clock)
    model = Model(clock, stall_at=2)
    answer = g.guard("answer", fallback=extractive)(stream_of(model))
    got: list[str] = []
    async with g.tenant("acme") as request:
        with pytest.raises(StreamTimeout) as cut:
            await drive(clock, collect(answer("q"), got))
    assert got == ["q0 ", "q1 "]  # committed: the caller keeps what it had, no fallback appended
    assert (cut.value.budget, cut.value.items) == ("idle", 2)
    # no fallback served the request; degraded() says the answer was cut short
    assert request.fallbacks == ["incomplete: answer after 2 items"]
    assert model.closed == 1


async def test_a_retry_serves_before_the_first_item_never_after() -> None:
    clock = FakeClock(auto_advance=False)
    g = guard(answer_policy(attempts=2, first_item_s=2.0, idle_s=1.0), clock)
    calls = []

    @g.guard("answer")
    async def flaky(prompt: str) -> Any:
        calls.append(prompt)
        if len(calls) == 1:
            await clock.sleep(1000)  # the first attempt's first item never comes
        for i in range(3):
            yield f"{i} "

    assert await drive(clock, collect(flaky("q"))) == ["0 ", "1 ", "2 "]
    assert len(calls) == 2

    model = Model(clock, stall_at=3)
    answer = g.guard("answer")(stream_of(model))
    with pytest.raises(StreamTimeout) as cut:
        await drive(clock, collect(answer("q")))
    assert cut.value.items == 3 and model.calls == 1  # the stall after the first item: no retry


async def test_an_error_after_the_commit_point_keeps_its_type_and_gains_a_note() -> None:
    clock = FakeClock(auto_advance=False)
    g = guard(answer_policy(idle_s=1.0), clock)
    answer = g.guard("answer", fallback=extractive)(stream_of(Model(clock, fail_at=3)))
    got: list[str] = []
    async with g.tenant("acme") as request:
        with pytest.raises(ConnectionResetError) as failed:
            await drive(clock, collect(answer("q"), got))
    assert len(got) == 3
    notes = getattr(failed.value, "__notes__", [])
    assert any("'answer' failed after 3 item(s) had reached the caller" in n for n in notes), notes
    assert request.fallbacks == ["incomplete: answer after 3 items"]  # no fallback: a cut answer

    # before the commit point the same error is the fallback's to serve, and gains no note
    early = g.guard("answer", fallback=extractive)(stream_of(Model(clock, fail_at=0)))
    assert await drive(clock, served(early("q"))) == (["from ", "the ", "passages"], ("extractive",))


async def test_the_deadline_cutting_any_stream_says_how_many_items_it_delivered() -> None:
    # the count is the stream driver's, for every stage (here: no preset at all)
    clock = FakeClock(auto_advance=False)
    g = guard(Policy(stages={"plain": StagePolicy(breaker=BreakerPolicy(kind="none"))}), clock)

    @g.guard("plain")
    async def tokens() -> Any:
        for i in range(10):
            await clock.sleep(1.0)
            yield i

    async def within() -> None:
        with g.deadline(3.5):
            await collect(tokens())

    with pytest.raises(DeadlineExceeded) as cut:
        await drive(clock, within())
    assert cut.value.items == 3


async def test_the_breaker_counts_a_streams_failure_once_before_or_after_the_first_item() -> None:
    clock = FakeClock(auto_advance=False)
    g = guard(answer_policy(first_item_s=2.0, idle_s=1.0), clock)
    breaker = g.breaker("answer")

    late = g.guard("answer", fallback=extractive)(stream_of(Model(clock, stall_at=4)))
    with pytest.raises(StreamTimeout):
        await drive(clock, collect(late("q")))
    assert (breaker.metrics().calls, breaker.metrics().failed_calls) == (1, 1)

    early = g.guard("answer", fallback=extractive)(stream_of(Model(clock, stall_at=0)))
    await drive(clock, collect(early("q")))  # served by the fallback
    assert (breaker.metrics().calls, breaker.metrics().failed_calls) == (2, 2)

    whole = g.guard("answer")(stream_of(Model(clock)))
    assert len(await drive(clock, collect(whole("q")))) == 5
    assert (breaker.metrics().calls, breaker.metrics().failed_calls) == (3, 2)


async def test_an_open_breaker_serves_the_fallback_without_calling_the_model() -> None:
    clock = FakeClock(auto_advance=False)
    g = guard(answer_policy(first_item_s=2.0), clock)
    model = Model(clock)
    answer = g.guard("answer", fallback=extractive)(stream_of(model))
    g.breaker("answer").force_open()
    assert await drive(clock, collect(answer("q"))) == ["from ", "the ", "passages"]
    assert model.calls == 0


async def test_a_chaos_latency_on_the_opening_is_part_of_the_wait_for_the_first_item() -> None:
    # chaos faults hit a stream's opening (its time to first item): the first-item budget covers it
    from ragguard.chaos import Chaos, Latency

    clock = FakeClock(auto_advance=False)
    chaos = Chaos(clock=clock, sleep=clock.sleep)
    g = ragguard.Guard(answer_policy(first_item_s=2.0, idle_s=1.0), clock=clock, chaos=chaos)
    model = Model(clock)
    answer = g.guard("answer", fallback=extractive)(stream_of(model))
    chaos.inject(Latency(30.0), stage="answer")
    started = clock()
    assert await drive(clock, served(answer("q"))) == (["from ", "the ", "passages"], ("extractive",))
    assert 2.0 <= clock() - started <= 2.05  # cut at the budget, not after the injected 30 s
    assert model.calls == 0  # the latency came before the model was called


async def test_the_stage_timeout_bounds_a_chaos_latency_on_any_streams_opening() -> None:
    from ragguard.chaos import Chaos, Latency

    clock = FakeClock(auto_advance=False)
    chaos = Chaos(clock=clock, sleep=clock.sleep)
    policy = Policy(stages={"plain": StagePolicy(timeout_s=1.0, breaker=BreakerPolicy(kind="none"))})
    g = ragguard.Guard(policy, clock=clock, chaos=chaos)

    @g.guard("plain")
    async def tokens() -> Any:
        yield 1

    chaos.inject(Latency(30.0), stage="plain")
    with pytest.raises(ragguard.StageTimeout) as cut:
        await drive(clock, collect(tokens()))
    assert cut.value.items is None and 1.0 <= clock() <= 1.05
