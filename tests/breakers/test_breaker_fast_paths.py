"""The breaker's fast paths keep its promises: successes a clean closed window takes in bulk count
exactly as one by one, rejections built without a Python __init__ carry every field, and the
breaker layer drives a stock CircuitBreaker directly but any other breaker through its protocol
(issue 16: the closed breaker and the rejection measured by benchmarks/breaker_micro.py)."""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import pytest

from ragguard import BreakerOpen, FakeClock, VectorStoreUnavailable
from ragguard.breakers import BreakerState, CircuitBreaker, VectorStoreUnavailableBreaker
from ragguard.layers._breaker import BreakerLayer
from ragguard.pipeline import Call

pytestmark = pytest.mark.timeout(30)


def _ok(breaker: CircuitBreaker, duration_s: float = 0.01) -> None:
    breaker.on_result(breaker.acquire(), duration_s, None)


def _fail(breaker: CircuitBreaker) -> None:
    breaker.on_result(breaker.acquire(), 0.01, ConnectionResetError("reset"))


def test_successes_taken_in_bulk_fill_a_count_window_exactly() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(
        "b", window_size=4, minimum_calls=4, failure_rate_threshold=50, open_for_s=10, clock=clock
    )
    for _ in range(10):
        _ok(breaker)
    assert breaker._oks > 0  # taken in bulk: no window write yet
    metrics = breaker.metrics()
    assert (metrics.calls, metrics.failed_calls, breaker._oks) == (4, 0, 0)
    _ok(breaker)
    _fail(breaker)  # the window now ends s s s f: 25%
    assert breaker.state is BreakerState.CLOSED
    _fail(breaker)  # s s f f: 50%, trips
    assert breaker.state is BreakerState.OPEN


def test_a_dirty_window_records_successes_one_by_one_until_the_failures_leave() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker("b", window_size=3, minimum_calls=3, failure_rate_threshold=100, clock=clock)
    _fail(breaker)
    for expected_failures in (1, 1, 0):
        _ok(breaker)
        assert breaker._oks == 0  # recorded at once while a failure is in the window
        assert breaker.metrics().failed_calls == expected_failures
    _ok(breaker)
    assert breaker._oks == 1  # clean again: back to the bulk count


def test_successes_taken_in_bulk_leave_a_time_window_with_their_second() -> None:
    clock = FakeClock(100.0)
    breaker = CircuitBreaker(
        "b", window_type="time", window_size=2, minimum_calls=2, failure_rate_threshold=60, clock=clock
    )
    _ok(breaker)  # the first success of a second opens it: recorded
    for _ in range(5):
        _ok(breaker)
    assert breaker._oks == 5
    clock.advance(1.0)  # second 101: the 6 successes of second 100 are still in the window
    _fail(breaker)
    assert breaker.metrics().calls == 7 and breaker.state is BreakerState.CLOSED
    clock.advance(1.0)  # second 102: second 100 left the window; 1 failure of 1 call
    _fail(breaker)
    assert breaker.state is BreakerState.OPEN


def test_a_slow_success_is_never_taken_in_bulk() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(
        "b",
        window_size=2,
        minimum_calls=2,
        slow_call_duration_s=1.0,
        slow_call_rate_threshold=50,
        clock=clock,
    )
    _ok(breaker)
    _ok(breaker, duration_s=2.0)  # slow: 1 of 2 calls, 50%: trips
    assert breaker.state is BreakerState.OPEN


def test_with_a_listener_every_success_is_an_event() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker("b", clock=clock)
    seen: list[Any] = []
    breaker.add_listener(seen.append)

    async def main() -> None:
        async def ok() -> int:
            return 1

        for _ in range(3):
            await breaker.call(ok)
        _ok(breaker)
        await asyncio.sleep(0)

    asyncio.run(main())
    assert [e.outcome for e in seen] == ["success"] * 4
    assert breaker.metrics().calls == 4


