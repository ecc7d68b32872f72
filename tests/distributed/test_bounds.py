"""Issue 11, scenario 8: bounds on what Redis failures cost the shared breaker's outcomes, and on
the order in which replicas serve waiting requests. Real redis-server and fault proxy.

* Outcomes recorded before Redis failed are kept and sent when it answers again; a batch whose
  request was lost is sent again, and one whose reply was lost is counted once.
* Requests waiting for a tenant's slot are admitted in arrival order across replicas.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from distributed_helpers import make_client, until

from ragguard import BreakerState, CircuitBreaker, FakeClock, TenantQuota
from ragguard.redis import RedisQuotas, SharedCircuitBreaker

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


def quiet_breaker(client: Any, clock: FakeClock, **options: Any) -> SharedCircuitBreaker:
    """Flushes only when told (refresh), so a test decides when outcomes travel."""
    return SharedCircuitBreaker(CircuitBreaker("search", minimum_calls=4, window_size=4, open_for_s=5.0),
                                client, clock=clock, flush_interval_s=30.0, staleness_s=31.0, **options)


def fail(b: SharedCircuitBreaker, n: int) -> None:
    for _ in range(n):
        b.on_result(b.acquire(), 0.01, ConnectionRefusedError("down"))


async def calls_in_redis(client: Any, b: SharedCircuitBreaker) -> int:
    return int(await client.hget(b.keys[0], "calls") or 0)


async def test_outcomes_recorded_before_a_blip_are_sent_after_it(
    redis_server: Any, fault_proxy: Any, fake_clock: FakeClock
) -> None:
    proxy = fault_proxy(redis_server)
    client = make_client(proxy.host, proxy.port)
    direct = make_client(redis_server.host, redis_server.port)
    b = await quiet_breaker(client, fake_clock, probe_every_s=0.2).start()
    try:
        b.on_result(b.acquire(), 0.01, None)
        await b.refresh()  # the state exists in Redis (closed, one call)
        fail(b, 2)  # batched, not sent yet ...
        proxy.stop()  # ... when Redis goes away (its data stays)
        await b.refresh()
        await b.refresh()
        assert not b.shared
        proxy.restart()
        assert await until(lambda: b.shared, 3.0, b.refresh) < 3.0
        await b.refresh()
        assert await calls_in_redis(direct, b) == 3  # the two were kept and counted
        assert b.state is BreakerState.CLOSED
        fail(b, 1)
        await b.refresh()
        assert b.state is BreakerState.OPEN  # 3 of 4 failed with the new one: over 50%
    finally:
        await b.aclose()
        await client.aclose()
        await direct.aclose()


async def test_a_lost_batch_is_sent_again_and_counted_once(
    redis_server: Any, fault_proxy: Any, fake_clock: FakeClock
) -> None:
    proxy = fault_proxy(redis_server)
    client = make_client(proxy.host, proxy.port, socket_timeout=2.0)
    direct = make_client(redis_server.host, redis_server.port)
    b = await quiet_breaker(client, fake_clock, redis_timeout_s=0.2, probe_every_s=0.2).start()
    try:
        b.on_result(b.acquire(), 0.01, None)
        await b.refresh()
        b.on_result(b.acquire(), 0.01, None)
        proxy.drop()  # the request is lost on the way: the script never runs
        await b.refresh()
        proxy.heal()
        assert await until(lambda: b.shared, 3.0, b.refresh) < 3.0
        await b.refresh()
        assert await calls_in_redis(direct, b) == 2  # sent again

        b.on_result(b.acquire(), 0.01, None)
        proxy.set_latency(to_client_s=0.4)  # the script runs, its reply is lost to the timeout
        await b.refresh()
        counted: list[int] = []

        async def count() -> None:
            counted.append(await calls_in_redis(direct, b))

        await until(lambda: counted[-1] >= 3, 5.0, count)  # the script ran (its reply is lost)
        assert counted[-1] == 3
        proxy.heal()
        assert await until(lambda: b.shared, 3.0, b.refresh) < 3.0
        await b.refresh()
        assert await calls_in_redis(direct, b) == 3  # sent again, counted once
    finally:
        await b.aclose()
        await client.aclose()
        await direct.aclose()


async def test_waiters_across_replicas_are_admitted_in_arrival_order(redis_server: Any) -> None:
    quota = TenantQuota(max_concurrency=1, max_wait_s=5.0)
    clients = [make_client(redis_server.host, redis_server.port) for _ in range(3)]
    replicas = [RedisQuotas(lambda t: quota, c, holder_id=f"r{i}") for i, c in enumerate(clients)]
    order: list[int] = []

    async def waiter(i: int) -> None:
        q = replicas[i % 3]
        lease = await q.acquire("acme")
        order.append(i)
        await asyncio.sleep(0.03)
        q.release(lease)

    try:
        holder = await replicas[0].acquire("acme")
        tasks = []
        for i in range(9):  # arrivals 40 ms apart, round robin over the replicas
            tasks.append(asyncio.create_task(waiter(i)))
            await asyncio.sleep(0.04)
        replicas[0].release(holder)
        await asyncio.wait_for(asyncio.gather(*tasks), 10.0)
        assert order == list(range(9))
    finally:
        for q in replicas:
            await q.aclose()
        for c in clients:
            await c.aclose()
