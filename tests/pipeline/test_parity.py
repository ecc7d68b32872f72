"""Calls and streams are guarded by the same layers: chaos, shared breakers, counting, quotas,
retries and fallbacks behave alike (for a stream: up to its first item)."""

from __future__ import annotations

import random
from contextlib import aclosing
from typing import Any

import anyio
import pytest

from ragguard import (
    BreakerPolicy,
    BreakerState,
    FakeClock,
    Guard,
    Policy,
    QuotaExceeded,
    RetryPolicy,
    StagePolicy,
    StageTimeout,
    TenantQuota,
    degraded,
)
from ragguard.chaos import Chaos, Error, Latency

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(20)]


def _trip_on_first(**extra: Any) -> BreakerPolicy:
    return BreakerPolicy(
        kind="generic", minimum_calls=1, window_size=1, failure_rate_threshold=100, open_for_s=5, **extra
    )


def _guard(clock: FakeClock, **stage: Any) -> Guard:
    stage.setdefault("idempotent", True)  # reads: these tests are about calls and streams alike
    return Guard(Policy(stages={"tokens": StagePolicy(**stage), "answer": StagePolicy(**stage)}), clock=clock)


def _pair(g: Guard, opened: list[str], **options: Any) -> tuple[Any, Any]:
    @g.guard("answer", **options)
    async def answer(q: str) -> str:
        opened.append("call")
        return f"answer:{q}"

    @g.guard("tokens", **options)
    async def tokens(q: str) -> Any:
        opened.append("stream")
        for word in ("a", "b", "c"):
            yield word

    return answer, tokens


# -- chaos ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("scope", ["process", "guard"])
async def test_an_error_fault_hits_a_streams_opening_as_it_hits_a_call(scope: str) -> None:
    clock = FakeClock()
    g = _guard(clock, breaker=_trip_on_first())
    opened: list[str] = []
    answer, tokens = _pair(g, opened)
    chaos = Chaos(rng=random.Random(0), sleep=clock.sleep)
    handle = chaos.inject(Error(kind="connection_refused"), stage=["answer", "tokens"])
    chaos.install(None if scope == "process" else g)
    try:
        with pytest.raises(ConnectionRefusedError):
            await answer("q")
        with pytest.raises(ConnectionRefusedError):
            async with aclosing(tokens("q")) as stream:
                await stream.__anext__()
    finally:
        chaos.close()
    assert opened == []  # neither body ran: the fault replaced the dependency
    assert handle.injected == 2
    for stage in ("answer", "tokens"):  # counted by the breaker like a real failure
        assert g.breaker(stage).state is BreakerState.OPEN


async def test_a_latency_fault_delays_a_streams_first_item_and_the_stage_timeout_cuts_it() -> None:
    clock = FakeClock()
    g = _guard(clock, timeout_s=1.0)
    opened: list[str] = []
    answer, tokens = _pair(g, opened)
    chaos = Chaos(rng=random.Random(0), sleep=clock.sleep)
    slow = chaos.inject(Latency(0.5), stage=["answer", "tokens"])
    with chaos.install(g):
        assert await answer("q") == "answer:q"
        assert clock() == 0.5
        assert [w async for w in tokens("q")] == ["a", "b", "c"]
        assert clock() == 1.0  # the latency hit the opening once, not every item
        slow.remove()
        chaos.inject(Latency(3.0), stage=["answer", "tokens"])
        with pytest.raises(StageTimeout):
            await answer("q")
        with pytest.raises(StageTimeout):
            async with aclosing(tokens("q")) as stream:
                await stream.__anext__()
    assert opened == ["call", "stream"]


