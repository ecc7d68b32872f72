"""Tenants not named in the policy share one aggregate bound (``Policy.unlisted_pool``): rotating
tenant ids cannot multiply the default quota, and the listed tenants are never counted in it.

In memory here (``LocalQuotas``, through ``Guard.tenant``); tests/distributed/test_shared_quota_pool.py
holds the same promises across replicas sharing Redis.
"""

from __future__ import annotations

import contextlib
from typing import Any

import anyio
import pytest

import ragguard
from ragguard import ConfigError, Guard, Policy, PoolQuota, QuotaExceeded, TenantQuota
from ragguard.quotas import LocalQuotas

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


async def _hold_all(g: Guard, tenants: list[str]) -> tuple[list[str], contextlib.AsyncExitStack]:
    """Enter a request of each tenant and keep the admitted ones open; returns who got in."""
    stack = contextlib.AsyncExitStack()
    admitted: list[str] = []
    for t in tenants:
        try:
            await stack.enter_async_context(g.tenant(t))
        except QuotaExceeded as exc:
            assert exc.tenant == t and exc.reason == "concurrency"
        else:
            admitted.append(t)
    return admitted, stack


async def test_rotating_tenant_ids_share_one_default_quota() -> None:
    g = Guard(Policy(default_quota=TenantQuota(max_concurrency=2)))
    admitted, stack = await _hold_all(g, [f"evil{i}" for i in range(50)])
    async with stack:
        assert admitted == ["evil0", "evil1"]  # not 50: every new id is in the same pool
        assert g.quotas.pool_in_flight() == 2


async def test_listed_tenants_are_not_counted_in_the_pool() -> None:
    g = Guard(Policy(tenants={"acme": TenantQuota(max_concurrency=3)},
                     default_quota=TenantQuota(max_concurrency=2)))
    admitted, stack = await _hold_all(g, [f"evil{i}" for i in range(20)] + ["acme"] * 4)
    async with stack:
        assert admitted == ["evil0", "evil1", "acme", "acme", "acme"]  # acme keeps its own 3
        assert g.quotas.pool_in_flight() == 2


async def test_each_unlisted_tenant_keeps_its_own_quota_inside_a_larger_pool() -> None:
    policy = Policy(default_quota=TenantQuota(max_concurrency=2),
                    unlisted_pool=PoolQuota(max_concurrency=5))
    g = Guard(policy)
    admitted, stack = await _hold_all(g, ["a", "a", "a", "b", "b", "b", "c", "c", "d"])
    async with stack:
        assert admitted == ["a", "a", "b", "b", "c"]  # 2 each, 5 in all
        assert g.quotas.in_flight("a") == 2 and g.quotas.pool_in_flight() == 5


async def test_an_unlimited_pool_gives_each_unlisted_tenant_its_own_quota() -> None:
    g = Guard(Policy(default_quota=TenantQuota(max_concurrency=1), unlisted_pool=PoolQuota()))
    admitted, stack = await _hold_all(g, [f"t{i}" for i in range(10)])
    async with stack:
        assert len(admitted) == 10
    assert g.policy.pool("t0") is None


async def test_the_pool_bounds_the_rate_of_rotating_ids() -> None:
    clock = ragguard.FakeClock()
    g = Guard(Policy(default_quota=TenantQuota(rate_per_s=10, burst=2)), clock=clock)
    admitted: list[float] = []
    for i in range(300):  # a new id every 10 ms for 3 s
        try:
            async with g.tenant(f"id{i}"):
                admitted.append(clock())
        except QuotaExceeded as exc:
            assert exc.reason == "rate" and exc.tenant == f"id{i}"
        clock.advance(0.01)
    assert 30 <= len(admitted) <= 30 + 2  # 10/s plus the burst, not one burst per id
    for start in (t / 10 for t in range(0, 21)):
        assert sum(1 for t in admitted if start <= t < start + 1.0) <= 10 + 2


async def test_a_pool_refusal_spends_no_rate_of_the_tenant() -> None:
    clock = ragguard.FakeClock()
    policy = Policy(default_quota=TenantQuota(max_concurrency=5, rate_per_s=1, burst=1),
                    unlisted_pool=PoolQuota(max_concurrency=1))
    g = Guard(policy, clock=clock)
    async with g.tenant("a"):
        with pytest.raises(QuotaExceeded) as info:
            async with g.tenant("b"):
                pass
        assert info.value.reason == "concurrency"
    async with g.tenant("b"):  # b's own token was refunded: admitted at once
        pass


