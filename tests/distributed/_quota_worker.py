"""One replica of the multi-process quota accuracy test (run as a script by test_quota_accuracy).

Usage: python _quota_worker.py PORT DURATION_S CALLERS SEED
Prints ``ready`` once imported and connected, then reads the start time (wall clock, one line on
stdin: every replica starts together however long the others took to start), runs, and prints
one JSON line: admission times (wall clock), the peak in-flight count seen through a
Redis-side counter, rejections by reason, and whether this replica ever left shared state.

In the last TAIL_S seconds (after the window the rate is measured in) every call holds its slot
for TAIL_HOLD_S: at the admitted rate that wants ~25 slots, so the 10-slot bulkhead is certainly
full and refuses callers, whatever the mix of call lengths before.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from typing import Any

import redis.asyncio as aredis

from ragguard import QuotaExceeded, TenantQuota, events
from ragguard.redis import RedisQuotas, SharedStateDegraded

TENANT = "acme"
QUOTA = TenantQuota(max_concurrency=10, rate_per_s=50.0, burst=5)
IN_FLIGHT = "test:in_flight"
TAIL_S, TAIL_HOLD_S = 0.5, 0.5


async def main(port: int, duration_s: float, callers: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    degraded: list[Any] = []
    events.bus.subscribe(lambda e: degraded.append(e) if isinstance(e, SharedStateDegraded) else None)
    pool = aredis.BlockingConnectionPool(host="127.0.0.1", port=port, max_connections=64, timeout=5.0,
                                         socket_timeout=5.0)
    client = aredis.Redis(connection_pool=pool)
    quotas = RedisQuotas(lambda t: QUOTA, client, redis_timeout_s=2.0, rng=random.Random(seed + 1))
    admitted: list[float] = []
    rejected = {"rate": 0, "concurrency": 0}
    peak = 0
    await client.ping()
    print("ready", flush=True)
    start_at = float(sys.stdin.readline())
    end = start_at + duration_s
    await asyncio.sleep(max(0.0, start_at - time.time()))

    async def caller(crng: random.Random) -> None:
        nonlocal peak
        while time.time() < end:
            try:
                lease = await quotas.acquire(TENANT)
            except QuotaExceeded as exc:
                rejected[exc.reason] += 1
                await asyncio.sleep(crng.uniform(0.2, 0.8))
                continue
            admitted.append(time.time())
            try:
                peak = max(peak, int(await client.incr(IN_FLIGHT)))
                # while the rate is measured: mostly short calls, a quarter longer ones, 2 in
                # flight on average (50 x 0.04 s): 10 slots carry 250/s, and still more than the
                # rate when a loaded machine stretches every call by 0.1 s (its loop's lag, the
                # release's trip), so a full bulkhead does not waste rate tokens; then the tail
                # fills the bulkhead for certain
                if time.time() >= end - TAIL_S:
                    hold_s = TAIL_HOLD_S
                else:
                    hold_s = 0.1 if crng.random() < 0.25 else 0.02
                await asyncio.sleep(hold_s)
                await client.decr(IN_FLIGHT)
            finally:
                quotas.release(lease)

    await asyncio.gather(*(caller(random.Random(rng.random())) for _ in range(callers)))
    await quotas.aclose()
    await client.aclose()
    return {"admitted": admitted, "peak": peak, "rejected": rejected, "degraded": len(degraded)}


if __name__ == "__main__":
    port, duration_s, callers, seed = sys.argv[1:5]
    result = asyncio.run(main(int(port), float(duration_s), int(callers), int(seed)))
    print(json.dumps(result))
