"""Behaviour kept while the costs of issue 16 were cut: the cached running loop, least recently used
tenant eviction, lean idle tenants, the bounded tenant-id cache, the retry layer's own loop over
tenacity strategies, and events built through their slots."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

import pytest
import tenacity

import ragguard
from ragguard import _compat
from ragguard.events import CallOutcome, StageCompleted
from ragguard.layers._retry import RetryBudget, RetryLayer
from ragguard.pipeline import Call
from ragguard.quotas import LocalQuotas
from ragguard.quotas import _tenant as tenant_module
from ragguard.quotas._local import Lease
from ragguard.quotas._tenant import TenantContext

# -- the running loop ------------------------------------------------------------------------------


def test_running_loop_is_the_public_one_in_each_thread_and_none_outside() -> None:
    seen: dict[str, Any] = {}

    async def probe(key: str) -> None:
        for _ in range(3):  # the cached path as well as the first lookup
            assert _compat.running_loop() is asyncio.get_running_loop()
        seen[key] = _compat.running_loop()

    asyncio.run(probe("main"))
    assert _compat.running_loop() is None  # that loop stopped: not cached as running

    def other() -> None:
        asyncio.run(probe("thread"))

    async def main_with_thread() -> None:
        t = threading.Thread(target=other)
        t.start()
        while t.is_alive():  # both loops run at once, in two threads
            assert _compat.running_loop() is asyncio.get_running_loop()
            await asyncio.sleep(0.001)
        t.join()

    asyncio.run(main_with_thread())
    assert seen["main"] is not seen["thread"]


def test_a_forked_child_forgets_the_cached_loop() -> None:
    async def probe() -> None:
        assert _compat.running_loop() is asyncio.get_running_loop()
        assert _compat._loop_last is asyncio.get_running_loop()
        _compat._forget_loop()  # what os.register_at_fork runs in a child
        assert _compat._loop_last is None
        assert _compat.running_loop() is asyncio.get_running_loop()

    asyncio.run(probe())


# -- tenants ---------------------------------------------------------------------------------------


def _quotas(max_tenants: int, clock: Any) -> LocalQuotas:
    quota = ragguard.TenantQuota(max_concurrency=2, rate_per_s=1000)
    return LocalQuotas(lambda tenant: quota, clock=clock, max_tenants=max_tenants)


def test_a_new_tenant_is_admitted_without_waiting() -> None:
    quotas = _quotas(100, ragguard.FakeClock())
    lease = quotas.admit_now("newcomer")
    assert isinstance(lease, Lease)  # was WAIT: the first request of a tenant took the slow path
    assert quotas.in_flight("newcomer") == 1
    quotas.release(lease)
    assert quotas.in_flight("newcomer") == 0


def test_idle_tenants_are_evicted_least_recently_used_first() -> None:
    clock = ragguard.FakeClock()
    quotas = _quotas(10, clock)
    for i in range(10):
        quotas.release(quotas.admit_now(f"t{i}"))
        clock.advance(1.0)
    for _ in range(3):  # t0, inserted first, is the one in use
        quotas.release(quotas.admit_now("t0"))
        clock.advance(1.0)
        for i in range(10, 13):
            quotas.release(quotas.admit_now(f"n{i}-{clock.now}"))
            clock.advance(1.0)
            quotas.release(quotas.admit_now("t0"))
    assert "t0" in quotas._buckets  # oldest-inserted-first would have dropped it at the first sweep
    assert len(quotas._buckets) <= 10
    assert "t1" not in quotas._buckets  # unused since: gone


def test_an_idle_tenant_keeps_no_queue_or_holder_list() -> None:
    quotas = _quotas(100, ragguard.FakeClock())
    a, b = quotas.admit_now("acme"), quotas.admit_now("acme")
    bucket = quotas._buckets["acme"]
    assert bucket.holders is not None and len(bucket.holders) == 2
    quotas.release(a)
    quotas.release(b)
    assert bucket.holders is None and bucket.waiters is None


def test_the_tenant_id_cache_stays_bounded() -> None:
    quotas = _quotas(100_000, ragguard.FakeClock())
    quota = ragguard.TenantQuota()
    for i in range(3 * tenant_module._VALID_MAX):
        TenantContext(f"org:{i}", quotas, quota)  # ids with punctuation take the full check
    assert 0 < len(tenant_module._valid) <= tenant_module._VALID_MAX
    with pytest.raises(ragguard.InvalidInput):
        TenantContext("bad id", quotas, quota)
    with pytest.raises(ragguard.InvalidInput):
        TenantContext("x" * 65, quotas, quota)


# -- retries -----------------------------------------------------------------------------------------


def _layer(**strategies: Any) -> tuple[RetryLayer, list[float]]:
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)

    clock = ragguard.FakeClock()
    policy = ragguard.RetryPolicy(attempts=5, initial_backoff_s=0.01, jitter_s=0.0)
    budget = RetryBudget(ratio=1.0, min_per_s=100.0, window_s=10, clock=clock)
    layer = RetryLayer(
        "s", policy, budget=budget, counts=lambda e: True, min_attempt_s=0.0, clock=clock,
        rng=__import__("random").Random(0), sleep=sleep, **strategies,
    )  # fmt: skip
    return layer, slept


@pytest.mark.anyio
async def test_the_retry_layer_drives_a_users_tenacity_strategies() -> None:
    states: list[tuple[int, float]] = []

    def my_wait(state: tenacity.RetryCallState) -> float:
        states.append((state.attempt_number, state.outcome.exception().args[0]))  # type: ignore[union-attr]
        return 0.5

    layer, slept = _layer(stop=tenacity.stop_after_attempt(3), wait=my_wait)
    calls = 0

    async def again() -> Any:
        nonlocal calls
        calls += 1
        raise ConnectionError(calls + 1)

    with pytest.raises(ConnectionError) as info:
        await layer.recover(Call("s", again, (), {}), ConnectionError(1), again)
    assert calls == 2  # 3 attempts in all, as stop_after_attempt(3) says
    assert slept == [0.5, 0.5]
    assert states == [(1, 1), (2, 2), (3, 3)]  # tenacity's order: wait is asked after each failure
    assert info.value.args == (3,)


@pytest.mark.anyio
async def test_the_default_strategies_stop_at_the_policys_attempts_and_back_off() -> None:
    layer, slept = _layer()
    attempts = []

    async def again() -> Any:
        attempts.append(1)
        if len(attempts) < 4:
            raise ConnectionError("down")
        return "ok"

    call = Call("s", again, (), {})
    assert await layer.recover(call, ConnectionError("down"), again) == "ok"
    assert call.attempt == 5
    assert slept == [0.01, 0.02, 0.04, 0.08]
    retry_if = tenacity.retry_if_exception_type(KeyError)  # a user's predicate that says no
    layer2, slept2 = _layer(retry=retry_if)
    with pytest.raises(ConnectionError):
        await layer2.recover(call, ConnectionError("down"), again)
    assert slept2 == []


# -- events ------------------------------------------------------------------------------------------


def test_events_built_through_their_slots_are_the_same_frozen_dataclasses() -> None:
    made = StageCompleted("s", "t", "success", 0.25)
    assert made == StageCompleted("s", "t", "success", 0.25, "", "")
    assert dataclasses.asdict(made)["fallback"] == ""
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.stage = "x"  # type: ignore[misc]
    outcome = CallOutcome("b", "failure", 0.1, error="ConnectionError")
    assert (outcome.breaker, outcome.outcome, outcome.duration_s, outcome.error) == (
        "b", "failure", 0.1, "ConnectionError",
    )  # fmt: skip
    with pytest.raises(TypeError):
        StageCompleted("s")  # type: ignore[call-arg]
