"""Unit tests of the breaker state machine, with a fake clock (no sleeping)."""

from __future__ import annotations

import asyncio
import random
from datetime import timedelta
from typing import Any

import pytest
from breaker_helpers import fail, succeed

from ragguard import BreakerOpen, ConfigError, FakeClock, events
from ragguard.breakers import BreakerState, CircuitBreaker

pytestmark = pytest.mark.timeout(30)


def make(clock: FakeClock, **options: Any) -> CircuitBreaker:
    defaults: dict[str, Any] = {"minimum_calls": 4, "window_size": 4, "half_open_permits": 2,
                                "open_for_s": 10.0, "clock": clock}
    return CircuitBreaker("test", **{**defaults, **options})


def trip(breaker: CircuitBreaker) -> None:
    for _ in range(breaker.window_size):
        if breaker.state is BreakerState.OPEN:
            return
        fail(breaker)
    assert breaker.state is BreakerState.OPEN


# -- count window and failure rate ----------------------------------------------------------


def test_failure_rate_trips_only_after_minimum_calls(clock: FakeClock) -> None:
    breaker = make(clock, failure_rate_threshold=50.0)
    fail(breaker)
    fail(breaker)
    fail(breaker)
    assert breaker.state is BreakerState.CLOSED  # 3 calls < minimum_calls=4
    assert breaker.metrics().failure_rate == -1.0
    succeed(breaker)  # 3 of 4 failed = 75 % >= 50 %: the fourth call trips, though a success
    assert breaker.state is BreakerState.OPEN


def test_failure_rate_below_threshold_stays_closed(clock: FakeClock) -> None:
    breaker = make(clock, failure_rate_threshold=50.0, minimum_calls=4, window_size=4)
    for ok in (True, False, True, True, True, False, True, True):  # never 2 failures in the last 4
        (succeed if ok else fail)(breaker)
    assert breaker.state is BreakerState.CLOSED
    assert breaker.metrics().failure_rate == 25.0


def test_count_window_forgets_the_oldest_calls(clock: FakeClock) -> None:
    breaker = make(clock, failure_rate_threshold=75.0, minimum_calls=4, window_size=4)
    fail(breaker)
    fail(breaker)
    succeed(breaker)
    succeed(breaker)  # window F F S S: 50 %
    succeed(breaker)
    succeed(breaker)  # window S S S S: the failures slid out
    m = breaker.metrics()
    assert (m.calls, m.failed_calls, m.failure_rate) == (4, 0, 0.0)
    fail(breaker)
    fail(breaker)
    assert breaker.state is BreakerState.CLOSED  # S S F F: 50 % < 75 %
    fail(breaker)
    assert breaker.state is BreakerState.OPEN  # S F F F: 75 %


# -- time window ----------------------------------------------------------------------------


def test_time_window_buckets_expire_by_the_clock(clock: FakeClock) -> None:
    breaker = make(clock, window_type="time", window_size=10, minimum_calls=3, failure_rate_threshold=60.0)
    fail(breaker)
    fail(breaker)
    clock.advance(9.0)  # both failures still inside the 10 s window
    assert breaker.metrics().failed_calls == 2
    clock.advance(1.0)  # now 10 s later: the first second's bucket left the window
    m = breaker.metrics()
    assert (m.calls, m.failed_calls) == (0, 0)
    fail(breaker)
    succeed(breaker)
    assert breaker.state is BreakerState.CLOSED  # 1 of 2 calls: below minimum_calls
    fail(breaker)
    assert breaker.state is BreakerState.OPEN  # 2 of 3 = 66.7 % >= 60 %


def test_time_window_counts_per_second_bucket(clock: FakeClock) -> None:
    breaker = make(clock, window_type="time", window_size=3, minimum_calls=100)
    for _ in range(3):
        succeed(breaker)
        fail(breaker)
        clock.advance(1.0)
    assert breaker.metrics().calls == 4  # the first second's bucket has gone: buckets t-2..t
    clock.advance(100.0)  # a long idle gap empties the window in one step
    assert breaker.metrics().calls == 0


def test_time_window_minimum_calls_may_exceed_window_size(clock: FakeClock) -> None:
    breaker = make(clock, window_type="time", window_size=2, minimum_calls=50)
    for _ in range(49):
        fail(breaker)
    assert breaker.state is BreakerState.CLOSED
    fail(breaker)
    assert breaker.state is BreakerState.OPEN


# -- slow-call rate and consecutive failures ------------------------------------------------


def test_slow_call_rate_trips(clock: FakeClock) -> None:
    breaker = make(clock, slow_call_duration_s=2.0, slow_call_rate_threshold=50.0, minimum_calls=4)
    succeed(breaker, duration_s=2.0)  # exactly the threshold is not slow (resilience4j: slower than)
    succeed(breaker, duration_s=2.5)
    succeed(breaker, duration_s=0.1)
    assert breaker.metrics().slow_calls == 1
    succeed(breaker, duration_s=3.0)
    assert breaker.state is BreakerState.OPEN  # 2 of 4 slow = 50 %


