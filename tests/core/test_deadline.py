"""Deadlines: nesting, propagation, validation, and how guarded calls honour them."""

from __future__ import annotations

import itertools
import math
import time

import anyio
import pytest

import ragguard
from ragguard import (
    BreakerPolicy,
    BreakerState,
    ConfigError,
    DeadlineExceeded,
    Guard,
    Policy,
    RetryPolicy,
    StagePolicy,
    deadline,
    remaining,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(20)]


def _guard(**stage: object) -> Guard:
    """A registry with one stage ``s`` whose generic breaker opens on its first counted failure."""
    breaker = BreakerPolicy(
        kind="generic",
        minimum_calls=1,
        consecutive_failures_threshold=1,
        failure_rate_threshold=100,
        open_for_s=600,
    )
    return Guard(Policy(stages={"s": StagePolicy(breaker=breaker, **stage)}))  # type: ignore[arg-type]


# -- the context manager ----------------------------------------------------------------------


def test_no_deadline_means_none() -> None:
    assert remaining() is None
    with deadline(None) as d:
        assert remaining() is None
        assert d.remaining() is None


def test_nesting_only_shortens(deadline_clock: ragguard.FakeClock) -> None:
    with deadline(10.0):
        assert remaining() == pytest.approx(10.0)
        with deadline(20.0) as longer:
            assert remaining() == pytest.approx(10.0)  # cannot extend the outer budget
            assert longer.remaining() == pytest.approx(10.0)
        with deadline(4.0):
            assert remaining() == pytest.approx(4.0)
            deadline_clock.advance(1.0)
            with deadline(5.0):
                assert remaining() == pytest.approx(3.0)
        assert remaining() == pytest.approx(9.0)  # the outer deadline is back after the inner
    assert remaining() is None


@pytest.mark.parametrize("keep", [None, math.inf])
def test_none_and_infinity_keep_the_outer_deadline(
    deadline_clock: ragguard.FakeClock, keep: float | None
) -> None:
    with deadline(2.0):
        with deadline(keep):
            assert remaining() == pytest.approx(2.0)
        deadline_clock.advance(0.5)
        with deadline(keep):
            assert remaining() == pytest.approx(1.5)


async def test_async_form_and_sync_form_agree(deadline_clock: ragguard.FakeClock) -> None:
    async with deadline(3.0) as d:
        with deadline(1.0):
            assert remaining() == pytest.approx(1.0)
        assert d.remaining() == pytest.approx(3.0)
    assert remaining() is None


@pytest.mark.parametrize("bad", [-0.001, -5, math.nan, "soon", "1.5", True, object(), [1.0]])
def test_bad_values_raise_config_error(bad: object) -> None:
    with pytest.raises(ConfigError) as info:
        deadline(bad)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    assert "deadline" in str(info.value)


@pytest.mark.parametrize("huge", [10**400, -(10**400), 10**5000], ids=["10**400", "-10**400", "10**5000"])
def test_an_int_past_any_float_is_a_config_error_not_an_overflow(huge: int) -> None:
    # issue 13 item 9: deadline(10**400) raised a bare OverflowError from float()
    with pytest.raises(ConfigError) as info:
        deadline(huge)
    assert "deadline" in str(info.value) and len(str(info.value)) < 120


def test_a_deadline_object_is_not_reentrant() -> None:
    d = deadline(1.0)
    with d, pytest.raises(RuntimeError), d:
        pass
    assert remaining() is None


def test_remaining_is_monotone_and_never_negative(deadline_clock: ragguard.FakeClock) -> None:
    seen = []
    with deadline(1.0):
        for _ in range(30):
            seen.append(remaining())
            deadline_clock.advance(0.05)
    assert all(a is not None for a in seen)
    assert all(b <= a for a, b in itertools.pairwise(seen))  # type: ignore[operator]
    assert seen[0] == pytest.approx(1.0)
    assert seen[-1] == 0.0  # spent: clamped at zero, never negative


async def test_remaining_is_monotone_on_the_real_clock() -> None:
    seen = []
    async with deadline(5.0):
        for _ in range(200):
            seen.append(remaining())
            await anyio.sleep(0)
    assert all(b <= a for a, b in itertools.pairwise(seen))  # type: ignore[operator]
    assert 0.0 < seen[-1] <= 5.0  # type: ignore[operator]


