"""FakeClock is a discrete-event clock: concurrent sleepers wake in time order, each at its own due
time; timers fire in order with them; a timer alone never moves time; a test can step a manual clock
event by event. Every async test runs on asyncio and on trio (the core conftest)."""

from __future__ import annotations

import asyncio
import contextvars
import math
from typing import Any

import anyio
import pytest

from ragguard import FakeClock

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(20)]


def _asyncio_only(anyio_backend: str) -> None:
    if anyio_backend != "asyncio":
        pytest.skip("FakeClock's task timers cancel asyncio tasks (trio tasks have no cancel)")


async def test_concurrent_sleepers_wake_in_time_order_each_at_its_own_time() -> None:
    clock = FakeClock()
    woke: list[tuple[float, float]] = []

    async def nap(seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append((seconds, clock()))

    async with anyio.create_task_group() as tg:
        tg.start_soon(nap, 0.5)
        for _ in range(10):
            tg.start_soon(nap, 0.1)
    assert woke == [(0.1, 0.1)] * 10 + [(0.5, 0.5)]
    assert clock() == 0.5 and clock.sleepers == 0


async def test_a_chain_of_sleeps_interleaves_with_another_task_by_due_time() -> None:
    clock = FakeClock(10.0)
    log: list[tuple[str, float]] = []

    async def ticker(name: str, every: float, times: int) -> None:
        for _ in range(times):
            await clock.sleep(every)
            log.append((name, round(clock() - 10.0, 9)))

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker, "a", 0.3, 3)
        tg.start_soon(ticker, "b", 0.25, 4)
    assert log == [("b", 0.25), ("a", 0.3), ("b", 0.5), ("a", 0.6), ("b", 0.75), ("a", 0.9), ("b", 1.0)]


async def test_a_cancelled_sleeper_is_forgotten_and_does_not_pull_time() -> None:
    clock = FakeClock()
    async with anyio.create_task_group() as tg:
        tg.start_soon(clock.sleep, 1000.0)
        await clock.sleep(1.0)  # wakes first...
        assert clock.sleepers == 1 and clock.next_due == 1000.0
        tg.cancel_scope.cancel()  # ...and abandons the other sleeper
    assert clock.sleepers == 0 and clock.next_due is None
    await clock.sleep(1.0)
    assert clock() == 2.0


async def test_an_endless_sleep_never_moves_time_to_infinity() -> None:
    clock = FakeClock()
    with anyio.move_on_after(0.05):
        await clock.sleep(math.inf)
    assert clock() == 0.0


async def test_a_manual_clock_steps_event_by_event_or_all_at_once() -> None:
    for stepped in (True, False):
        clock = FakeClock(auto_advance=False)
        log: list[tuple[str, float]] = []

        async def ticker(
            name: str, every: float, times: int, clock: FakeClock = clock, log: Any = log
        ) -> None:
            for _ in range(times):
                await clock.sleep(every)
                log.append((name, round(clock(), 9)))

        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker, "a", 0.1, 2)
            tg.start_soon(ticker, "b", 0.15, 1)
            await clock.settle()
            assert clock.sleepers == 2 and clock() == 0.0  # nothing moves a manual clock by itself
            if stepped:
                await clock.run_for(0.3)
            else:
                clock.advance(0.3)  # everything due wakes at once, and reads the new time
                await clock.settle()
                clock.advance(0.3)
        if stepped:
            assert log == [("a", 0.1), ("b", 0.15), ("a", 0.2)] and clock() == pytest.approx(0.3)
        else:
            assert sorted(log) == [("a", 0.3), ("a", 0.6), ("b", 0.3)]
    with pytest.raises(ValueError, match="seconds must be >= 0"):
        await FakeClock().run_for(-1.0)
    with pytest.raises(ValueError, match="seconds must be >= 0"):
        FakeClock().advance(-1.0)


async def test_a_callback_timer_runs_at_its_time_in_the_context_it_was_set_in() -> None:
    clock = FakeClock()
    who: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")
    seen: list[tuple[str, float]] = []
    token = who.set("caller")
    clock.call_later(0.25, lambda label: seen.append((f"{label}:{who.get()}", clock())), "late")
    early = clock.call_later(0.1, lambda: seen.append(("cancelled", clock())))
    who.reset(token)
    early.cancel()
    assert clock.next_due == 0.25
    await clock.sleep(1.0)  # a sleeper pulls time; the timer on the way fires at its own time
    assert seen == [("late:caller", 0.25)] and clock() == 1.0


async def test_a_timer_alone_never_moves_time(anyio_backend: str) -> None:
    """An attempt timer around a call that waits on something else (real I/O, an event) does not
    fire early: only sleepers pull time; the timer fires once time passes it."""
    _asyncio_only(anyio_backend)
    clock = FakeClock()
    task = asyncio.current_task()
    handle = clock.arm(task, 0.5)
    await asyncio.sleep(0.05)  # real time passes; the fake clock does not
    assert clock() == 0.0 and not clock.disarm(handle)
    handle = clock.arm(task, 0.5)
    with pytest.raises(asyncio.CancelledError):
        await clock.sleep(60.0)  # a sleeper: time moves to the timer first, which cancels it
    assert task is not None and task.uncancel() == 0
    assert clock.disarm(handle) and clock() == 0.5 and clock.sleepers == 0


async def test_two_clocks_on_one_loop_both_move() -> None:
    a, b = FakeClock(), FakeClock(100.0)
    done: list[str] = []

    async def run(clock: FakeClock, name: str) -> None:
        for _ in range(5):
            await clock.sleep(1.0)
        done.append(name)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run, a, "a")
            tg.start_soon(run, b, "b")
    assert sorted(done) == ["a", "b"] and (a(), b()) == (5.0, 105.0)


async def test_a_sleep_of_zero_or_nan_only_checkpoints() -> None:
    clock = FakeClock()
    await clock.sleep(0.0)
    await clock.sleep(-1.0)
    await clock.sleep(math.nan)
    assert clock() == 0.0 and clock.sleepers == 0