def test_slow_failures_count_in_both_rates(clock: FakeClock) -> None:
    breaker = make(clock, slow_call_duration_s=1.0, minimum_calls=4, failure_rate_threshold=100.0)
    fail(breaker, duration_s=5.0)
    m = breaker.metrics()
    assert (m.failed_calls, m.slow_calls) == (1, 1)


def test_consecutive_failures_trip_after_minimum_calls(clock: FakeClock) -> None:
    breaker = make(clock, failure_rate_threshold=100.0, consecutive_failures_threshold=3,
                   minimum_calls=5, window_size=10)
    fail(breaker)
    fail(breaker)
    fail(breaker)
    assert breaker.state is BreakerState.CLOSED  # 3 in a row, but only 3 < 5 calls in the window
    succeed(breaker)
    fail(breaker)
    fail(breaker)
    assert breaker.state is BreakerState.CLOSED  # the success broke the run: 2 in a row
    fail(breaker)
    assert breaker.state is BreakerState.OPEN


def test_ignored_errors_are_not_counted_and_do_not_break_a_run(clock: FakeClock) -> None:
    breaker = make(clock, failure_rate_threshold=100.0, consecutive_failures_threshold=2,
                   minimum_calls=2, window_size=10)
    fail(breaker)
    fail(breaker, ValueError("bad input"))
    assert breaker.metrics().calls == 1
    fail(breaker)
    assert breaker.state is BreakerState.OPEN


# -- open, half-open ------------------------------------------------------------------------


def test_open_rejects_with_exact_retry_after_then_half_opens_lazily(clock: FakeClock) -> None:
    breaker = make(clock, open_for_s=10.0)
    trip(breaker)
    clock.advance(3.25)
    with pytest.raises(BreakerOpen) as info:
        breaker.acquire()
    assert info.value.retry_after_s == pytest.approx(6.75, abs=1e-9)
    assert info.value.breaker == "test" and info.value.state == "open"
    assert breaker.retry_after_s == pytest.approx(6.75, abs=1e-9)
    clock.advance(6.75)
    assert breaker.state is BreakerState.OPEN  # no timer: the next acquire half-opens it
    breaker.acquire()
    assert breaker.state is BreakerState.HALF_OPEN


def test_half_open_admits_exactly_the_permits_and_closes_on_good_trials(clock: FakeClock) -> None:
    breaker = make(clock, half_open_permits=3)
    trip(breaker)
    clock.advance(10.0)
    tokens = [breaker.acquire() for _ in range(3)]
    with pytest.raises(BreakerOpen) as info:
        breaker.acquire()
    assert info.value.retry_after_s == 0.0 and info.value.state == "half_open"
    breaker.on_result(tokens[0], 0.0, None)
    breaker.on_result(tokens[1], 0.0, ConnectionResetError())
    assert breaker.state is BreakerState.HALF_OPEN  # waits for every trial (resilience4j)
    breaker.on_result(tokens[2], 0.0, None)
    assert breaker.state is BreakerState.CLOSED  # 1 of 3 failed = 33 % < 50 %
    assert breaker.metrics().calls == 0  # a fresh window


def test_half_open_reopens_when_trials_fail(clock: FakeClock) -> None:
    breaker = make(clock, half_open_permits=2)
    trip(breaker)
    clock.advance(10.0)
    a, b = breaker.acquire(), breaker.acquire()
    breaker.on_result(a, 0.0, None)
    breaker.on_result(b, 0.0, ConnectionResetError())
    assert breaker.state is BreakerState.OPEN  # 1 of 2 = 50 % >= 50 %


def test_half_open_reopens_on_slow_trials(clock: FakeClock) -> None:
    breaker = make(clock, half_open_permits=2, slow_call_duration_s=1.0, slow_call_rate_threshold=50.0)
    trip(breaker)
    clock.advance(10.0)
    a, b = breaker.acquire(), breaker.acquire()
    breaker.on_result(a, 0.0, None)
    breaker.on_result(b, 1.5, None)
    assert breaker.state is BreakerState.OPEN


@pytest.mark.parametrize("end", ["cancelled", "ignored"])
def test_cancelled_or_ignored_trial_gives_its_permit_back(clock: FakeClock, end: str) -> None:
    breaker = make(clock, half_open_permits=1)
    trip(breaker)
    clock.advance(10.0)
    token = breaker.acquire()
    with pytest.raises(BreakerOpen):
        breaker.acquire()
    if end == "cancelled":
        breaker.release(token)
    else:
        breaker.on_result(token, 0.0, ValueError("caller's bad input"))
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.metrics().trial_permits_left == 1
    again = breaker.acquire()  # the permit came back: a new trial may run
    breaker.on_result(again, 0.0, None)
    assert breaker.state is BreakerState.CLOSED