async def test_carried_into_child_tasks(deadline_clock: ragguard.FakeClock) -> None:
    seen: dict[str, float | None] = {}

    async def child(name: str, shorten: float | None) -> None:
        if shorten is None:
            seen[name] = remaining()
            return
        with deadline(shorten):
            seen[name] = remaining()

    async with deadline(2.0):
        async with anyio.create_task_group() as tg:
            tg.start_soon(child, "plain", None)
            tg.start_soon(child, "shorter", 0.5)
            tg.start_soon(child, "longer", 9.0)
        assert remaining() == pytest.approx(2.0)  # a child's deadline never leaks into the parent
    async with anyio.create_task_group() as tg:
        tg.start_soon(child, "outside", None)
    assert seen["plain"] == pytest.approx(2.0)
    assert seen["shorter"] == pytest.approx(0.5)
    assert seen["longer"] == pytest.approx(2.0)
    assert seen["outside"] is None


# -- guarded calls --------------------------------------------------------------------------


async def test_less_than_min_attempt_left_raises_without_calling(deadline_clock: ragguard.FakeClock) -> None:
    g = _guard(min_attempt_s=0.2)
    calls = []

    @g.guard("s")
    async def work() -> str:
        calls.append(remaining())
        return "ok"

    async with deadline(1.0):
        assert await work() == "ok"
        deadline_clock.advance(0.85)  # 0.15 s left < min_attempt_s
        with pytest.raises(DeadlineExceeded) as info:
            await work()
    assert info.value.stage == "s"
    assert len(calls) == 1
    assert g.breaker("s").metrics().calls == 1  # the refused call reached no breaker


async def test_spent_deadline_raises_even_with_no_minimum(deadline_clock: ragguard.FakeClock) -> None:
    g = _guard()
    calls = []

    @g.guard("s")
    async def work() -> None:
        calls.append(1)

    async with deadline(0.0):
        with pytest.raises(DeadlineExceeded):
            await work()
    async with deadline(1.0):
        deadline_clock.advance(1.0)
        with pytest.raises(DeadlineExceeded):
            await work()
    assert calls == []
    assert g.breaker("s").state is BreakerState.CLOSED


async def test_deadline_cut_raises_deadline_exceeded_and_is_not_counted() -> None:
    g = _guard(timeout_s=5.0, retry=RetryPolicy(attempts=3, retry_on=("timeout", "connection")))
    calls = []

    @g.guard("s")
    async def slow() -> None:
        calls.append(1)
        await anyio.sleep(30)

    started = time.monotonic()
    async with deadline(0.1):
        with pytest.raises(DeadlineExceeded) as info:
            await slow()
    elapsed = time.monotonic() - started
    assert 0.08 <= elapsed < 1.0  # cut at the deadline, not at the 5 s stage timeout
    assert info.value.budget_s is not None and info.value.budget_s <= 0.1
    assert isinstance(info.value.__cause__, TimeoutError)
    assert calls == [1]  # DeadlineExceeded is never retried
    breaker = g.breaker("s")
    assert breaker.state is BreakerState.CLOSED
    assert breaker.metrics().calls == 0  # the caller's short budget says nothing of the dependency


async def test_stage_timeout_cut_raises_timeout_error_and_is_counted() -> None:
    g = _guard(timeout_s=0.05)

    @g.guard("s")
    async def slow() -> None:
        await anyio.sleep(30)

    started = time.monotonic()
    async with deadline(5.0):  # the stage timeout is the shorter one
        with pytest.raises(TimeoutError) as info:
            await slow()
    assert not isinstance(info.value, DeadlineExceeded)
    assert time.monotonic() - started < 1.0
    breaker = g.breaker("s")
    assert breaker.state is BreakerState.OPEN  # one counted failure opens this breaker
    assert breaker.metrics().failed_calls == 1


async def test_stage_timeout_without_any_deadline() -> None:
    g = _guard(timeout_s=0.05)
    done = []

    @g.guard("s")
    async def work(delay: float) -> str:
        await anyio.sleep(delay)
        done.append(delay)
        return "ok"

    assert await work(0.0) == "ok"
    with pytest.raises(TimeoutError):
        await work(10.0)
    assert done == [0.0]


async def test_an_outer_cancellation_is_not_turned_into_a_timeout() -> None:
    g = _guard(timeout_s=5.0)

    @g.guard("s")
    async def slow() -> None:
        await anyio.sleep(30)

    with anyio.move_on_after(0.05) as scope:
        await slow()
    assert scope.cancelled_caught
    breaker = g.breaker("s")
    assert breaker.state is BreakerState.CLOSED and breaker.metrics().calls == 0
    # the timer of the cancelled attempt must not fire into later work of this task
    await anyio.sleep(0.01)
