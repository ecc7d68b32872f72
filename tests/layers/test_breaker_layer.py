"""The breaker layer: a permit before each attempt, the outcome after, permits given back for
what is not the dependency's fault."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from layer_helpers import make_call

from ragguard import (
    BreakerOpen,
    BreakerPolicy,
    BreakerState,
    CircuitBreaker,
    DeadlineExceeded,
    FakeClock,
    Guard,
    Policy,
    StagePolicy,
)
from ragguard.layers import Bound
from ragguard.layers._breaker import BreakerLayer, build
from ragguard.options._breaker import BREAKER_KINDS
from ragguard.pipeline import WAIT

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]


def _half_open(clock: FakeClock, permits: int = 1) -> CircuitBreaker:
    breaker = CircuitBreaker(
        "b",
        minimum_calls=1,
        window_size=1,
        failure_rate_threshold=100,
        open_for_s=10,
        half_open_permits=permits,
        clock=clock,
    )
    breaker.on_result(breaker.acquire(), 0.0, ConnectionRefusedError(), clock())
    assert breaker.state is BreakerState.OPEN
    clock.advance(10)
    return breaker


async def test_a_success_is_recorded_with_its_duration_on_the_clock() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(
        "b",
        minimum_calls=1,
        window_size=4,
        slow_call_duration_s=1.0,
        slow_call_rate_threshold=100,
        clock=clock,
    )
    layer = BreakerLayer(breaker, clock)
    call = make_call()
    token = layer.enter(call)
    assert call.started == 0.0
    clock.advance(2.0)
    assert layer.exit(call, token, None) is None
    metrics = breaker.metrics()
    assert (metrics.calls, metrics.failed_calls, metrics.slow_calls) == (1, 0, 1)  # 2 s > slow 1 s


async def test_a_counted_failure_trips_the_breaker_and_then_enter_rejects() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker("b", minimum_calls=1, window_size=1, failure_rate_threshold=100, clock=clock)
    layer = BreakerLayer(breaker, clock)
    call = make_call()
    layer.exit(call, layer.enter(call), ConnectionRefusedError("down"))
    assert breaker.state is BreakerState.OPEN
    with pytest.raises(BreakerOpen) as rejected:
        layer.enter(call)
    assert rejected.value.breaker == "b"


@pytest.mark.parametrize(
    "outcome",
    [asyncio.CancelledError(), GeneratorExit(), DeadlineExceeded("s", 1.0)],
    ids=["cancelled", "closed-early", "deadline"],
)
async def test_cancellation_and_the_callers_deadline_give_the_trial_permit_back(
    outcome: BaseException,
) -> None:
    clock = FakeClock()
    breaker = _half_open(clock, permits=1)
    layer = BreakerLayer(breaker, clock)
    call = make_call()
    token = layer.enter(call)
    assert breaker.state is BreakerState.HALF_OPEN
    with pytest.raises(BreakerOpen):
        layer.enter(call)  # the only permit is taken
    assert layer.exit(call, token, outcome) is None
    again = layer.enter(call)  # given back, not spent on a verdict
    layer.exit(call, again, None)
    assert breaker.state is BreakerState.CLOSED


async def test_an_error_an_outer_layer_recovers_gives_the_permit_back() -> None:
    clock = FakeClock()
    breaker = _half_open(clock, permits=1)
    layer = BreakerLayer(breaker, clock)
    call = make_call()
    call.recoverable = lambda exc: isinstance(exc, MemoryError)
    layer.exit(call, layer.enter(call), MemoryError("batch too big"))
    assert breaker.state is BreakerState.HALF_OPEN  # no verdict
    call.recoverable = None
    layer.exit(call, layer.enter(call), MemoryError("at the floor"))  # now it counts
    assert breaker.state is BreakerState.OPEN


class RoundTripBreaker:
    """A breaker whose half-open permits live elsewhere: ``acquire`` refuses in half-open,
    ``acquire_async`` grants after a round trip that takes 0.3 s of the clock."""

    name = "remote"

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.state = "half_open"
        self.results: list[tuple[Any, float, BaseException | None]] = []
        self.released: list[Any] = []

    @property
    def classifier(self) -> Any:
        return lambda exc: True

    def acquire(self) -> Any:
        raise BreakerOpen(self.name, 0.0, state="half_open")

    async def acquire_async(self) -> Any:
        self.clock.advance(0.3)
        return "trial"

    def on_result(
        self, token: Any, duration_s: float, exc: BaseException | None, now: float | None = None
    ) -> None:
        self.results.append((token, duration_s, exc))

    def release(self, token: Any) -> None:
        self.released.append(token)


async def test_a_remote_half_open_breaker_is_asked_for_a_trial_and_the_round_trip_is_not_charged() -> None:
    clock = FakeClock()
    breaker = RoundTripBreaker(clock)
    layer = BreakerLayer(breaker, clock)
    call = make_call()
    assert layer.enter(call) is WAIT
    token = await layer.enter_async(call)
    assert token == "trial" and call.started == pytest.approx(0.3)
    clock.advance(0.5)
    layer.exit(call, token, None)
    assert breaker.results == [("trial", pytest.approx(0.5), None)]


async def test_an_open_remote_breaker_is_not_asked() -> None:
    clock = FakeClock()
    breaker = RoundTripBreaker(clock)
    breaker.acquire = lambda: (_ for _ in ()).throw(BreakerOpen("remote", 4.0))  # type: ignore[method-assign]
    layer = BreakerLayer(breaker, clock)
    with pytest.raises(BreakerOpen):
        layer.enter(make_call())  # open, not half-open: no round trip


@pytest.mark.parametrize("kind", sorted(BREAKER_KINDS))
def test_build_makes_the_kind_the_policy_names(kind: str) -> None:
    g = Guard(Policy(stages={"x": StagePolicy(breaker=BreakerPolicy(kind=kind))}))
    layer = build(g.stage("x"), Bound("x", make_call().fn, stream=False))
    assert isinstance(layer, BreakerLayer)
    assert isinstance(layer.breaker, BREAKER_KINDS[kind])
    none = Guard(Policy(stages={"x": StagePolicy(breaker=BreakerPolicy(kind="none"))}))
    assert build(none.stage("x"), Bound("x", make_call().fn, stream=False)) is None
