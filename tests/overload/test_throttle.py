"""Client-side adaptive throttling: the SRE formula, its cap, its window on the Guard clock."""

from __future__ import annotations

import random

import grpc
import pytest

import ragguard
from ragguard import FakeClock, Overloaded, Policy, StagePolicy, ThrottlePolicy
from ragguard.overload import status
from ragguard.overload._throttle import AdaptiveThrottle, is_rejection


def _throttle(clock: FakeClock, **kw: float) -> AdaptiveThrottle:
    return AdaptiveThrottle(clock=clock, rng=random.Random(4), **kw)  # type: ignore[arg-type]


def test_no_refusal_while_the_dependency_accepts() -> None:
    t = _throttle(FakeClock())
    for _ in range(1000):
        assert t.allow()
        t.accepted()
    assert t.probability() == 0.0 and t.refused == 0


@pytest.mark.parametrize(("requests", "accepts"), [(100, 50), (100, 20), (300, 10), (50, 0)])
def test_p_is_requests_minus_k_accepts_over_requests_plus_1(requests: int, accepts: int) -> None:
    t = _throttle(FakeClock(), k=2.0, max_reject=0.99)
    for i in range(requests):
        t._requests[t._rotate()] += 1
        t._total_requests += 1
        if i < accepts:
            t.accepted()
    expected = min(0.99, max(0.0, (requests - 2.0 * accepts) / (requests + 1)))
    assert t.probability() == pytest.approx(expected)


def test_refusals_follow_the_formula_and_stop_at_max_reject() -> None:
    clock = FakeClock()
    t = _throttle(clock, k=2.0, max_reject=0.5, window_s=1000.0)
    refused = 0
    for _ in range(4000):  # a dependency that rejects everything it gets
        if not t.allow():
            refused += 1
    # P rises to (n - 0)/(n + 1) -> 1, capped at 0.5: about half refused
    assert refused / 4000 == pytest.approx(0.5, abs=0.04)


def test_a_dependency_with_a_fixed_capacity_is_sent_about_k_times_what_it_accepts() -> None:
    """The book's promise: with K=2 the client sends about twice what the dependency accepts."""
    clock = FakeClock()
    t = _throttle(clock, k=2.0, max_reject=0.95, window_s=10.0)
    sent = accepted = 0
    for tick in range(2000):  # 100 calls wanted per tick; the dependency takes 20 per tick
        taken = 0
        for _ in range(100):
            if not t.allow():
                continue
            if tick >= 1000:
                sent += 1
            if taken < 20:
                taken += 1
                t.accepted()
                if tick >= 1000:
                    accepted += 1
        clock.advance(0.01)
    assert sent / accepted == pytest.approx(2.0, rel=0.1)


def test_history_is_windowed_on_the_guard_clock() -> None:
    clock = FakeClock()
    t = _throttle(clock, window_s=10.0, max_reject=0.9)
    for _ in range(200):
        t.allow()
    assert t.probability() > 0.8
    clock.advance(5.0)
    assert t.probability() > 0.8  # still inside the window
    clock.advance(5.6)
    assert t.probability() == 0.0 and t.requests == 0


class _Status(grpc.aio.AioRpcError):  # type: ignore[misc]
    def __init__(self, code: grpc.StatusCode, *trailing: tuple[str, str]) -> None:
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailing), "x")


def test_what_counts_as_a_rejection() -> None:
    assert is_rejection(_Status(grpc.StatusCode.RESOURCE_EXHAUSTED))
    # UNAVAILABLE is an outage (the breaker's), unless the server says when to come back
    assert not is_rejection(_Status(grpc.StatusCode.UNAVAILABLE))
    assert is_rejection(_Status(grpc.StatusCode.UNAVAILABLE, ("grpc-retry-pushback-ms", "250")))
    assert not is_rejection(_Status(grpc.StatusCode.DEADLINE_EXCEEDED))
    assert not is_rejection(TimeoutError())
    assert is_rejection(Overloaded("x", 0.1, "limit"))
    assert not is_rejection(ValueError())


@pytest.mark.anyio
async def test_the_throttle_layer_refuses_calls_of_a_rejecting_dependency() -> None:
    clock = FakeClock()
    g = ragguard.Guard(
        Policy(stages={"llm": StagePolicy(throttle=ThrottlePolicy(k=2.0, window_s=30.0, max_reject=0.9))}),
        clock=clock, rng=random.Random(2),
    )
    reached = 0

    @g.guard("llm")
    async def call() -> str:
        nonlocal reached
        reached += 1
        raise _Status(grpc.StatusCode.RESOURCE_EXHAUSTED)

    throttled = 0
    for _ in range(300):
        try:
            await call()
        except Overloaded as exc:
            assert exc.reason == "throttled" and exc.stage == "llm"
            throttled += 1
        except grpc.aio.AioRpcError:
            pass
    assert throttled > 200 and reached + throttled == 300
    snap = status(g)["llm"]["throttle"]
    assert snap["accepts"] == 0 and snap["refused"] == throttled
    clock.advance(31.0)  # the history has passed: calls go through again
    with pytest.raises(grpc.aio.AioRpcError):
        await call()