def test_a_rejection_built_without_init_carries_every_field() -> None:
    clock = FakeClock()
    breaker = VectorStoreUnavailableBreaker(
        "store", minimum_calls=1, window_size=1, open_for_s=30, clock=clock
    )
    _fail(breaker)
    clock.advance(5.0)
    for reject in (breaker.acquire, lambda: asyncio.run(breaker.call(_never))):
        with pytest.raises(VectorStoreUnavailable) as info:
            reject()
        exc = info.value
        assert (exc.breaker, exc.retry_after_s, exc.state) == ("store", 25.0, "open")
        assert str(exc) == "circuit breaker 'store' is open; retry after 25.000s"
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is VectorStoreUnavailable
        assert (back.breaker, back.retry_after_s, back.state) == ("store", 25.0, "open")


def test_breaker_open_built_by_hand_keeps_its_keyword_fields() -> None:
    exc = BreakerOpen(breaker="b", retry_after_s=None, state="forced_open")
    assert (exc.breaker, exc.retry_after_s, exc.state) == ("b", None, "forced_open")
    exc.retry_after_s = 2.0
    assert exc.args == ("b", 2.0) and "retry after 2.000s" in str(exc)
    back = pickle.loads(pickle.dumps(exc))
    assert (back.breaker, back.retry_after_s, back.state) == ("b", 2.0, "forced_open")


class _Custom(BreakerOpen):
    def __init__(self, breaker: str, retry_after_s: float | None, **kw: Any) -> None:
        super().__init__(breaker, retry_after_s, **kw)
        self.note = f"custom {breaker}"


def test_an_error_class_with_its_own_init_is_built_by_calling_it() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker("c", minimum_calls=1, window_size=1, error_class=_Custom, clock=clock)
    _fail(breaker)
    with pytest.raises(_Custom) as info:
        asyncio.run(breaker.call(_never))
    assert info.value.note == "custom c"


async def _never() -> None:
    raise AssertionError("a rejected call never runs")


class _Counting(CircuitBreaker):
    """A breaker that overrides the protocol: the layer must call it, not its fast path."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.acquired = self.results = 0

    def acquire(self) -> int:
        self.acquired += 1
        return super().acquire()

    def on_result(
        self, token: int, duration_s: float, exc: BaseException | None, now: float | None = None
    ) -> None:
        self.results += 1
        super().on_result(token, duration_s, exc, now)


def test_the_layer_drives_an_overriding_breaker_through_its_protocol() -> None:
    clock = FakeClock()
    counting = _Counting("b", clock=clock)
    stock = CircuitBreaker("s", clock=clock)
    for breaker in (counting, stock):
        layer = BreakerLayer(breaker, clock)
        for _ in range(3):
            call = Call("s", _never, (), {})
            layer.exit(call, layer.enter(call), None)
        assert breaker.metrics().calls == 3
    assert (counting.acquired, counting.results) == (3, 3)
    assert stock._oks == 0  # read by metrics(): the 3 fast successes are in the window now


@pytest.mark.parametrize("seed", range(40))
def test_time_window_with_its_head_in_fields_counts_as_a_naive_window(seed: int) -> None:
    """The time window keeps its latest second's bucket in plain fields (the failure path records
    there): its totals match a list of every outcome, filtered to the window, at every step."""
    import math
    import random

    from ragguard.breakers._window import TimeWindow

    rng = random.Random(seed)
    size = rng.randint(1, 5)
    window = TimeWindow(size)
    log: list[tuple[int, int, int]] = []  # (second, code, count)
    now = rng.uniform(0.0, 10.0)
    for _ in range(200):
        now += rng.choice([0.0, 0.01, 0.3, 1.0, 2.5, 7.0]) * rng.random()
        op = rng.random()
        if op < 0.6:
            code = rng.randint(0, 3)
            window.record(code, now)
            log.append((math.floor(now), code, 1))
        elif op < 0.7 and now < window.clean_until():
            n = rng.randint(1, 5)
            window.add_successes(n)
            log.append((math.floor(now), 0, n))
        elif op < 0.8:
            window.expire(now)
        elif op < 0.82:
            window.clear()
            log.clear()
        live = [(s, c, n) for s, c, n in log if window._head - size < s <= window._head]
        assert (window.calls, window.failures, window.slow) == (
            sum(n for _, _, n in live),
            sum(n for _, c, n in live if c & 1),
            sum(n for _, c, n in live if c & 2),
        )