def test_results_of_calls_started_before_a_transition_are_not_counted(clock: FakeClock) -> None:
    breaker = make(clock, half_open_permits=1)
    stale = breaker.acquire()  # admitted while closed
    trip(breaker)
    clock.advance(10.0)
    trial = breaker.acquire()
    breaker.on_result(stale, 0.0, ConnectionResetError())  # finished late: not a trial
    breaker.release(stale)  # nor does it hand back a trial permit
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.metrics().trial_permits_left == 0
    breaker.on_result(trial, 0.0, None)
    assert breaker.state is BreakerState.CLOSED


# -- open duration: backoff, cap, jitter ----------------------------------------------------


def reopen(breaker: CircuitBreaker, clock: FakeClock) -> float:
    """Wait out the open state, fail every trial, return the new open duration."""
    clock.advance(breaker.retry_after_s or 0.0)
    tokens = []
    while True:
        try:
            tokens.append(breaker.acquire())
        except BreakerOpen:
            break
    for token in tokens:
        breaker.on_result(token, 0.0, ConnectionResetError())
    assert breaker.state is BreakerState.OPEN
    return breaker.retry_after_s or 0.0


def test_open_duration_grows_on_repeated_trips_up_to_the_cap(clock: FakeClock) -> None:
    breaker = make(clock, open_for_s=10.0, open_backoff_multiplier=2.0, open_max_s=50.0)
    trip(breaker)
    assert breaker.retry_after_s == 10.0
    assert [reopen(breaker, clock) for _ in range(4)] == [20.0, 40.0, 50.0, 50.0]
    clock.advance(50.0)
    token = breaker.acquire()
    breaker.on_result(token, 0.0, None)
    breaker.on_result(breaker.acquire(), 0.0, None)
    assert breaker.state is BreakerState.CLOSED
    trip(breaker)
    assert breaker.retry_after_s == 10.0  # closing reset the growth


def test_constant_open_duration_by_default(clock: FakeClock) -> None:
    breaker = make(clock, open_for_s=7.0)
    trip(breaker)
    assert [reopen(breaker, clock) for _ in range(3)] == [7.0, 7.0, 7.0]


def test_seeded_jitter_is_reproducible_and_bounded(clock: FakeClock) -> None:
    def durations(seed: int) -> list[float]:
        c = FakeClock(0.0)
        breaker = make(c, open_for_s=10.0, open_backoff_multiplier=2.0, open_max_s=30.0,
                       open_jitter=0.2, rng=random.Random(seed))
        trip(breaker)
        return [breaker.retry_after_s or 0.0] + [reopen(breaker, c) for _ in range(3)]

    first = durations(7)
    assert first == durations(7)
    assert first != durations(8)
    rng = random.Random(7)
    expected = []
    for base in (10.0, 20.0, 30.0, 30.0):
        expected.append(min(base * (1 + 0.2 * (2 * rng.random() - 1)), 30.0))
    assert first == pytest.approx(expected)
    assert all(8.0 <= d <= 30.0 for d in first)


# -- operators ------------------------------------------------------------------------------


def test_forced_open_rejects_without_retry_after(clock: FakeClock) -> None:
    breaker = make(clock)
    breaker.force_open()
    clock.advance(1e6)
    with pytest.raises(BreakerOpen) as info:
        breaker.acquire()
    assert info.value.retry_after_s is None and info.value.state == "forced_open"
    breaker.reset()
    assert breaker.state is BreakerState.CLOSED
    succeed(breaker)


def test_disabled_lets_everything_through_and_records_nothing(clock: FakeClock) -> None:
    breaker = make(clock)
    breaker.disable()
    for _ in range(20):
        fail(breaker)
    assert breaker.state is BreakerState.DISABLED
    assert breaker.metrics().calls == 0
    breaker.reset()
    assert breaker.metrics().calls == 0


# -- call(), the decorator, cancellation ----------------------------------------------------


def test_call_and_decorator_record_and_reraise(clock: FakeClock) -> None:
    breaker = make(clock, minimum_calls=2, window_size=2, failure_rate_threshold=100.0)

    @breaker
    async def query(x: int) -> int:
        clock.advance(0.5)
        if x < 0:
            raise ConnectionRefusedError("refused")
        return x * 2

    async def main() -> None:
        assert await query(21) == 42
        assert await breaker.call(query.__wrapped__, 1) == 2  # type: ignore[attr-defined]
        with pytest.raises(ConnectionRefusedError):
            await query(-1)
        with pytest.raises(ConnectionRefusedError):  # the call that trips raises its own error
            await query(-1)
        assert breaker.state is BreakerState.OPEN
        with pytest.raises(BreakerOpen):
            await query(1)

    asyncio.run(main())


