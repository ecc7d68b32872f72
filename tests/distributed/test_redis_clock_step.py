"""Issue 21, item 10: what a step of the Redis host's own clock does (docs/distributed.md, "Time").

Every shared time is computed in the scripts from one clock: the Redis server's ``TIME``, or the
``clock=`` given to every replica in its place (the scripts take ``now`` from it exactly where they
would call ``TIME``). A step of that clock moves the shared times for every replica at once, while
each replica's own countdowns run on its local clock. The Redis host's clock itself cannot be
stepped here: that needs root and would step the clock of every session on the machine, and
libfaketime (which would step one process only) crashes Debian's redis-server at start (its
jemalloc calls clock_gettime during libfaketime's initialisation). So the replicas here share a
``FakeClock`` as ``clock=`` (standing for TIME) and keep a local clock that never steps, as an NTP
step of the Redis host leaves the replicas' clocks alone. (A step of a replica's own wall clock
changes nothing: tests/distributed/test_wall_clock.py.)
"""

from __future__ import annotations

from typing import Any

import pytest
from distributed_helpers import BREAKER_PATIENT_S, PATIENT_S, leases_in, until

from ragguard import BreakerOpen, BreakerState, CircuitBreaker, FakeClock, QuotaExceeded, TenantQuota
from ragguard.redis import RedisQuotas, SharedCircuitBreaker
from ragguard.redis._keys import quota_keys

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


def shared_breaker(client: Any, redis_clock: FakeClock) -> SharedCircuitBreaker:
    return SharedCircuitBreaker(CircuitBreaker("search", minimum_calls=2, window_size=2, open_for_s=60.0,
                                               half_open_permits=2),
                                client, redis_timeout_s=BREAKER_PATIENT_S, clock=redis_clock,
                                local_clock=FakeClock(100.0))  # this replica's clock: never steps


async def test_a_step_of_the_redis_clock_moves_open_until_for_every_replica(client: Any) -> None:
    redis_clock = FakeClock(1_000_000.0)
    a = await shared_breaker(client, redis_clock).start()
    b = await shared_breaker(client, redis_clock).start()
    try:
        for _ in range(2):
            a.on_result(a.acquire(), 0.01, ConnectionRefusedError("down"))
        await a.refresh()
        await b.refresh()
        assert a.state is BreakerState.OPEN and b.state is BreakerState.OPEN
        with pytest.raises(BreakerOpen) as info:
            b.acquire()
        assert info.value.retry_after_s == pytest.approx(60.0, abs=2.0)
        redis_clock.advance(120)  # the Redis host's clock jumps two minutes ahead
        await a.refresh()
        await b.refresh()
        tokens = [await a.acquire_async(), await b.acquire_async()]  # half-open on both, 60 s early
        assert all(t is not None for t in tokens)
        for breaker, token in zip((a, b), tokens, strict=True):
            breaker.on_result(token, 0.01, ConnectionRefusedError("still down"))  # the trials fail
        await a.refresh()
        await b.refresh()  # the second result decides ...
        await a.refresh()  # ... and a reads the decision
        assert a.state is BreakerState.OPEN and b.state is BreakerState.OPEN  # reopened for 60 s ...
        redis_clock.now -= 3600  # ... and steps back an hour: open an hour longer, for both
        await a.refresh()
        await b.refresh()
        for breaker in (a, b):
            with pytest.raises(BreakerOpen) as info:
                breaker.acquire()
            assert info.value.retry_after_s == pytest.approx(3660.0, abs=120.0)
    finally:
        for breaker in (a, b):
            await breaker.aclose()


async def test_a_forward_step_past_lease_s_is_repaired_by_the_next_renewal(client: Any) -> None:
    """Every lease expires at once in Redis: another replica may admit past the limit until the
    replica that runs the calls renews them (every lease_s / 3), then it is refused again."""
    redis_clock = FakeClock(1_000_000.0)
    quota = TenantQuota(max_concurrency=3)
    q = RedisQuotas(lambda t: quota, client, lease_s=1.5, clock=redis_clock, redis_timeout_s=PATIENT_S)
    other = RedisQuotas(lambda t: quota, client, lease_s=1.5, clock=redis_clock, redis_timeout_s=PATIENT_S)
    try:
        running = [await q.acquire("acme") for _ in range(3)]
        with pytest.raises(QuotaExceeded):
            await other.acquire("acme")
        redis_clock.advance(10)  # past every lease's expiry
        extra = await other.acquire("acme")  # admitted past the limit: the leases look expired ...
        seen: list[int] = []

        async def count() -> None:
            seen.append(await leases_in(client, quota_keys("acme")[0]))

        assert await until(lambda: seen[-1] == 4, 2.0, count) < 2.0  # ... until the renewal (0.5 s)
        other.release(extra)
        await other._flush_all()
        with pytest.raises(QuotaExceeded):
            await other.acquire("acme")  # the three are counted again
        for lease in running:
            q.release(lease)
    finally:
        await q.aclose()
        await other.aclose()
