"""RedisQuotas against a real redis-server: one tenant quota held across replicas (instances)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from distributed_helpers import PATIENT_S, leases_in

from ragguard import ConfigError, FakeClock, Guard, InvalidInput, Policy, QuotaExceeded, TenantQuota, deadline
from ragguard.redis import RedisQuotas
from ragguard.redis._keys import quota_keys
from ragguard.redis._quotas import SharedLease

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


def replicas(client: Any, quota: TenantQuota, n: int = 2, **options: Any) -> list[RedisQuotas]:
    options.setdefault("redis_timeout_s", PATIENT_S)  # no test here is about a slow Redis
    return [RedisQuotas(lambda t: quota, client, holder_id=f"r{i}", **options) for i in range(n)]


async def close_all(rs: list[RedisQuotas]) -> None:
    for r in rs:
        await r.aclose()


async def settled(client: Any, key: str, expected: int) -> int:
    """The leases in ``key`` once the background releases have landed (bounded wait)."""
    for _ in range(100):
        n = await leases_in(client, key)
        if n == expected:
            return n
        await asyncio.sleep(0.01)
    return await leases_in(client, key)


async def test_concurrency_is_held_across_replicas(client: Any) -> None:
    a, b = rs = replicas(client, TenantQuota(max_concurrency=2))
    try:
        la = await a.acquire("acme")
        lb = await b.acquire("acme")
        assert isinstance(la, SharedLease) and isinstance(lb, SharedLease)
        with pytest.raises(QuotaExceeded) as info:
            await a.acquire("acme")
        assert info.value.reason == "concurrency" and info.value.tenant == "acme"
        assert await client.zrange(quota_keys("acme")[0], 0, -1) == [b"r0:0", b"r1:0"]
        b.release(lb)
        b.release(lb)  # idempotent
        await settled(client, quota_keys("acme")[0], 1)
        assert await a.acquire("acme") is not None
        assert await b.acquire("other") is not None  # another tenant has its own slots
    finally:
        await close_all(rs)


async def test_a_crashed_replicas_slots_come_back(client: Any, fake_clock: FakeClock) -> None:
    crashed, alive = rs = replicas(client, TenantQuota(max_concurrency=1), lease_s=5.0, clock=fake_clock)
    try:
        await crashed.acquire("acme")  # never released: the replica "dies"
        with pytest.raises(QuotaExceeded):
            await alive.acquire("acme")
        fake_clock.advance(5.01)
        assert await alive.acquire("acme") is not None
    finally:
        await close_all(rs)


async def test_live_leases_are_renewed(client: Any) -> None:
    a, b = rs = replicas(client, TenantQuota(max_concurrency=1), lease_s=0.3)
    try:
        lease = await a.acquire("acme")
        await asyncio.sleep(0.6)  # twice the lease: only the renewals keep the slot
        with pytest.raises(QuotaExceeded):
            await b.acquire("acme")
        a.release(lease)
        await settled(client, quota_keys("acme")[0], 0)
        assert await b.acquire("acme") is not None
    finally:
        await close_all(rs)


async def test_rate_is_gcra_across_replicas(client: Any, fake_clock: FakeClock) -> None:
    a, b = rs = replicas(client, TenantQuota(rate_per_s=10.0, burst=2), clock=fake_clock)
    try:
        assert await a.acquire("acme") is not None
        assert await b.acquire("acme") is not None
        with pytest.raises(QuotaExceeded) as info:
            await a.acquire("acme")
        assert info.value.reason == "rate"
        assert info.value.retry_after_s == pytest.approx(0.1)
        fake_clock.advance(0.1)
        assert await b.acquire("acme") is not None
        with pytest.raises(QuotaExceeded):
            await b.acquire("acme")
    finally:
        await close_all(rs)


async def test_a_rate_reservation_within_max_wait_is_slept_off(client: Any, fake_clock: FakeClock) -> None:
    # The quota's time stands still (a fake clock), so the second call's reservation is exactly
    # one interval (50 ms) ahead however long the machine takes between the calls; what it sleeps
    # is real time. (With Redis's clock, a loaded machine's delay between the calls shrank the
    # reservation below the bound; a timed-out command sent the call to the local fallback.)
    quota = TenantQuota(rate_per_s=20.0, burst=1, max_wait_s=1.0)
    (a,) = rs = replicas(client, quota, n=1, clock=fake_clock)
    try:
        loop = asyncio.get_running_loop()
        await a.acquire("acme")
        t0 = loop.time()
        await a.acquire("acme")
        assert 0.045 <= loop.time() - t0 < quota.max_wait_s  # the reservation, not the whole wait
        assert a.shared
    finally:
        await close_all(rs)


async def test_a_concurrency_waiter_is_admitted_when_a_slot_frees(client: Any) -> None:
    a, b = rs = replicas(client, TenantQuota(max_concurrency=1, max_wait_s=2.0))
    try:
        held = await a.acquire("acme")
        loop = asyncio.get_running_loop()
        loop.call_later(0.1, a.release, held)
        t0 = loop.time()
        assert await b.acquire("acme") is not None
        assert 0.09 <= loop.time() - t0 < 1.5
    finally:
        await close_all(rs)


async def test_a_cancelled_wait_releases_its_slot_and_rate(client: Any, fake_clock: FakeClock) -> None:
    quota = TenantQuota(max_concurrency=5, rate_per_s=2.0, burst=1, max_wait_s=5.0)
    (a,) = rs = replicas(client, quota, n=1, clock=fake_clock)
    try:
        await a.acquire("acme")
        task = asyncio.create_task(a.acquire("acme"))  # reserved 0.5 s ahead: sleeps it off
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        leases = quota_keys("acme")[0]
        assert await settled(client, leases, 1) == 1
        assert await client.zscore(leases, "tat") == pytest.approx(0.5)  # the cancelled call's token refunded
    finally:
        await close_all(rs)


async def test_guard_tenant_admits_through_redis(client: Any) -> None:
    policy = Policy(tenants={"acme": TenantQuota(max_concurrency=1)})
    quotas = RedisQuotas(policy.quota, client)
    g = Guard(policy, quotas=quotas)
    try:
        async with g.tenant("acme"):
            assert await leases_in(client, quota_keys("acme")[0]) == 1
            with pytest.raises(QuotaExceeded):
                async with g.tenant("acme"):
                    pass
        assert await settled(client, quota_keys("acme")[0], 0) == 0
        async with g.tenant("unlisted"):  # default quota: unlimited, nothing in Redis
            assert await client.keys("*") == []
    finally:
        await quotas.aclose()


async def test_bad_input_is_rejected(client: Any) -> None:
    (a,) = rs = replicas(client, TenantQuota(max_concurrency=1), n=1)
    try:
        with pytest.raises(InvalidInput):
            await a.acquire("bad tenant {id}")
    finally:
        await close_all(rs)
    with pytest.raises(ConfigError, match="lease_s"):
        RedisQuotas(lambda t: TenantQuota(), client, lease_s=0)
    with pytest.raises(ConfigError, match="holder_id"):
        RedisQuotas(lambda t: TenantQuota(), client, holder_id="x}")
    with pytest.raises(ConfigError, match="quota_for"):
        RedisQuotas(None, client)  # type: ignore[arg-type]


async def test_a_wait_cut_by_the_deadline_says_what_set_it_across_replicas(client: Any) -> None:
    a, b = rs = replicas(client, TenantQuota(max_concurrency=1, max_wait_s=10.0))
    try:
        held = await a.acquire("acme")
        with pytest.raises(QuotaExceeded) as info:
            with deadline(0.05, set_by="client"):  # b waits for the slot a holds
                await b.acquire("acme")
        error = info.value
        assert (error.reason, error.set_by, error.deadline_s) == ("deadline", "client", 0.05)
        assert "(the request's 0.050s, set by the client)" in str(error)
        a.release(held)
    finally:
        await close_all(rs)