def test_decorator_rejects_sync_functions(clock: FakeClock) -> None:
    breaker = make(clock)
    with pytest.raises(ConfigError):
        breaker(lambda: 1)  # type: ignore[arg-type,return-value]


def test_cancelled_calls_are_neither_failures_nor_successes(clock: FakeClock) -> None:
    breaker = make(clock, half_open_permits=1)

    async def hang() -> None:
        await asyncio.sleep(3600)

    async def cancel_one() -> None:
        task = asyncio.ensure_future(breaker.call(hang))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_one())
    assert breaker.metrics().calls == 0
    trip(breaker)
    clock.advance(10.0)
    asyncio.run(cancel_one())  # the cancelled trial returns its permit
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.metrics().trial_permits_left == 1


def test_classifier_that_raises_does_not_count_or_break(clock: FakeClock) -> None:
    def broken(exc: BaseException) -> bool:
        raise RuntimeError("bug")

    breaker = make(clock, classifier=broken, minimum_calls=1, window_size=1)
    fail(breaker)
    assert breaker.state is BreakerState.CLOSED and breaker.metrics().calls == 0


# -- events ---------------------------------------------------------------------------------


def test_events_and_a_raising_listener(clock: FakeClock) -> None:
    breaker = make(clock, minimum_calls=1, window_size=1)
    seen: list[Any] = []

    def boom(event: Any) -> None:
        raise RuntimeError("listener bug")

    breaker.add_listener(boom)
    breaker.add_listener(seen.append)

    async def main() -> None:
        with pytest.raises(ConnectionRefusedError):
            await breaker.call(_refuse)
        with pytest.raises(BreakerOpen):
            await breaker.call(_refuse)
        await asyncio.sleep(0)  # events are delivered on the next loop iteration

    asyncio.run(main())
    kinds = [type(e).__name__ for e in seen]
    assert kinds == ["BreakerCallOutcome", "BreakerTransition", "CallRejected"]
    outcome, transition, rejected = seen
    assert isinstance(outcome, events.CallOutcome) and outcome.outcome == "failure"
    assert outcome.error == "ConnectionRefusedError"
    assert (transition.old, transition.new) == ("closed", "open")
    assert rejected.retry_after_s == pytest.approx(10.0)


def test_no_event_is_built_without_listeners(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    breaker = make(clock, minimum_calls=1, window_size=1)
    monkeypatch.setattr(events.EventBus, "emit", _no_emit)
    assert not breaker.bus.active
    succeed(breaker)
    fail(breaker)
    with pytest.raises(BreakerOpen):
        breaker.acquire()


def _no_emit(self: events.EventBus, event: Any) -> None:
    raise AssertionError(f"emitted {event!r} with nobody listening")


async def _refuse() -> None:
    raise ConnectionRefusedError("refused")


# -- validation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("failure_rate_threshold", 0),
        ("failure_rate_threshold", 101),
        ("slow_call_rate_threshold", -1.0),
        ("slow_call_duration_s", 0),
        ("slow_call_duration_s", float("nan")),
        ("consecutive_failures_threshold", 0),
        ("minimum_calls", 0),
        ("minimum_calls", 5),  # > window_size of a count window
        ("window_type", "sliding"),
        ("window_size", 0),
        ("window_size", True),
        ("half_open_permits", 0),
        ("open_for_s", -1),
        ("open_for_s", float("inf")),
        pytest.param("open_for_s", 10**400, id="open_for_s-10**400"),  # issue 13 item 9: was OverflowError
        pytest.param("slow_call_duration_s", 10**400, id="slow_call_duration_s-10**400"),
        pytest.param("open_max_s", 10**400, id="open_max_s-10**400"),
        ("open_backoff_multiplier", 0.5),
        ("open_max_s", 1.0),  # < open_for_s
        ("open_jitter", 1.0),
        ("rng", 42),
        ("classifier", "ValueError"),
        ("clock", 0.0),
        ("error_class", ValueError),
    ],
)
def test_options_are_validated_by_name(option: str, value: Any) -> None:
    options: dict[str, Any] = {"minimum_calls": 4, "window_size": 4, "open_for_s": 10.0, option: value}
    with pytest.raises(ConfigError, match=option):
        CircuitBreaker("x", **options)


def test_name_is_validated_and_timedelta_accepted(clock: FakeClock) -> None:
    with pytest.raises(ConfigError, match="name"):
        CircuitBreaker("", clock=clock)
    breaker = make(clock, open_for_s=timedelta(seconds=12))
    trip(breaker)
    assert breaker.retry_after_s == 12.0
