"""The Redis pool monitor against a real redis-server (through the chaos fault proxy where faults matter)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis
from monitors_helpers import Collected
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MaxConnectionsError

from ragguard import ConfigError, FakeClock
from ragguard.monitors import (
    ConnectionLeak,
    MonitoredBlockingConnectionPool,
    MonitoredConnectionPool,
    PoolExhausted,
)
from ragguard.monitors._pool import monitored_pools

pytestmark = pytest.mark.anyio


async def _settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


@pytest.mark.timeout(30)
async def test_gauges_waiting_histogram_and_exhaustion(redis_server: Any, collected: Collected) -> None:
    pool = MonitoredBlockingConnectionPool(
        host=redis_server.host,
        port=redis_server.port,
        max_connections=3,
        timeout=5,
        wait_threshold_s=0.02,
        bus=collected.bus,
        pool_name="vectors",
    )
    assert pool in monitored_pools()
    held = [await pool.get_connection() for _ in range(3)]
    s = pool.stats()
    assert (s.in_use, s.idle, s.max_connections, s.waiting) == (3, 0, 3, 0)

    waiter = asyncio.create_task(pool.get_connection())
    await asyncio.sleep(0.05)
    assert pool.waiting == 1
    await pool.release(held.pop())
    conn = await asyncio.wait_for(waiter, 2)
    await _settle()
    s = pool.stats()
    assert (s.in_use, s.waiting, s.acquires) == (3, 0, 4)
    assert s.wait_sum_s >= 0.04
    slow_bucket = dict(s.wait_buckets)[0.025]
    assert slow_bucket == 3  # three quick acquires, one of ~50 ms above the 25 ms bound
    assert s.wait_buckets[-1] == (float("inf"), 4)

    reasons = [e.reason for e in collected.of(PoolExhausted)]
    assert reasons.count("headroom") == 1  # edge-triggered: once while it stays short
    assert reasons.count("slow_acquire") == 1
    slow = next(e for e in collected.of(PoolExhausted) if e.reason == "slow_acquire")
    assert slow.pool == "vectors" and slow.wait_s >= 0.04 and slow.at - slow.started_at == slow.wait_s

    for c in [*held, conn]:
        await pool.release(c)
    s = pool.stats()
    assert (s.in_use, s.idle) == (0, 3)
    await pool.aclose()


@pytest.mark.timeout(30)
async def test_blocking_pool_timeout_is_counted(redis_server: Any, collected: Collected) -> None:
    pool = MonitoredBlockingConnectionPool(
        host=redis_server.host, port=redis_server.port, max_connections=1, timeout=0.05, bus=collected.bus
    )
    conn = await pool.get_connection()
    with pytest.raises(RedisConnectionError, match="No connection available"):
        await pool.get_connection()
    await _settle()
    assert pool.stats().acquire_timeouts == 1
    assert pool.waiting == 0
    assert [e.reason for e in collected.of(PoolExhausted)] == ["headroom", "timeout"]
    await pool.release(conn)
    await pool.aclose()


@pytest.mark.timeout(30)
async def test_too_many_connections_is_counted(redis_server: Any, collected: Collected) -> None:
    pool = MonitoredConnectionPool(
        host=redis_server.host, port=redis_server.port, max_connections=2, bus=collected.bus
    )
    client = aioredis.Redis(connection_pool=pool)
    held = [await pool.get_connection() for _ in range(2)]
    with pytest.raises(MaxConnectionsError):
        await client.ping()
    await _settle()
    assert pool.stats().too_many_connections == 1
    assert "too_many_connections" in [e.reason for e in collected.of(PoolExhausted)]
    for c in held:
        await pool.release(c)
    assert await client.ping() is True
    await client.aclose()


async def _leaky_handler(pool: MonitoredConnectionPool) -> Any:
    return await pool.get_connection()  # and never released


@pytest.mark.timeout(30)
@pytest.mark.parametrize("track", [True, False])
async def test_leak_reported_once_with_the_acquiring_stack_when_tracked(
    redis_server: Any, collected: Collected, track: bool
) -> None:
    clock = FakeClock(100.0)
    pool = MonitoredConnectionPool(
        host=redis_server.host,
        port=redis_server.port,
        leak_after_s=5.0,
        track_leaks=track,
        clock=clock,
        bus=collected.bus,
    )
    conn = await _leaky_handler(pool)
    clock.advance(4.0)
    assert pool.check_leaks() == []
    clock.advance(2.0)
    (leak,) = pool.check_leaks()
    assert leak.held_s == pytest.approx(6.0) and leak.acquired_at == 100.0
    if track:
        assert "in _leaky_handler" in leak.stack[0] and __file__ in leak.stack[0]
    else:
        assert leak.stack == ()
    assert pool.check_leaks() == []  # reported once
    await _settle()
    assert collected.of(ConnectionLeak) == [leak]
    assert pool.stats().leaks == 1
    await pool.release(conn)
    await pool.aclose()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("pool_cls", [MonitoredConnectionPool, MonitoredBlockingConnectionPool])
async def test_cancelled_commands_do_not_leak(redis_server: Any, fault_proxy: Any, pool_cls: type) -> None:
    proxy = fault_proxy(redis_server)
    proxy.set_latency(to_client_s=0.1)
    max_connections = 3
    extra = {"timeout": 5} if pool_cls is MonitoredBlockingConnectionPool else {}
    pool = pool_cls(host=proxy.host, port=proxy.port, max_connections=max_connections, **extra)
    client = aioredis.Redis(connection_pool=pool)
    per_round = max_connections * (2 if extra else 1)  # the blocking pool also has callers waiting
    cancelled = 0
    for round_ in range(3):
        tasks = [asyncio.create_task(client.set(f"k{i}", f"stale{i}")) for i in range(per_round)]
        await asyncio.sleep(0.03 + 0.03 * round_)
        assert pool.in_use > 0  # mid-flight
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        cancelled += sum(t.cancelled() for t in tasks)
    assert cancelled > max_connections

    proxy.set_latency()
    await _settle()
    assert (pool.in_use, pool.waiting) == (0, 0)
    for i in range(2 * max_connections):
        assert await client.set(f"fresh{i}", f"v{i}") is True
    replies = await asyncio.gather(*(client.get(f"fresh{i}") for i in range(max_connections)))
    assert replies == [f"v{i}".encode() for i in range(max_connections)]  # each reply to its own command
    assert await client.incr("counter") == 1
    assert pool.in_use == 0
    await client.aclose()


# -- a connection the server dropped is reconnected, not used (issue 13 item 5, redis-py #4252) ----

POOLS = [MonitoredConnectionPool, MonitoredBlockingConnectionPool]


def _pool(pool_cls: type, host: str, port: int, **options: Any) -> Any:
    extra = {"timeout": 5} if pool_cls is MonitoredBlockingConnectionPool else {}
    return pool_cls(host=host, port=port, max_connections=3, **extra, **options)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("health_check_interval", [0, 0.05])
@pytest.mark.parametrize("pool_cls", POOLS)
async def test_an_idle_connection_the_server_killed_is_reconnected(
    redis_server: Any, pool_cls: type, health_check_interval: float
) -> None:
    pool = _pool(pool_cls, redis_server.host, redis_server.port, health_check_interval=health_check_interval)
    client = aioredis.Redis(connection_pool=pool)
    admin = aioredis.Redis(host=redis_server.host, port=redis_server.port)
    assert await client.set("k", "v") is True
    assert pool.idle == 1
    killed = await admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    assert killed == 1
    await asyncio.sleep(0.2)  # the server's FIN has arrived; the connection idles in the pool
    assert await client.get("k") == b"v"  # was: ConnectionError("Connection closed by server.")
    assert (pool.in_use, pool.idle) == (0, 1)
    await client.aclose()
    await admin.aclose()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("pool_cls", POOLS)
async def test_a_failed_health_check_reconnects_instead_of_failing_the_command(
    redis_server: Any, fault_proxy: Any, pool_cls: type
) -> None:
    # A connection reset on the way (no FIN reaches the client, the socket looks fine until
    # written to): only the health-check PING finds out, and redis-py 8.1 does not retry it.
    proxy = fault_proxy(redis_server)
    pool = _pool(pool_cls, proxy.host, proxy.port, health_check_interval=0.05)
    client = aioredis.Redis(connection_pool=pool)
    assert await client.set("k", "v") is True
    proxy.reset(new_connections=False)
    await asyncio.sleep(0.2)
    assert await client.get("k") == b"v"  # was: ConnectionError("Error 104 ... reset by peer")
    assert pool.in_use == 0
    await client.aclose()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("pool_cls", POOLS)
async def test_idle_counts_only_connections_with_an_open_socket(redis_server: Any, pool_cls: type) -> None:
    pool = _pool(pool_cls, redis_server.host, redis_server.port)
    held = [await pool.get_connection() for _ in range(3)]
    for connection in held:
        await pool.release(connection)
    assert (pool.in_use, pool.idle) == (0, 3)
    await pool.disconnect()
    assert (pool.in_use, pool.idle, pool.stats().idle) == (0, 0, 0)  # was 3 with no socket open
    client = aioredis.Redis(connection_pool=pool)
    assert await client.ping() is True
    assert pool.idle == 1
    await client.aclose()


async def test_from_url_and_default_name(redis_server: Any) -> None:
    pool = MonitoredBlockingConnectionPool.from_url(redis_server.url, max_connections=2)
    assert pool.pool_name == f"127.0.0.1:{redis_server.port}/0"
    client = aioredis.Redis(connection_pool=pool)
    assert await client.ping() is True
    assert pool.stats().acquires == 1 and pool.idle == 1
    await client.aclose()


@pytest.mark.parametrize(
    "bad",
    [
        {"wait_threshold_s": 0},
        {"leak_after_s": -1},
        {"pool_name": ""},
        {"clock": 3},
        {"wait_buckets_s": (0.2, 0.1)},
        {"wait_buckets_s": ()},
    ],
)
def test_options_are_validated(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        MonitoredConnectionPool(host="127.0.0.1", port=1, **bad)
