"""Issue 11, scenarios 1 and 4: the shared breaker at half-open under a crowd, a full client pool,
cancellation and lost replies, against a real redis-server (and a fault proxy for the replies).

1. At most ``half_open_permits`` trials fleet-wide, whatever the crowd and the pool size; the
   client's own pool exhaustion is backpressure, not an outage; local fallback starts from the
   last shared state (open stays open).
4. A trial permit granted to a caller that was cancelled, to a reply that came too late, or to the
   background prefetch comes back at once, not after ``trial_lease_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from distributed_helpers import breaker_policy, evalsha_calls, make_client, until

from ragguard import BreakerOpen, BreakerState, CircuitBreaker, FakeClock, Guard
from ragguard.redis import RedisBackend, SharedCircuitBreaker, SharedStateDegraded

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

OPEN, HALF_OPEN, CLOSED = BreakerState.OPEN, BreakerState.HALF_OPEN, BreakerState.CLOSED


class Dependency:
    """A dependency that is down: counts the calls that reach it."""

    def __init__(self) -> None:
        self.reached = 0

    async def search(self) -> str:
        self.reached += 1
        await asyncio.sleep(0.05)
        raise ConnectionRefusedError("still down")


async def tripped_guard(client: Any, dependency: Dependency, prefix: str = "crowd") -> tuple[Guard, Any]:
    g = Guard(breaker_policy("search", minimum_calls=4, window_size=4, half_open_permits=2, open_for_s=0.3),
              backend=RedisBackend(client, prefix=prefix))
    guarded = g.guard("search")(dependency.search)
    await g.breaker("search").start()
    for _ in range(4):
        with pytest.raises(ConnectionRefusedError):
            await guarded()
    await g.breaker("search").refresh()
    assert g.breaker("search").state is OPEN
    return g, guarded


@pytest.mark.parametrize(("crowd", "pool"), [(100, 64), (200, 64), (2000, 4096)])
async def test_a_crowd_at_half_open_sends_at_most_the_permitted_trials(
    redis_server: Any, seen: list[Any], crowd: int, pool: int
) -> None:
    client = make_client(redis_server.host, redis_server.port, max_connections=pool)
    dependency = Dependency()
    g, guarded = await tripped_guard(client, dependency)
    try:
        breaker = g.breaker("search")
        dependency.reached = 0
        await asyncio.sleep(0.35)  # open_for_s elapsed: the next callers find it half-open
        before = await evalsha_calls(client)
        results = await asyncio.gather(*(guarded() for _ in range(crowd)), return_exceptions=True)
        scripts = await evalsha_calls(client) - before

        assert dependency.reached <= 2  # half_open_permits, however many came
        assert all(isinstance(r, (ConnectionRefusedError, BreakerOpen)) for r in results), results[:3]
        assert breaker.shared and not [e for e in seen if isinstance(e, SharedStateDegraded)]
        assert scripts <= 10, scripts  # the crowd's round trips were coalesced, not one per caller
    finally:
        await g.aclose()
        await client.aclose()


async def test_two_replicas_crowding_share_the_permits(redis_server: Any) -> None:
    clients = [make_client(redis_server.host, redis_server.port, max_connections=64) for _ in range(2)]
    dependency = Dependency()
    a, guarded_a = await tripped_guard(clients[0], dependency, "pair")
    b = Guard(breaker_policy("search", minimum_calls=4, window_size=4, half_open_permits=2, open_for_s=0.3),
              backend=RedisBackend(clients[1], prefix="pair"))
    guarded_b = b.guard("search")(dependency.search)
    try:
        await b.breaker("search").start()
        assert b.breaker("search").state is OPEN  # a's trip, read from Redis
        dependency.reached = 0
        await asyncio.sleep(0.35)
        await asyncio.gather(*(g() for _ in range(150) for g in (guarded_a, guarded_b)),
                             return_exceptions=True)
        assert dependency.reached <= 2
    finally:
        await a.aclose()
        await b.aclose()
        for c in clients:
            await c.aclose()


async def test_a_full_client_pool_is_backpressure_not_an_outage(redis_server: Any, seen: list[Any]) -> None:
    # socket_timeout: the application's blocking pops below wait for as long as the test needs
    client = make_client(redis_server.host, redis_server.port, max_connections=4, socket_timeout=10)
    hog = make_client(redis_server.host, redis_server.port)
    dependency = Dependency()
    g, guarded = await tripped_guard(client, dependency, "pool")
    breaker = g.breaker("search")
    try:
        await asyncio.sleep(0.35)
        # the application takes every connection of the shared pool (blocking pops, held until the
        # test pushes: a loaded machine cannot end them before the crowd has been refused)
        blockers = [asyncio.create_task(client.blpop(["pool-held"], timeout=0)) for _ in range(4)]
        assert await until(lambda: len(client.connection_pool._in_use_connections) == 4, 5.0) < 5.0
        dependency.reached = 0
        results = await asyncio.gather(*(guarded() for _ in range(50)), return_exceptions=True)
        assert dependency.reached == 0  # no permit could be fetched: every caller was refused
        assert all(isinstance(r, BreakerOpen) for r in results)
        for _ in range(3):
            await breaker.refresh()  # syncs find no connection either ...
        assert breaker.shared  # ... and that is not an outage
        assert not [e for e in seen if isinstance(e, SharedStateDegraded)]
        await hog.rpush("pool-held", *["go"] * len(blockers))
        await asyncio.gather(*blockers)
        await asyncio.gather(*(guarded() for _ in range(50)), return_exceptions=True)
        assert dependency.reached <= 2  # the pool is back: the trials run, and only they
    finally:
        await g.aclose()
        await client.aclose()
        await hog.aclose()


def shared(client: Any, clock: FakeClock, **options: Any) -> SharedCircuitBreaker:
    kw = {k: options.pop(k) for k in list(options) if k in {"redis_timeout_s", "probe_every_s",
                                                             "trial_lease_s"}}
    kw.setdefault("staleness_s", 2.0)
    base = dict(minimum_calls=4, window_size=4, half_open_permits=2, open_for_s=5.0)
    return SharedCircuitBreaker(CircuitBreaker("search", **{**base, **options}), client, clock=clock,
                                probe_every_s=kw.pop("probe_every_s", 60.0), **kw)


async def trip(b: SharedCircuitBreaker) -> None:
    from ragguard.redis import _scripts

    for name in _scripts.__all__:  # loaded now: a first EVALSHA would cost a NOSCRIPT round trip more
        await b._link.redis.script_load(getattr(_scripts, name))
    for _ in range(4):
        b.on_result(b.acquire(), 0.01, ConnectionRefusedError("down"))
    await b.refresh()
    assert b.state is OPEN


async def test_local_fallback_starts_from_the_last_shared_state(redis_server: Any,
                                                                fake_clock: FakeClock) -> None:
    client = make_client(redis_server.host, redis_server.port)
    b = await shared(client, fake_clock, open_backoff_multiplier=2.0).start()
    try:
        await trip(b)
        fake_clock.advance(1.0)
        redis_server.stop()
        await b.refresh()
        await b.refresh()  # two failed syncs: the link gives up on Redis
        assert not b.shared
        with pytest.raises(BreakerOpen) as info:  # open stays open, for the time that was left
            b.acquire()
        assert info.value.retry_after_s == pytest.approx(4.0)
        assert b.state is OPEN and b.retry_after_s == pytest.approx(4.0)

        fake_clock.advance(4.0)  # then half-open, locally: half_open_permits trials, no more
        admitted = []
        for _ in range(10):
            try:
                admitted.append(b.acquire())
            except BreakerOpen as exc:
                assert exc.state == "half_open"
        assert len(admitted) == 2 and b.state is HALF_OPEN
        for token in admitted:
            b.on_result(token, 0.01, ConnectionRefusedError("still down"))
        assert b.state is OPEN and b.retry_after_s == pytest.approx(10.0)  # open_for_s x multiplier

        fake_clock.advance(10.0)
        trials = [b.acquire(), b.acquire()]
        for token in trials:
            b.on_result(token, 0.01, None)
        assert b.state is CLOSED  # the trials passed: the wrapped breaker decides from here
        b.on_result(b.acquire(), 0.01, None)
    finally:
        await b.aclose()
        await client.aclose()


@contextlib.asynccontextmanager
async def half_open_behind_a_proxy(
    redis_server: Any, fault_proxy: Any, clock: FakeClock, latency_s: float, **a_options: Any
) -> AsyncIterator[tuple[Any, SharedCircuitBreaker, SharedCircuitBreaker, Any]]:
    """Replica ``a`` reaches Redis through a fault proxy, ``b`` directly (one trial permit each);
    ``b`` trips the breaker, its open time passes, ``a`` reads that, and then ``a``'s replies come
    ``latency_s`` late. Yields (proxy, a, b, the direct client) and closes all of it."""
    proxy = fault_proxy(redis_server)
    slow = make_client(proxy.host, proxy.port, socket_timeout=2.0)
    direct = make_client(redis_server.host, redis_server.port)
    a = await shared(slow, clock, half_open_permits=1, **a_options).start()
    b = await shared(direct, clock, half_open_permits=1).start()
    try:
        await trip(b)
        clock.advance(5.0)
        await a.refresh()
        proxy.set_latency(to_client_s=latency_s)
        yield proxy, a, b, direct
    finally:
        await a.aclose()
        await b.aclose()
        await slow.aclose()
        await direct.aclose()


async def b_gets_the_permit_within(b: SharedCircuitBreaker, limit_s: float) -> float:
    got: list[Any] = []

    async def try_b() -> None:
        if not got:
            try:
                got.append(await b.acquire_async())
            except BreakerOpen:
                await b.refresh()

    return await until(lambda: bool(got), limit_s, try_b)


async def test_a_cancelled_half_open_wait_gives_its_permit_back(
    redis_server: Any, fault_proxy: Any, fake_clock: FakeClock
) -> None:
    async with half_open_behind_a_proxy(
        redis_server, fault_proxy, fake_clock, 0.3, redis_timeout_s=1.0
    ) as (proxy, a, b, direct):
        waiter = asyncio.create_task(a.acquire_async())
        await asyncio.sleep(0.15)  # the script ran in Redis (the permit is granted) ...
        assert await direct.zcard(b.keys[2]) == 1
        waiter.cancel()  # ... and the caller goes away before the reply arrives
        with pytest.raises(asyncio.CancelledError):
            await waiter
        proxy.heal()
        assert await b_gets_the_permit_within(b, 2.0) < 1.5  # not trial_lease_s (10 s)


async def test_a_reply_slower_than_the_timeout_gives_its_permit_back(
    redis_server: Any, fault_proxy: Any, fake_clock: FakeClock
) -> None:
    # two slow replies take a's link off Redis; its probe (every 0.3 s) brings it back after the heal
    async with half_open_behind_a_proxy(
        redis_server, fault_proxy, fake_clock, 0.4, redis_timeout_s=0.2, probe_every_s=0.3
    ) as (proxy, a, b, direct):
        with pytest.raises(BreakerOpen):
            await a.acquire_async()  # granted in Redis, but the reply outlasts redis_timeout_s
        assert await direct.zcard(b.keys[2]) == 1
        await asyncio.sleep(0.5)
        proxy.heal()
        assert await b_gets_the_permit_within(b, 2.0) < 1.5  # not trial_lease_s (10 s)


async def test_a_background_prefetch_cut_short_gives_its_permit_back(
    redis_server: Any, fault_proxy: Any, fake_clock: FakeClock
) -> None:
    async with half_open_behind_a_proxy(
        redis_server, fault_proxy, fake_clock, 0.3, redis_timeout_s=1.0
    ) as (proxy, a, b, _direct):
        with pytest.raises(BreakerOpen):
            a.acquire()  # a synchronous caller: a permit is fetched in the background for the next
        await asyncio.sleep(0.45)  # the permit is granted in Redis, its reply on the way ...
        await a.aclose()  # ... when the replica shuts down
        proxy.heal()
        assert await b_gets_the_permit_within(b, 2.0) < 1.5
