"""The shared breaker and quotas on a real local Redis Cluster (three masters started from the same
redis-server binary, ``redis.asyncio.RedisCluster`` as the client), including a master restarted
mid-run. Every script's keys carry one hash tag: Redis Cluster refuses a script whose keys span
slots (CROSSSLOT), so each script that runs here proves it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from distributed_helpers import BREAKER_PATIENT_S, PATIENT_S, breaker_policy, leases_in, until
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ragguard import BreakerOpen, BreakerState, CircuitBreaker, FakeClock, Guard, QuotaExceeded, TenantQuota
from ragguard.redis import RedisBackend, RedisQuotas, SharedCircuitBreaker
from ragguard.redis._breaker import breaker_keys
from ragguard.redis._keys import quota_keys

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


def cluster_client(cluster: Any) -> RedisCluster:
    # patient timeouts (see PATIENT_S): the outage here is a stopped master, refused at once
    return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in cluster.startup_nodes],
                        socket_timeout=PATIENT_S, socket_connect_timeout=PATIENT_S,
                        retry=Retry(NoBackoff(), 0))


async def slots_of(client: RedisCluster, keys: list[str]) -> set[int]:
    return {int(await client.cluster_keyslot(k)) for k in keys}


def breaker(client: Any, name: str, clock: FakeClock, prefix: str, **options: Any) -> SharedCircuitBreaker:
    options.setdefault("redis_timeout_s", BREAKER_PATIENT_S)
    return SharedCircuitBreaker(CircuitBreaker(name, minimum_calls=2, window_size=2, open_for_s=5.0),
                                client, clock=clock, key_prefix=prefix, **options)


async def test_breakers_and_quotas_run_on_a_cluster_one_slot_each(redis_cluster_session: Any,
                                                                 fake_clock: FakeClock) -> None:
    cluster = redis_cluster_session
    client = cluster_client(cluster)
    names = ["search", "embed", "llm{gpt-4o}", "rerank", "}{"]
    tenants = ["acme", "globex", "initech", "umbrella"]
    breakers = [await breaker(client, n, fake_clock, "t-slots").start() for n in names]
    quotas = RedisQuotas(lambda t: TenantQuota(max_concurrency=2, rate_per_s=100.0), client,
                         key_prefix="t-slots", redis_timeout_s=PATIENT_S)
    try:
        masters = set()
        for b in breakers:
            for _ in range(2):
                b.on_result(b.acquire(), 0.01, ConnectionRefusedError("down"))
            await b.refresh()
            assert b.state is BreakerState.OPEN, b.name  # the scripts ran on the cluster
            slots = await slots_of(client, [*b.keys, b._seq_key])
            assert len(slots) == 1, b.name
            masters.add(cluster.node_of(slots.pop()))
        for tenant in tenants:
            leases = [await quotas.acquire(tenant) for _ in range(2)]
            with pytest.raises(QuotaExceeded):
                await quotas.acquire(tenant)
            for lease in leases:
                quotas.release(lease)
            slots = await slots_of(client, quota_keys(tenant, "t-slots"))
            assert len(slots) == 1, tenant
            masters.add(cluster.node_of(slots.pop()))
        assert masters == {0, 1, 2}  # the keys landed on every master
        assert await until(lambda: quotas.pending_releases() == 0, 2.0) < 2.0
        for tenant in tenants:
            assert await leases_in(client, quota_keys(tenant, "t-slots")[0]) == 0
    finally:
        for b in breakers:
            await b.aclose()
        await quotas.aclose()
        await client.aclose()


async def test_a_crowd_on_a_cluster_sends_at_most_the_permitted_trials(redis_cluster_session: Any) -> None:
    client = cluster_client(redis_cluster_session)
    g = Guard(breaker_policy("search", minimum_calls=4, window_size=4, half_open_permits=2, open_for_s=0.3),
              backend=RedisBackend(client, prefix="t-crowd", breakers={"redis_timeout_s": BREAKER_PATIENT_S},
                                   quotas={"redis_timeout_s": PATIENT_S}))
    reached = 0

    async def search() -> str:
        nonlocal reached
        reached += 1
        await asyncio.sleep(0.05)
        raise ConnectionRefusedError("still down")

    guarded = g.guard("search")(search)
    try:
        await g.breaker("search").start()
        for _ in range(4):
            with pytest.raises(ConnectionRefusedError):
                await guarded()
        await g.breaker("search").refresh()
        assert g.breaker("search").state is BreakerState.OPEN
        reached = 0
        await asyncio.sleep(0.35)
        await asyncio.gather(*(guarded() for _ in range(300)), return_exceptions=True)
        assert reached <= 2
        assert g.breaker("search").shared
    finally:
        await g.aclose()
        await client.aclose()


def on_master(cluster: Any, prefix: str, candidates: list[str], master: int, keys_of: Any) -> str:
    from redis.crc import key_slot

    for name in candidates:
        if cluster.node_of(key_slot(keys_of(name, prefix)[0].encode())) == master:
            return name
    raise AssertionError(f"no candidate lands on master {master}")


async def test_a_master_restarted_mid_run(redis_cluster: Any, fake_clock: FakeClock) -> None:
    cluster = redis_cluster
    prefix = "t-restart"
    names = [f"stage-{i}" for i in range(64)]
    stage = on_master(cluster, prefix, names, 1, breaker_keys)
    tenant = on_master(cluster, prefix, [f"tenant-{i}" for i in range(64)], 1, quota_keys)
    elsewhere = on_master(cluster, prefix, names, 0, breaker_keys)
    clients = [cluster_client(cluster) for _ in range(2)]
    quota = TenantQuota(max_concurrency=3)
    a_quotas, b_quotas = (RedisQuotas(lambda t: quota, c, key_prefix=prefix, probe_every_s=0.2, holder_id=h,
                                      redis_timeout_s=PATIENT_S)
                          for c, h in zip(clients, ("a", "b"), strict=True))
    a_break, b_break = (breaker(c, stage, fake_clock, prefix, probe_every_s=0.2) for c in clients)
    a_other = breaker(clients[0], elsewhere, fake_clock, prefix, probe_every_s=0.2)
    try:
        for b in (a_break, b_break, a_other):
            await b.start()
        running = [await a_quotas.acquire(tenant) for _ in range(2)]
        for _ in range(2):
            a_break.on_result(a_break.acquire(), 0.01, ConnectionRefusedError("down"))
        await a_break.refresh()
        await b_break.refresh()
        assert b_break.state is BreakerState.OPEN

        cluster.stop_node(1)  # the master of the stage's and the tenant's keys goes away
        admitted = []
        for _ in range(4):  # never fails for the outage; the fallback still counts the two running
            try:
                admitted.append(await a_quotas.acquire(tenant))
            except QuotaExceeded:
                pass
        assert len(admitted) == 1 and not a_quotas.shared
        for b in (a_break, b_break):
            await b.refresh()
            await b.refresh()
            assert not b.shared
            with pytest.raises(BreakerOpen):  # open stays open on local state
                b.acquire()
        a_other.on_result(a_other.acquire(), 0.01, None)  # a stage on another master: unaffected
        await a_other.refresh()
        assert a_other.shared

        cluster.start_node(1)  # back, empty
        assert await until(lambda: a_quotas.shared, 10.0) < 10.0
        assert await until(lambda: a_quotas.held() == 3, 3.0) < 3.0  # a's three are in Redis again
        with pytest.raises(QuotaExceeded):
            await b_quotas.acquire(tenant)  # b sees them: 3 of 3
        assert await until(lambda: a_break.shared and b_break.shared, 10.0, a_break.refresh) < 10.0
        await b_break.refresh()
        assert a_break.state is BreakerState.CLOSED and b_break.state is BreakerState.CLOSED  # empty
        for lease in [*running, *admitted]:
            a_quotas.release(lease)
        assert await until(lambda: a_quotas.pending_releases() == 0, 3.0) < 3.0
        assert await leases_in(clients[1], quota_keys(tenant, prefix)[0]) == 0
    finally:
        for b in (a_break, b_break, a_other):
            await b.aclose()
        await a_quotas.aclose()
        await b_quotas.aclose()
        for c in clients:
            await c.aclose()
