"""RedisLink's turns (at most ``max_in_flight`` commands in flight, waiters served first come first
served, a cancelled waiter never loses or leaks a turn) and Script (EVALSHA, loaded again after a
NOSCRIPT)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ragguard.redis._link import RedisLink, Script
from ragguard.redis._scripts import QUOTA

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(20)]


class _Client:
    def register_script(self, source: str) -> Any:
        raise AssertionError("not used")


async def test_turns_cap_commands_in_flight_and_serve_waiters_in_order() -> None:
    link = RedisLink(_Client(), "test", timeout_s=5.0, max_in_flight=2)
    gates = [asyncio.Event() for _ in range(6)]
    running: list[int] = []
    peak = 0

    async def command(i: int) -> int:
        nonlocal peak
        running.append(i)
        peak = max(peak, len(running))
        await gates[i].wait()
        running.remove(i)
        return i

    tasks = [asyncio.create_task(link.call(command, i)) for i in range(6)]
    await asyncio.sleep(0.01)
    assert running == [0, 1]  # 2..5 wait for a turn
    tasks[2].cancel()  # a waiter that gives up leaves the queue
    await asyncio.sleep(0)
    gates[0].set()
    await asyncio.sleep(0)  # 0 ends: its turn goes to the oldest waiter left (3)...
    tasks[3].cancel()  # ...which is cancelled before it runs: the turn passes on to 4
    await asyncio.sleep(0.01)
    assert running == [1, 4]
    for gate in gates:
        gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    outcomes = [r if isinstance(r, int) else "cancelled" for r in results]
    assert outcomes == [0, 1, "cancelled", "cancelled", 4, 5]
    assert peak == 2
    assert link._turns._value == 2  # every turn came back
    assert await link.call(command, 5) == 5  # and the link still takes commands at once


async def test_script_is_loaded_again_after_noscript(client: Any) -> None:
    script = Script(client, "return ARGV[1] .. KEYS[1]", 1)
    assert await script(b"k", "v") == b"vk"
    await client.script_flush()  # a restarted or flushed Redis has forgotten every script
    assert await script(b"k", "w") == b"wk"
    admit = Script(client, QUOTA, 3)
    assert admit.sha == (await client.script_load(QUOTA))  # the SHA1 redis-py would send


async def test_the_health_probes_leave_the_components_keys_alone(client: Any) -> None:
    """The probe writes (so that a read-only replica fails it) only to a key of its own."""
    from ragguard import CircuitBreaker, TenantQuota
    from ragguard.redis import RedisQuotas, SharedCircuitBreaker
    from ragguard.redis._keys import quota_keys

    b = SharedCircuitBreaker(CircuitBreaker("probed", minimum_calls=2, window_size=2, open_for_s=60.0),
                             client, redis_timeout_s=0.8)
    q = RedisQuotas(lambda t: TenantQuota(max_concurrency=2, rate_per_s=10.0), client)
    try:
        await b.start(strict=True)
        for _ in range(2):
            b.on_result(b.acquire(), 0.01, ConnectionRefusedError("down"))
        await b.refresh()
        lease = await q.acquire("acme")
        watched = [b.keys[0], quota_keys("acme")[0]]
        before = [await client.pttl(k) for k in watched]
        for _ in range(5):
            await b._link.check()
            await q._link.check()
        after = [await client.pttl(k) for k in watched]
        assert all(t > 1000 for t in after) and all(a <= bb for a, bb in zip(after, before, strict=True))
        assert (await client.hget(b.keys[0], "state")) == b"open"
        q.release(lease)
    finally:
        await b.aclose()
        await q.aclose()