async def test_a_pool_waiter_is_admitted_when_another_tenant_frees_a_slot() -> None:
    g = Guard(Policy(default_quota=TenantQuota(max_concurrency=1, max_wait_s=5)))
    order: list[str] = []
    first_in = anyio.Event()
    release = anyio.Event()

    async def run(tenant: str, started: anyio.Event | None) -> None:
        async with g.tenant(tenant):
            order.append(tenant)
            if started is not None:
                started.set()
                await release.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, "a", first_in)
        await first_in.wait()
        tg.start_soon(run, "b", None)
        for _ in range(100):
            await anyio.sleep(0)
        assert order == ["a"]  # b waits for the pool's one slot
        release.set()
    assert order == ["a", "b"]
    assert g.quotas.pool_in_flight() == 0


async def test_a_cancelled_pool_waiter_holds_nothing() -> None:
    g = Guard(Policy(default_quota=TenantQuota(max_concurrency=1, max_wait_s=5)))
    async with g.tenant("a"):
        with anyio.move_on_after(0.05):
            async with g.tenant("b"):
                raise AssertionError("admitted past the pool")
        assert g.quotas.pool_in_flight() == 1 and g.quotas.in_flight("b") == 0
    assert g.quotas.pool_in_flight() == 0
    async with g.tenant("b"):
        assert g.quotas.pool_in_flight() == 1


async def test_a_slot_taken_for_a_request_admitted_elsewhere_counts_in_the_pool() -> None:
    policy = Policy(default_quota=TenantQuota(max_concurrency=2))
    quotas = LocalQuotas(policy.quota)
    held = [quotas.take_slot("x"), quotas.take_slot("y"), quotas.take_slot("z")]
    assert quotas.pool_in_flight() == 3  # past the limit: it counts what runs
    assert quotas.admit_now("w") is ragguard.pipeline.WAIT
    for lease in held:
        quotas.give_slot(lease)
    assert quotas.pool_in_flight() == 0
    assert quotas.admit_now("w") not in (None, ragguard.pipeline.WAIT)


async def test_pool_for_can_be_given_explicitly() -> None:
    pool = PoolQuota(max_concurrency=1)
    quotas = LocalQuotas(lambda t: TenantQuota(max_concurrency=3),
                         pool_for=lambda t: pool if t.startswith("guest") else None)
    first: Any = quotas.admit_now("guest1")
    assert first is not None and quotas.admit_now("guest2") is ragguard.pipeline.WAIT
    assert quotas.admit_now("member") not in (None, ragguard.pipeline.WAIT)
    quotas.release(first)
    assert quotas.admit_now("guest2") not in (None, ragguard.pipeline.WAIT)


def test_the_pool_is_configured_in_the_policy_file(tmp_path: Any) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("default_quota: {max_concurrency: 2}\n"
                    "unlisted_pool: {max_concurrency: 8, rate_per_s: 20}\n")
    policy = Policy.from_file(path)
    assert policy.pool("anyone") == PoolQuota(max_concurrency=8, rate_per_s=20)
    with pytest.raises(ConfigError) as info:
        Policy.parse({"unlisted_pool": {"max_concurrency": 0}})
    assert info.value.field == "unlisted_pool.max_concurrency"
    with pytest.raises(ConfigError) as info:
        Policy.parse({"unlisted_pool": {"timeout_s": 3}})  # a pool has no per-request fields
    assert info.value.field == "unlisted_pool.timeout_s"


def test_the_default_pool_is_the_default_quota() -> None:
    policy = Policy(tenants={"acme": TenantQuota(max_concurrency=9)},
                    default_quota=TenantQuota(max_concurrency=2, rate_per_s=5, burst=3, timeout_s=1))
    assert policy.pool("x") == PoolQuota(max_concurrency=2, rate_per_s=5, burst=3)
    assert policy.pool("x") is policy.pool("y")  # one pool for all of them
    assert policy.pool("acme") is None
    assert Policy().pool("x") is None  # nothing limited: nothing to share


async def test_calls_outside_a_request_count_in_the_pool_too() -> None:
    """A guarded call made outside any ``tenant(...)`` block is a request of the default tenant, an
    unlisted one: it shares the pool, even when the default quota itself limits nothing."""
    g = Guard(Policy(unlisted_pool=PoolQuota(max_concurrency=1)))
    inside = anyio.Event()
    leave = anyio.Event()

    @g.guard("search")
    async def search() -> str:
        inside.set()
        await leave.wait()
        return "hits"

    async with anyio.create_task_group() as tg:
        tg.start_soon(search)
        await inside.wait()
        with pytest.raises(QuotaExceeded):
            async with g.tenant("guest"):
                pass
        leave.set()
    assert g.quotas.pool_in_flight() == 0
