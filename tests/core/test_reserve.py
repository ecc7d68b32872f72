"""Time kept for the fallback (``StagePolicy.reserve``): under a deadline, a stage with a fallback
cuts its primary early enough that the fallback still answers in time. Everything runs on a
FakeClock: the times asserted are the Guard's clock, nothing sleeps."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

import ragguard
from ragguard import (
    ConfigError,
    DeadlineExceeded,
    FakeClock,
    Guard,
    Policy,
    ReservePolicy,
    RetryPolicy,
    StagePolicy,
)
from ragguard.layers._reserve import Reserve
from ragguard.testing import fresh_guard

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # FakeClock's attempt timers cancel asyncio tasks


def _guard(**stage: Any) -> tuple[Guard, FakeClock]:
    clock = FakeClock()
    return fresh_guard(Policy(stages={"lookup": StagePolicy(**stage)}), clock=clock), clock


def _hung_lookup(guard: Guard, clock: FakeClock, fallback_s: float = 0.0, fallback: Any = None) -> Any:
    """Stage ``lookup``: a dependency that hangs, and a fallback taking ``fallback_s`` seconds."""

    async def from_cache(query: str) -> str:
        if fallback_s:
            await clock.sleep(fallback_s)
        return f"cached {query}"

    @guard.guard("lookup", fallback=fallback or from_cache)
    async def lookup(query: str) -> str:
        await clock.sleep(60)
        return f"fresh {query}"

    return lookup


async def _answered_at(guard: Guard, clock: FakeClock, lookup: Any, budget_s: float) -> tuple[str, float]:
    started = clock()
    async with guard.deadline(budget_s):
        answer = await lookup("q")
    return answer, clock() - started


def _reserve(guard: Guard) -> Reserve:
    reserve = guard.stage("lookup").parts()["reserve"]
    assert isinstance(reserve, Reserve)
    return reserve


# -- the promise: the fallback answers before the deadline ------------------------------------------


async def test_a_hung_stage_answers_from_its_cheap_fallback_before_the_deadline() -> None:
    guard, clock = _guard()
    lookup = _hung_lookup(guard, clock)
    answer, took = await _answered_at(guard, clock, lookup, 0.5)
    assert answer == "cached q" and ragguard.degraded() == ("from_cache",)
    # the primary was cut at the deadline less the floor of the learnt reserve (0.05 s)
    assert took == pytest.approx(0.45)
    assert took < 0.5


async def test_without_a_deadline_nothing_is_kept_and_the_primary_runs_its_course() -> None:
    guard, clock = _guard(timeout_s=2.0)
    lookup = _hung_lookup(guard, clock)
    started = clock()
    assert await lookup("q") == "cached q"
    assert clock() - started == pytest.approx(2.0)  # the stage's own timeout, not a reserve


async def test_a_stage_without_a_fallback_keeps_no_reserve() -> None:
    guard, clock = _guard()

    @guard.guard("lookup")
    async def lookup(query: str) -> str:
        await clock.sleep(60)
        return query

    started = clock()
    with pytest.raises(DeadlineExceeded):
        async with guard.deadline(0.5):
            await lookup("q")
    assert clock() - started == pytest.approx(0.5)
    assert "reserve" not in guard.stage("lookup").parts()


async def test_turned_off_the_fallback_answers_at_the_deadline_as_before() -> None:
    guard, clock = _guard(reserve=0)
    lookup = _hung_lookup(guard, clock)
    answer, took = await _answered_at(guard, clock, lookup, 0.5)
    assert answer == "cached q" and took == pytest.approx(0.5)


async def test_a_fixed_reserve_is_kept_as_given_and_learns_nothing() -> None:
    guard, clock = _guard(reserve=0.1)
    lookup = _hung_lookup(guard, clock, fallback_s=0.3)
    _, took = await _answered_at(guard, clock, lookup, 1.0)
    assert took == pytest.approx(0.9 + 0.3)  # cut at 0.9; the slow fallback is not learnt from
    _, took = await _answered_at(guard, clock, lookup, 1.0)
    assert took == pytest.approx(1.2)
    assert _reserve(guard).latencies == ()


# -- learnt from the fallback's latency, bounded ----------------------------------------------------


async def test_the_reserve_is_learnt_from_the_fallbacks_latency() -> None:
    guard, clock = _guard()
    lookup = _hung_lookup(guard, clock, fallback_s=0.08)
    _, took = await _answered_at(guard, clock, lookup, 2.0)
    assert took == pytest.approx(1.95 + 0.08)  # the floor (0.05) was too little for this fallback
    assert _reserve(guard).latencies == pytest.approx((0.08,))
    assert _reserve(guard).learnt_s == pytest.approx(0.08 * 1.5)  # P99 of what it took, with the margin
    _, took = await _answered_at(guard, clock, lookup, 2.0)
    assert took == pytest.approx(2.0 - 0.12 + 0.08)  # now it answers in time
    assert took < 2.0


async def test_a_cheap_fallback_keeps_the_floor() -> None:
    guard, clock = _guard(reserve={"min_s": 0.03})
    lookup = _hung_lookup(guard, clock)
    for _ in range(3):
        _, took = await _answered_at(guard, clock, lookup, 1.0)
        assert took == pytest.approx(0.97)
    assert _reserve(guard).latencies == (0.0, 0.0, 0.0)
    assert _reserve(guard).learnt_s == pytest.approx(0.03)


async def test_a_slow_fallback_is_kept_at_most_the_ceiling() -> None:
    guard, clock = _guard(reserve={"max_s": 0.5, "max_share": 0.9})
    lookup = _hung_lookup(guard, clock, fallback_s=3.0)
    await _answered_at(guard, clock, lookup, 10.0)
    assert _reserve(guard).learnt_s == pytest.approx(0.5)  # 3.0 x 1.5 learnt, the ceiling kept
    _, took = await _answered_at(guard, clock, lookup, 10.0)
    assert took == pytest.approx(9.5 + 3.0)


async def test_the_reserve_never_takes_more_than_its_share_of_the_time_left() -> None:
    guard, clock = _guard(reserve={"fixed_s": 5.0, "max_share": 0.25})
    lookup = _hung_lookup(guard, clock)
    _, took = await _answered_at(guard, clock, lookup, 0.4)
    assert took == pytest.approx(0.3)  # 0.25 of 0.4 kept, not 5 s: the primary had 0.3 s
    guard2, clock2 = _guard(reserve={"min_s": 0.2})  # the floor too: default max_share 0.25
    lookup2 = _hung_lookup(guard2, clock2)
    _, took = await _answered_at(guard2, clock2, lookup2, 0.4)
    assert took == pytest.approx(0.3)


async def test_the_learnt_value_is_the_percentile_of_the_recent_window() -> None:
    reserve = Reserve(ReservePolicy(min_s=0.0, percentile=99, margin=1.0, window=100))
    for _ in range(99):
        reserve.observe(0.01)
    reserve.observe(0.5)  # one slow answer in a hundred: P99 (nearest rank) is still 0.01
    assert reserve.learnt_s == pytest.approx(0.01)
    reserve.observe(0.5)  # two in the last hundred: P99 is the slow one
    assert reserve.learnt_s == pytest.approx(0.5)
    for _ in range(100):  # the slow ones leave the window
        reserve.observe(0.02)
    assert reserve.learnt_s == pytest.approx(0.02)
    every = Reserve(ReservePolicy(min_s=0.0, percentile=100, margin=2.0, window=5))
    for latency in (0.1, 0.3, 0.2):
        every.observe(latency)
    assert every.learnt_s == pytest.approx(0.6)
    every.observe(float("nan"))
    every.observe(-1.0)
    every.observe(float("inf"))
    assert every.latencies == (0.1, 0.3, 0.2)  # what no clock can measure is not learnt


async def test_the_chain_is_timed_as_it_runs_misses_included() -> None:
    guard, clock = _guard(reserve={"min_s": 0.0})

    async def cache(query: str) -> str:
        await clock.sleep(0.04)
        raise ragguard.layers._fallback.FallbackMiss("not cached")

    async def keyword(query: str) -> str:
        await clock.sleep(0.02)
        return "keyword hit"

    @guard.guard("lookup", fallback=[cache, keyword])
    async def lookup(query: str) -> str:
        raise ConnectionRefusedError("down")

    async with guard.deadline(5.0):
        assert await lookup("q") == "keyword hit"
    assert _reserve(guard).latencies == pytest.approx((0.06,))  # the miss, then the answer


# -- retries leave the reserve ---------------------------------------------------------------------


async def test_retries_and_their_backoff_leave_the_reserve() -> None:
    retry = RetryPolicy(
        attempts=20, initial_backoff_s=0.1, multiplier=1.0, jitter_s=0.0, budget_min_per_s=100
    )
    guard, clock = _guard(retry=retry, reserve={"fixed_s": 0.25, "max_share": 0.5}, idempotent=True)
    attempts: list[float] = []

    async def fallback(query: str) -> str:
        return "fallback"

    @guard.guard("lookup", fallback=fallback)
    async def lookup(query: str) -> str:
        attempts.append(clock())
        await clock.sleep(0.1)
        raise ConnectionResetError("reset")

    started = clock()
    async with guard.deadline(1.0):
        assert await lookup("q") == "fallback"
    took = clock() - started
    # attempts of 0.1 s, 0.1 s of backoff between them, the last backoff cut to the deadline less
    # the reserve (0.75): without the reserve they would go on to 1.0, the fallback after it
    assert [a - started for a in attempts] == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.749])
    assert took == pytest.approx(0.75)


# -- streams: kept until the first item -------------------------------------------------------------


async def test_a_stream_that_never_starts_is_served_by_its_fallback_in_time() -> None:
    guard, clock = _guard()

    async def canned(query: str) -> AsyncIterator[str]:
        await clock.sleep(0.01)
        yield "canned"

    @guard.guard("lookup", fallback=canned)
    async def tokens(query: str) -> AsyncIterator[str]:
        await clock.sleep(60)
        yield "never"

    started = clock()
    async with guard.deadline(0.5):
        got = [item async for item in tokens("q")]
    assert got == ["canned"]
    assert clock() - started == pytest.approx(0.46)
    assert _reserve(guard).latencies == pytest.approx((0.01,))  # to the fallback stream's first item


async def test_after_the_first_item_a_stream_has_the_whole_deadline() -> None:
    guard, clock = _guard()

    async def canned(query: str) -> AsyncIterator[str]:
        yield "canned"

    @guard.guard("lookup", fallback=canned)
    async def tokens(query: str) -> AsyncIterator[str]:
        yield "first"
        await clock.sleep(60)
        yield "never"

    started = clock()
    got: list[str] = []
    with pytest.raises(DeadlineExceeded) as info:
        async with guard.deadline(0.5):
            async for item in tokens("q"):
                got.append(item)
    assert got == ["first"] and info.value.items == 1
    assert clock() - started == pytest.approx(0.5)  # past the commit point nothing is kept back


# -- the option ------------------------------------------------------------------------------------


def test_the_reserve_options_are_validated_naming_the_field() -> None:
    for given, field in [
        ({"max_share": 0}, "max_share"),
        ({"max_share": 0.95}, "max_share"),
        ({"min_s": -0.1}, "min_s"),
        ({"percentile": 40}, "percentile"),
        ({"margin": 0.5}, "margin"),
        ({"window": 0}, "window"),
        ({"fixed_s": 4000}, "fixed_s"),
        ({"bogus": 1}, "bogus"),
        (-1, "fixed_s"),
    ]:
        with pytest.raises(ConfigError) as info:
            Policy.parse({"stages": {"lookup": {"reserve": given}}})
        assert info.value.field == f"stages.lookup.reserve.{field}", given
    with pytest.raises(ConfigError, match="max_s"):
        ReservePolicy(min_s=0.5, max_s=0.1)
    with pytest.raises(ConfigError):
        StagePolicy(reserve=True)


def test_the_reserve_defaults_and_shorthands() -> None:
    default = StagePolicy().reserve
    assert (default.fixed_s, default.min_s, default.max_s, default.max_share) == (None, 0.05, 2.0, 0.25)
    assert (default.percentile, default.margin, default.window) == (99.0, 1.5, 100)
    assert StagePolicy(reserve=0).reserve.off
    assert StagePolicy(reserve=0.2).reserve.fixed_s == 0.2
    env = Policy.from_env(environ={"RAGGUARD_STAGES__RERANK__RESERVE": "0"})
    assert env.stage("rerank").reserve.off
    merged = Policy(stages={"rerank": StagePolicy(reserve={"max_s": 0.5})}).stage("rerank")
    assert merged.reserve.max_s == 0.5 and merged.reserve.min_s == 0.05 and merged.preset == "rerank"


async def test_a_function_with_only_routes_keeps_no_reserve() -> None:
    guard, clock = _guard()

    def shorter(query: str) -> str:
        return "shorter"

    @guard.guard("lookup", on_context_length=shorter)
    async def lookup(query: str) -> str:
        await clock.sleep(60)
        return query

    with pytest.raises(DeadlineExceeded):
        async with guard.deadline(0.5):
            await lookup("q")
    assert clock() == pytest.approx(0.5)  # a route answers a refusal, never a deadline


def test_on_trio_the_fallback_answers_before_the_deadline_too() -> None:
    import time

    import trio

    async def main() -> tuple[str, float]:
        guard = Guard()  # the real clock: the attempt is bounded by a trio cancel scope

        async def from_cache(query: str) -> str:
            return "cached"

        @guard.guard("lookup", fallback=from_cache)
        async def lookup(query: str) -> str:
            await trio.sleep(10)
            return "fresh"

        started = time.monotonic()
        async with guard.deadline(0.3):
            answer = await lookup("q")
        return answer, time.monotonic() - started

    answer, took = trio.run(main)
    assert answer == "cached" and 0.2 <= took < 0.3  # cut at 0.25 (the 0.05 s floor)


async def test_a_sync_function_is_cut_early_enough_for_its_fallback_too() -> None:
    import time

    guard = Guard()  # the real clock: the worker thread really sleeps

    def from_cache(query: str) -> str:
        return "cached"

    @guard.guard("lookup", fallback=from_cache)
    def lookup(query: str) -> str:
        time.sleep(0.6)  # a blocking client that hangs
        return "fresh"

    started = time.monotonic()
    async with guard.deadline(0.4):
        answer = await lookup("q")
    took = time.monotonic() - started
    assert answer == "cached" and 0.3 <= took < 0.4  # cut at 0.35 (the 0.05 s floor)