async def test_two_guards_in_one_process_run_different_faults() -> None:
    clock = FakeClock()
    broken, slow = _guard(clock), _guard(clock)
    seen: list[str] = []
    broken_answer, _ = _pair(broken, seen)
    slow_answer, slow_tokens = _pair(slow, seen)
    fails = Chaos(rng=random.Random(0))
    fails.inject(Error(kind="connection_reset"))
    lags = Chaos(rng=random.Random(0), sleep=clock.sleep)
    lags.inject(Latency(2.0))
    fails.install(broken)
    lags.install(slow)
    try:
        with pytest.raises(ConnectionResetError):
            await broken_answer("q")
        assert await slow_answer("q") == "answer:q" and clock() == 2.0
        assert [w async for w in slow_tokens("q")] == ["a", "b", "c"] and clock() == 4.0
        plain, _ = _pair(Guard(clock=clock), seen)
        assert await plain("q") == "answer:q" and clock() == 4.0  # a third Guard: no fault at all
    finally:
        fails.uninstall(broken)
        lags.close()
    assert broken.chaos is None and slow.chaos is None
    assert await broken_answer("q") == "answer:q"


# -- breakers, quotas, retries, fallbacks ---------------------------------------------------------


async def test_a_streams_failure_is_counted_once_however_many_items_it_had() -> None:
    g = _guard(FakeClock(), breaker=BreakerPolicy(kind="generic", minimum_calls=100, window_size=100))

    @g.guard("tokens")
    async def tokens(n: int) -> Any:
        for i in range(n):
            yield i
        raise ConnectionResetError("cut")

    with pytest.raises(ConnectionResetError):
        async with aclosing(tokens(5)) as stream:
            async for _ in stream:
                pass
    assert [i async for i in _ok(g)] == [0, 1, 2]
    metrics = g.breaker("tokens").metrics()
    assert (metrics.calls, metrics.failed_calls) == (2, 1)


def _ok(g: Guard) -> Any:
    @g.guard("tokens")
    async def fine() -> Any:
        for i in range(3):
            yield i

    return fine()


@pytest.mark.parametrize("end", ["exhausted", "closed-early", "cancelled"])
async def test_a_streams_quota_slot_is_held_until_it_ends(end: str) -> None:
    g = Guard(Policy(default_quota=TenantQuota(max_concurrency=1)), clock=FakeClock())
    opened: list[str] = []
    answer, tokens = _pair(g, opened)
    gate = anyio.Event()

    @g.guard("tokens")
    async def waiting() -> Any:
        yield "first"
        await gate.wait()
        yield "second"

    if end == "exhausted":
        async with aclosing(tokens("q")) as stream:
            assert await stream.__anext__() == "a"
            with pytest.raises(QuotaExceeded):
                await answer("q")  # the stream holds the only slot
            assert [w async for w in stream] == ["b", "c"]
    elif end == "closed-early":
        async with aclosing(tokens("q")) as stream:
            assert await stream.__anext__() == "a"
    else:
        with anyio.CancelScope() as scope:
            async with aclosing(waiting()) as stream:
                assert await stream.__anext__() == "first"
                assert g.quotas.in_flight("default") == 1
                scope.cancel()
                await stream.__anext__()
        assert scope.cancelled_caught
    assert g.quotas.in_flight("default") == 0
    assert await answer("q") == "answer:q"  # the slot is free again


async def test_retries_and_fallbacks_act_before_the_first_item_only() -> None:
    g = _guard(
        FakeClock(),
        breaker=BreakerPolicy(kind="none"),
        retry=RetryPolicy(attempts=3, jitter_s=0.0, initial_backoff_s=0.01),
    )
    opened = 0

    def fallback(fail_after: int) -> list[str]:
        return ["fallback"]

    @g.guard("tokens", fallback=fallback)
    async def tokens(fail_after: int) -> Any:
        nonlocal opened
        opened += 1
        for i in range(fail_after):
            yield i
        raise ConnectionResetError("peer went away")

    assert [i async for i in tokens(0)] == ["fallback"]  # retried twice, then the fallback
    assert opened == 3 and degraded() == ("fallback",)
    opened = 0
    got: list[int] = []
    with pytest.raises(ConnectionResetError):
        async with aclosing(tokens(2)) as stream:
            async for item in stream:
                got.append(item)
    assert got == [0, 1] and opened == 1  # past the commit point: neither retried nor served
