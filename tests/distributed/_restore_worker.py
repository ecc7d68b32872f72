"""One replica of the restore test (test_restore_bound.py), run in its own OS process (spawn).

Its callers admit requests of one tenant through ``RedisQuotas``, hold each a few tens of
milliseconds and count every call that really runs in memory shared by the three processes (so
the count survives Redis restarting). Under the same lock each replica records:

* the global number of calls in flight and its peak; the peak of its own;
* whether it is on shared state (``SharedStateDegraded`` / ``SharedStateRestored`` flip a flag,
  and a counter of flips);
* for every admission Redis granted while every replica was on shared state from the moment the
  caller asked to the moment it got the slot (no flip in between), the global in flight once it
  runs: what "no over-admission once every replica is back on shared state" bounds.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ragguard import QuotaExceeded, TenantQuota, events
from ragguard.redis import RedisQuotas, SharedStateDegraded, SharedStateRestored

TENANT = "acme"
LIMIT = 5
QUOTA = TenantQuota(max_concurrency=LIMIT, max_wait_s=0.2)  # waiting: the fallback queues too
CALLERS = 12

# Indices into the shared array (replicas = n): the global count, its peak, the peak at admissions
# with every replica shared, the number of such admissions, flips, then per replica: in flight,
# peak, shared flag, admissions through Redis, admissions by the fallback.
IN_FLIGHT, PEAK, PEAK_SHARED, SHARED_ADMISSIONS, FLIPS = range(5)


def slot(n: int, what: str, i: int) -> int:
    offsets = {"mine": 0, "mine_peak": 1, "shared": 2, "redis": 3, "local": 4}
    return 5 + offsets[what] * n + i


def size(n: int) -> int:
    return 5 + 5 * n


def run(index: int, n: int, port: int, start_at: float, duration_s: float, lock: Any, arr: Any,
        ready: Any) -> None:
    asyncio.run(_main(index, n, port, start_at, duration_s, lock, arr, ready))


async def _main(index: int, n: int, port: int, start_at: float, duration_s: float, lock: Any, arr: Any,
                ready: Any) -> None:
    rng = random.Random(index)
    client = aredis.Redis(host="127.0.0.1", port=port, socket_timeout=1.0, socket_connect_timeout=0.5,
                          retry=Retry(NoBackoff(), 0), max_connections=64)
    quotas = RedisQuotas(lambda t: QUOTA, client, redis_timeout_s=0.5, probe_every_s=0.2,
                         rng=random.Random(index + 100), holder_id=f"replica{index}")
    me_shared = slot(n, "shared", index)

    def on_event(event: Any) -> None:
        if isinstance(event, (SharedStateDegraded, SharedStateRestored)) and event.component == "quotas":
            with lock:
                arr[me_shared] = 1 if isinstance(event, SharedStateRestored) else 0
                arr[FLIPS] += 1

    events.bus.subscribe(on_event)
    with lock:
        arr[me_shared] = 1
    await client.ping()
    ready.set()
    end = start_at + duration_s
    await asyncio.sleep(max(0.0, start_at - time.time()))

    def all_shared() -> bool:
        return all(arr[slot(n, "shared", j)] for j in range(n))

    async def caller(crng: random.Random) -> None:
        while time.time() < end:
            with lock:
                flips, shared_before = arr[FLIPS], all_shared()
            try:
                lease: Any = await quotas.acquire(TENANT)
            except QuotaExceeded:
                await asyncio.sleep(crng.uniform(0.005, 0.02))
                continue
            with lock:
                arr[IN_FLIGHT] += 1
                arr[slot(n, "mine", index)] += 1
                arr[PEAK] = max(arr[PEAK], arr[IN_FLIGHT])
                mine = arr[slot(n, "mine", index)]
                arr[slot(n, "mine_peak", index)] = max(arr[slot(n, "mine_peak", index)], mine)
                arr[slot(n, "redis" if lease.shared else "local", index)] += 1
                if lease.shared and shared_before and flips == arr[FLIPS] and all_shared():
                    arr[SHARED_ADMISSIONS] += 1
                    arr[PEAK_SHARED] = max(arr[PEAK_SHARED], arr[IN_FLIGHT])
            try:
                await asyncio.sleep(crng.uniform(0.02, 0.08))
            finally:
                with lock:
                    arr[IN_FLIGHT] -= 1
                    arr[slot(n, "mine", index)] -= 1
                quotas.release(lease)

    await asyncio.gather(*(caller(random.Random(rng.random())) for _ in range(CALLERS)))
    await quotas.aclose()
    await client.aclose()
