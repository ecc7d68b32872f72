"""A request admitted through RedisQuotas costs one round trip (its release rides on the tenant's
next admission or goes in the background, never lost); in local-lease mode it costs none: replicas
borrow slots and rate for a short time, and never hold more slots than the limit together.
Real redis-server; round trips counted by the server (INFO commandstats)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from distributed_helpers import PATIENT_S, evalsha_calls, leases_in, make_client, until

from ragguard import QuotaExceeded, TenantQuota
from ragguard.redis import LocalLease, RedisQuotas
from ragguard.redis._keys import quota_keys

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

QUOTA = TenantQuota(max_concurrency=5, rate_per_s=1e6, burst=1000)


async def test_a_request_costs_one_round_trip(client: Any) -> None:
    q = RedisQuotas(lambda t: QUOTA, client, redis_timeout_s=PATIENT_S)
    try:
        q.release(await q.acquire("acme"))  # scripts loaded, connection open
        await asyncio.sleep(0.05)
        before = await evalsha_calls(client)
        for _ in range(100):
            q.release(await q.acquire("acme"))
        scripts = await evalsha_calls(client) - before
        # one script per request (the old way took two); a release sends one of its own only if no
        # admission came to carry it within release_delay_s (a stall of the loop, on a busy machine)
        assert 100 <= scripts <= 105, scripts
        assert await until(lambda: q.pending_releases() == 0, 1.0) < 1.0  # the last one, too
        assert await leases_in(client, quota_keys("acme")[0]) == 0
    finally:
        await q.aclose()


async def test_local_lease_admits_without_a_round_trip(client: Any) -> None:
    q = RedisQuotas(lambda t: QUOTA, client, local_lease=LocalLease(period_s=0.5), redis_timeout_s=PATIENT_S)
    try:
        first = await q.acquire("acme")  # the first request waits for the first share
        q.release(first)
        before = await evalsha_calls(client)
        for _ in range(200):
            q.release(await q.acquire("acme"))
        assert await evalsha_calls(client) - before <= 2  # renewals only (one per 0.5 s)
        held = [await q.acquire("acme") for _ in range(5)]
        with pytest.raises(QuotaExceeded) as info:  # the replica's slots, one replica: all five
            await q.acquire("acme")
        assert info.value.reason == "concurrency"
        assert await leases_in(client, quota_keys("acme")[0]) == 5  # the borrowed slots are leases
        for lease in held:
            q.release(lease)
    finally:
        await q.aclose()


async def test_replicas_in_local_lease_mode_never_hold_more_slots_than_the_limit(redis_server: Any) -> None:
    clients = [make_client(redis_server.host, redis_server.port) for _ in range(3)]
    quota = TenantQuota(max_concurrency=4, rate_per_s=1000.0, burst=100)
    replicas = [RedisQuotas(lambda t: quota, c, holder_id=f"r{i}", local_lease=LocalLease(period_s=0.1))
                for i, c in enumerate(clients)]
    running = 0
    peak = 0
    slots_seen: list[int] = []

    async def caller(q: RedisQuotas) -> None:
        nonlocal running, peak
        for _ in range(40):
            try:
                lease = await q.acquire("acme")
            except QuotaExceeded:
                await asyncio.sleep(0.005)
                continue
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.01)
            running -= 1
            q.release(lease)

    async def watch() -> None:
        for _ in range(40):
            slots_seen.append(int(await leases_in(clients[0], quota_keys("acme")[0])))
            await asyncio.sleep(0.02)

    try:
        await asyncio.gather(watch(), *(caller(q) for q in replicas for _ in range(4)))
        assert peak <= 4
        assert max(slots_seen) <= 4  # the slots borrowed by all replicas together
        assert sum(1 for n in slots_seen if n > 0) > 10  # they were borrowed
    finally:
        for q in replicas:
            await q.aclose()
        for c in clients:
            await c.aclose()


async def test_a_replica_cut_off_from_redis_gives_up_its_share(redis_server: Any, fault_proxy: Any) -> None:
    proxy = fault_proxy(redis_server)
    client = make_client(proxy.host, proxy.port)
    lease_mode = LocalLease(period_s=0.1)
    q = RedisQuotas(lambda t: QUOTA, client, local_lease=lease_mode, probe_every_s=60.0)
    try:
        q.release(await q.acquire("acme"))
        assert lease_mode.covers("acme")
        proxy.stop()  # renewals fail from now on
        assert await until(lambda: not lease_mode.covers("acme"), 1.0) < 1.0  # after two periods
        lease = await q.acquire("acme")  # the ordinary path: Redis fails, the fallback admits
        assert lease is not None and not q.shared
        q.release(lease)
    finally:
        await q.aclose()
        await client.aclose()
