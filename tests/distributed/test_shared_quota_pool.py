"""The unlisted tenants' aggregate bound (``Policy.unlisted_pool``) across replicas sharing one real
redis-server: rotating tenant ids cannot multiply the default quota on any replica or across them,
listed tenants are unaffected, a pool larger than the default quota still holds each tenant to its
own quota (two levels in one script), and the fallback keeps the bound per replica while Redis is
away. tests/core/test_quota_pool.py holds the in-memory side.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from typing import Any

import pytest
from distributed_helpers import PATIENT, PATIENT_S, leases_in, make_client

from ragguard import FakeClock, Guard, Policy, PoolQuota, QuotaExceeded, TenantQuota
from ragguard.redis import LocalLease, RedisBackend, RedisQuotas
from ragguard.redis._keys import pool_keys
from ragguard.redis._quotas import SharedLease

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


def replicas(client: Any, policy: Policy, n: int = 3, **options: Any) -> list[Guard]:
    return [Guard(policy, backend=RedisBackend(client, quotas={"redis_timeout_s": PATIENT_S,
                                                                   "holder_id": f"r{i}", **options}))
            for i in range(n)]


async def hold(guards: list[Guard], tenants: list[str]) -> tuple[list[str], contextlib.AsyncExitStack]:
    """One request per tenant, on the replicas in turn, kept open; returns who got in."""
    stack = contextlib.AsyncExitStack()
    admitted: list[str] = []
    for i, t in enumerate(tenants):
        try:
            await stack.enter_async_context(guards[i % len(guards)].tenant(t))
        except QuotaExceeded as exc:
            assert exc.reason == "concurrency" and exc.tenant == t
        else:
            admitted.append(t)
    return admitted, stack


async def close(guards: list[Guard]) -> None:
    for g in guards:
        await g.aclose()


async def test_rotating_ids_across_replicas_share_one_default_quota(client: Any) -> None:
    guards = replicas(client, Policy(tenants={"acme": TenantQuota(max_concurrency=3)},
                                     default_quota=TenantQuota(max_concurrency=2)))
    try:
        admitted, stack = await hold(guards, [f"evil{i}" for i in range(60)] + ["acme"] * 4)
        async with stack:
            assert admitted == ["evil0", "evil1", "acme", "acme", "acme"]  # not 60; acme keeps its 3
            assert await leases_in(client, pool_keys()[0]) == 2
            # the default pool covers the default quota: the pool alone is sent, no key per id
            assert await client.keys(pool_keys(tenant="*")[0]) == []
        for g in guards:
            await g.quotas._flush_all()
        assert await leases_in(client, pool_keys()[0]) == 0
    finally:
        await close(guards)


async def test_a_flush_returns_once_redis_applied_a_release_another_command_is_carrying(
    client: Any, redis_server: Any, fault_proxy: Any
) -> None:
    # The background flusher carries a release over a slow link; a flush of everything (aclose's,
    # the tests') must not count it as sent before Redis acknowledged it.
    proxy = fault_proxy(redis_server)
    slow = make_client(proxy.host, proxy.port, socket_timeout=PATIENT_S, socket_connect_timeout=PATIENT_S)
    policy = Policy(default_quota=TenantQuota(max_concurrency=2))
    q = RedisQuotas(policy.quota, slow, redis_timeout_s=PATIENT_S, release_delay_s=60.0)
    try:
        q.release(await q.acquire("evil0"))
        assert await leases_in(client, pool_keys()[0]) == 1
        proxy.set_latency(to_server_s=0.3)
        carrying = asyncio.create_task(q._flush_all())
        for _ in range(100):  # until the release is on its way (bounded: a few loop turns)
            if not q._outbox.due(math.inf):
                break
            await asyncio.sleep(0)
        assert q.pending_releases() == 1 and not q._outbox.due(math.inf)
        await q._flush_all()
        assert await leases_in(client, pool_keys()[0]) == 0
        await carrying
    finally:
        await q.aclose()
        await slow.aclose()


async def test_a_larger_pool_still_holds_each_tenant_to_its_own_quota(client: Any) -> None:
    policy = Policy(default_quota=TenantQuota(max_concurrency=2), unlisted_pool=PoolQuota(max_concurrency=5))
    guards = replicas(client, policy)
    try:
        admitted, stack = await hold(guards, ["a", "a", "a", "b", "b", "b", "c", "c", "d"])
        async with stack:
            assert admitted == ["a", "a", "b", "b", "c"]  # 2 each, 5 in all, across three replicas
            assert await leases_in(client, pool_keys(tenant="a")[0]) == 2
    finally:
        await close(guards)


async def test_the_pool_bounds_the_rate_of_rotating_ids_across_replicas(client: Any,
                                                                       fake_clock: FakeClock) -> None:
    policy = Policy(default_quota=TenantQuota(rate_per_s=10, burst=2))
    guards = [Guard(policy, backend=RedisBackend(client, **PATIENT), clock=fake_clock) for _ in range(3)]
    admitted: list[float] = []
    try:
        for i in range(150):  # a new id every 10 ms for 1.5 s, on the replicas in turn
            try:
                async with guards[i % 3].tenant(f"id{i}"):
                    admitted.append(fake_clock())
            except QuotaExceeded as exc:
                assert exc.reason == "rate"
            fake_clock.advance(0.01)
        assert 15 <= len(admitted) <= 15 + 2  # 10/s plus the burst, for all of them together
    finally:
        await close(guards)


async def test_a_pool_waiter_on_one_replica_gets_the_slot_another_tenant_frees_on_another(
    client: Any,
) -> None:
    policy = Policy(default_quota=TenantQuota(max_concurrency=1, max_wait_s=3.0),
                    unlisted_pool=PoolQuota(max_concurrency=1))
    a, b = replicas(client, policy, n=2)
    try:
        entered = asyncio.Event()
        leave = asyncio.Event()

        async def first() -> None:
            async with a.tenant("t1"):
                entered.set()
                await leave.wait()

        async def second() -> float:
            async with b.tenant("t2"):
                return asyncio.get_running_loop().time()

        holder = asyncio.create_task(first())
        await entered.wait()
        waiter = asyncio.create_task(second())
        await asyncio.sleep(0.2)
        assert not waiter.done()  # queued in Redis behind the pool's one slot
        released_at = asyncio.get_running_loop().time()
        leave.set()
        await holder
        admitted_at = await asyncio.wait_for(waiter, 3.0)
        assert admitted_at >= released_at
    finally:
        await close([a, b])


async def test_while_redis_is_away_each_replica_holds_the_pool_itself(redis_server: Any,
                                                                     fault_proxy: Any) -> None:
    proxy = fault_proxy(redis_server)
    client = make_client(proxy.host, proxy.port)
    policy = Policy(default_quota=TenantQuota(max_concurrency=2))
    q = RedisQuotas(policy.quota, client, probe_every_s=60.0)
    try:
        running = [await q.acquire("evil0")]  # through Redis
        proxy.stop()
        during: list[Any] = []
        for i in range(1, 20):
            try:
                during.append(await q.acquire(f"evil{i}"))
            except QuotaExceeded:
                pass
        assert not q.shared and len(during) == 1  # the fallback counts the one Redis admitted
        for lease in running + during:
            q.release(lease)
    finally:
        await q.aclose()
        await client.aclose()


async def test_a_cancelled_admission_refunds_the_rate_of_the_tenant_and_the_pool(
    client: Any, fake_clock: FakeClock
) -> None:
    policy = Policy(default_quota=TenantQuota(rate_per_s=1, burst=1, max_wait_s=5),
                    unlisted_pool=PoolQuota(rate_per_s=2, burst=1))
    q = RedisQuotas(policy.quota, client, clock=fake_clock, redis_timeout_s=PATIENT_S)
    try:
        first = await q.acquire("a")
        q.release(first)
        waiting = asyncio.create_task(q.acquire("b"))  # the pool's next token is 0.5 s away
        await asyncio.sleep(0.1)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await q._flush_all()
        pool_tat = await client.zscore(pool_keys()[0], "tat")
        own_tat = await client.zscore(pool_keys(tenant="b")[0], "tat")
        assert (pool_tat, own_tat) == (pytest.approx(0.5), pytest.approx(0.0))  # both tokens refunded
        fake_clock.advance(0.5)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        lease = await q.acquire("c")  # the pool's refunded token is there again: no wait
        assert loop.time() - t0 < 0.3
        q.release(lease)
    finally:
        await q.aclose()


async def test_local_lease_mode_never_covers_a_tenant_in_the_pool(client: Any) -> None:
    policy = Policy(tenants={"acme": TenantQuota(max_concurrency=5)},
                    default_quota=TenantQuota(max_concurrency=1))
    q = RedisQuotas(policy.quota, client, local_lease=LocalLease(period_s=0.2), redis_timeout_s=PATIENT_S)
    try:
        first = await q.acquire("guest1")
        with pytest.raises(QuotaExceeded):
            await q.acquire("guest2")  # the exact path: the pool's one slot is taken
        assert isinstance(first, SharedLease) and first.shared
        q.release(first)
        borrowed = await q.acquire("acme")  # a listed tenant borrows its share
        assert not isinstance(borrowed, SharedLease)
        q.release(borrowed)
    finally:
        await q.aclose()
