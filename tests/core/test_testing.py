"""ragguard.testing and the plugin's ``guard`` fixture, for users' own test suites."""

from __future__ import annotations

import random

import pytest

import ragguard
from ragguard import BreakerState, FakeClock, Guard, Policy, _inject, default_guard, testing
from ragguard.chaos import Chaos
from ragguard.events import FallbackServed
from ragguard.testing import EventRecorder, FreshGuard, fresh_guard

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]
pytest_plugins = ["pytester"]


_TRIPS = {
    "kind": "generic",
    "minimum_calls": 1,
    "window_size": 1,
    "failure_rate_threshold": 100,
    "open_for_s": 30,
    "half_open_permits": 1,
}


@pytest.mark.ragguard_policy({"stages": {"search": {"breaker": _TRIPS}}})
async def test_the_guard_fixture_is_the_default_registry_on_the_fake_clock(
    guard: FreshGuard, fake_clock: FakeClock, guard_events: EventRecorder
) -> None:
    assert default_guard() is guard and guard.clock is fake_clock
    down = True

    def keyword(q: str) -> list[str]:
        return [f"kw:{q}"]

    @ragguard.guard("search", fallback=keyword)  # the default registry: this test's Guard
    async def search(q: str) -> list[str]:
        if down:
            raise ConnectionRefusedError("store down")
        return [f"vec:{q}"]

    assert await search("q") == ["kw:q"]
    breaker = guard.breaker("search")
    assert breaker.state is BreakerState.OPEN
    down = False
    assert await search("q") == ["kw:q"]  # still open
    fake_clock.advance(30)  # the policy's open_for_s, on the fixture's clock
    assert await search("q") == ["vec:q"]  # the trial call
    assert breaker.state is BreakerState.CLOSED
    await guard_events.settle()
    assert [e.fallback for e in guard_events.of(FallbackServed)] == ["keyword", "keyword"]
    async with ragguard.deadline(2.0):  # the default registry's clock: the fake one
        fake_clock.advance(1.5)
        assert ragguard.remaining() == pytest.approx(0.5)


def test_the_fixture_restores_the_registry_after_each_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import ragguard, pytest

        seen = []

        def test_one(guard, fake_clock):
            seen.append(guard)
            assert ragguard.default_guard() is guard and guard.clock is fake_clock

        @pytest.mark.ragguard_policy({"tenants": {"acme": {"max_concurrency": 3}}})
        def test_two(guard):
            assert guard is not seen[0]
            assert guard.policy.quota("acme").max_concurrency == 3
            seen.append(guard)

        def test_three():
            assert ragguard.default_guard() not in seen
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=3)


def test_fresh_guard_installs_and_restores_as_a_context_manager() -> None:
    before = default_guard()
    with fresh_guard({"stages": {"s": {"timeout_s": 2}}}) as g:
        assert default_guard() is g and isinstance(g.clock, FakeClock)
        assert g.policy.stage("s").timeout_s == 2
        with fresh_guard(clock=ragguard.FakeClock(5.0)) as inner:
            assert default_guard() is inner and inner.clock() == 5.0
        assert default_guard() is g
    assert default_guard() is before
    loose = fresh_guard(install=False)
    assert default_guard() is before
    loose.restore()  # harmless when never installed
    with pytest.raises(ragguard.ConfigError):
        fresh_guard(42)  # type: ignore[arg-type]


async def test_the_event_recorder_sees_events_until_closed() -> None:
    g = Guard(clock=FakeClock())

    def fallback() -> str:
        return "fb"

    @g.guard("s", fallback=fallback)
    async def broken() -> str:
        raise ConnectionRefusedError()

    with EventRecorder() as seen:
        assert await broken() == "fb"
        await seen.settle()
        assert len(seen.of(FallbackServed)) == 1
        seen.clear()
        assert seen.events == []
    await broken()
    await seen.settle()
    assert seen.events == []  # closed: nothing more recorded


def test_reset_forgets_the_default_registry_and_the_process_chaos() -> None:
    g = fresh_guard()
    chaos = Chaos(rng=random.Random(0)).install()
    assert _inject.active is chaos
    testing.reset()
    assert _inject.active is None
    assert default_guard() is not g and isinstance(default_guard().policy, Policy)
    g.restore()  # after a reset, restoring puts nothing back
    assert default_guard() is not g


async def test_reset_forgets_fallbacks_marked_outside_a_request_in_every_context() -> None:
    g = Guard(clock=FakeClock())

    def fallback() -> str:
        return "fb"

    @g.guard("s", fallback=fallback)
    async def broken() -> str:
        raise ConnectionRefusedError()

    assert await broken() == "fb"
    assert "fallback" in ragguard.degraded()
    testing.reset()  # from any context: a sync fixture's, this test's
    assert ragguard.degraded() == ()
    assert await broken() == "fb"
    assert ragguard.degraded() == ("fallback",)
