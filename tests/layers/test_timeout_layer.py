"""The timeout layer on the FakeClock's timers: advance the clock, the task is cancelled, exit
turns the cancellation into StageTimeout or DeadlineExceeded."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from layer_helpers import make_call

from ragguard import DeadlineExceeded, FakeClock, Guard, Policy, StagePolicy, StageTimeout, deadline
from ragguard._timeouts import MAX_TIMEOUT_S, AttemptTimeout
from ragguard.layers import Bound
from ragguard.layers._timeout import TimeoutLayer, build
from ragguard.pipeline import NO_EXIT, Call

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]


async def gated(layer: TimeoutLayer, call: Call, body: Callable[[], Awaitable[Any]]) -> Any:
    """What the driver does with one gate: enter, the body, exit with the outcome."""
    token = layer.enter(call)
    try:
        result = await body()
    except BaseException as exc:
        replaced = layer.exit(call, token, exc)
        if replaced is not None:
            raise replaced  # noqa: B904 - as the driver does: the gate set the cause
        raise
    replaced = layer.exit(call, token, None)
    if replaced is not None:
        raise replaced
    return result


async def hang() -> None:
    await asyncio.Event().wait()


async def _started(coro: Awaitable[Any]) -> asyncio.Task[Any]:
    task = asyncio.ensure_future(coro)
    await asyncio.sleep(0)  # the task enters the gate and arms its timer
    return task


async def test_the_stage_timeout_fires_when_the_clock_passes_it() -> None:
    clock = FakeClock()
    layer = TimeoutLayer("s", 1.0, 0.0, clock)
    call = make_call()
    task = await _started(gated(layer, call, hang))
    clock.advance(0.999)
    await asyncio.sleep(0)
    assert not task.done() and call.budget_s == 1.0 and not call.by_deadline
    clock.advance(0.001)
    with pytest.raises(StageTimeout) as timed_out:
        await task
    assert timed_out.value.stage == "s" and timed_out.value.timeout_s == 1.0
    assert isinstance(timed_out.value, TimeoutError)
    assert task.cancelling() == 0  # the timer's cancellation was taken back


async def test_a_shorter_deadline_bounds_the_attempt_and_ends_as_deadline_exceeded() -> None:
    clock = FakeClock()
    layer = TimeoutLayer("s", 5.0, 0.0, clock)
    call = make_call()
    with deadline(2.0, clock=clock):
        task = await _started(gated(layer, call, hang))
    assert call.budget_s == 2.0 and call.by_deadline
    clock.advance(2.0)
    with pytest.raises(DeadlineExceeded) as spent:
        await task
    assert spent.value.budget_s == 2.0
    assert isinstance(spent.value.__cause__, AttemptTimeout)


async def test_an_attempt_that_finishes_in_time_disarms_its_timer() -> None:
    clock = FakeClock()
    layer = TimeoutLayer("s", 1.0, 0.0, clock)

    async def quick() -> str:
        await asyncio.sleep(0)
        return "ok"

    assert await gated(layer, make_call(), quick) == "ok"
    survivor = await _started(hang())
    clock.advance(10)  # a disarmed timer cancels nothing
    await asyncio.sleep(0)
    assert not survivor.done()
    survivor.cancel()


async def test_a_timer_that_fires_alongside_an_outside_cancel_leaves_the_cancel() -> None:
    clock = FakeClock()
    layer = TimeoutLayer("s", 1.0, 0.0, clock)
    task = await _started(gated(layer, make_call(), hang))
    task.cancel()  # the caller gives up ...
    clock.advance(1.0)  # ... and the timer fires in the same loop iteration
    with pytest.raises(asyncio.CancelledError):
        await task  # the caller's cancellation, not a StageTimeout
    assert task.cancelling() == 1  # only the timer's request was taken back


async def test_a_call_that_swallows_the_timers_cancel_keeps_its_result() -> None:
    clock = FakeClock()
    layer = TimeoutLayer("s", 1.0, 0.0, clock)

    async def stubborn() -> str:
        try:
            await hang()
        except asyncio.CancelledError:
            return "finished anyway"
        raise AssertionError("unreachable")

    task = await _started(gated(layer, make_call(), stubborn))
    clock.advance(1.0)
    assert await task == "finished anyway"
    assert task.cancelling() == 0


async def test_no_timer_without_a_timeout_or_with_one_too_long_to_fire() -> None:
    clock = FakeClock()
    assert TimeoutLayer("s", None, 0.0, clock).enter(make_call()) is NO_EXIT
    assert TimeoutLayer("s", MAX_TIMEOUT_S, 0.0, clock).enter(make_call()) is NO_EXIT
    with deadline(5 * 365 * 86400.0, clock=clock):  # five years: a deadline, never a timer
        call = make_call()
        assert TimeoutLayer("s", None, 0.0, clock).enter(call) is NO_EXIT
    assert clock._armed == {}


async def test_no_attempt_starts_with_less_than_min_attempt_s_left() -> None:
    clock = FakeClock()
    layer = TimeoutLayer("s", 1.0, 0.5, clock)
    call = make_call()
    with deadline(0.4, clock=clock):
        with pytest.raises(DeadlineExceeded, match="no budget left"):
            layer.enter(call)
        call.items = 3  # a stream's next item
        with pytest.raises(DeadlineExceeded, match="stream cut after 3 items"):
            layer.enter(call)
    assert clock._armed == {}


async def test_on_the_event_loops_timer_wheel() -> None:
    layer = TimeoutLayer("s", 0.02, 0.0, None)  # a real clock: the loop's wheel
    with pytest.raises(StageTimeout):
        await gated(layer, make_call(), hang)
    assert await gated(layer, make_call(), lambda: asyncio.sleep(0, "ok")) == "ok"


async def test_on_the_wheel_with_a_deadline_on_the_wheels_clock() -> None:
    """The deadline's clock is the wheel's (time.monotonic): timers armed microseconds apart share
    a bucket (the layer's inlined path); each is disarmed when its call is done, and a call that
    overruns is cut by the deadline or by its own timeout, whichever is sooner."""
    from ragguard._timeouts import wheel_for

    layer = TimeoutLayer("s", 0.03, 0.0, None)
    wheel = wheel_for(asyncio.get_running_loop())
    with deadline(5.0, clock=wheel.now):
        calls = [make_call() for _ in range(50)]
        for call in calls:
            assert await gated(layer, call, lambda: asyncio.sleep(0, "ok")) == "ok"
        assert not any(wheel.buckets.values())  # every timer disarmed
        assert calls[0].budget_s == 0.03 and not calls[0].by_deadline
        with pytest.raises(StageTimeout):
            await gated(layer, make_call(), hang)
    with deadline(0.02, clock=wheel.now):
        with pytest.raises(DeadlineExceeded):
            await gated(layer, make_call(), hang)
    assert not any(wheel.buckets.values()) and not wheel.expired


def test_every_stage_has_a_timeout_layer_on_its_guards_clock() -> None:
    clock = FakeClock()
    g = Guard(Policy(stages={"s": StagePolicy(timeout_s=2.5, min_attempt_s=0.1)}), clock=clock)
    layer = build(g.stage("s"), Bound("s", make_call().fn, stream=False))
    assert isinstance(layer, TimeoutLayer)
    assert (layer.timeout_s, layer._min_left, layer._timers) == (2.5, 0.1, clock)
    plain = build(Guard().stage("t"), Bound("t", make_call().fn, stream=False))
    assert plain is not None and plain._timers is None and plain.timeout_s is None
