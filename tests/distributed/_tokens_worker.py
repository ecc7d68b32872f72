"""One replica of the multi-process token accuracy test (run as a script by test_tokens_accuracy).

Usage: python _tokens_worker.py PORT DURATION_S STREAMS SEED
Prints ``ready`` once imported and connected, then reads the start time (wall clock, one line on
stdin), runs for DURATION_S and prints one JSON line:

- ``quota``: (wall time the stream was admitted, tokens it used) for each stream of tenant
  ``metered`` (token_quota QUOTA per WINDOW_S; each stream reserves ESTIMATE and uses 10..ESTIMATE
  tokens, one per item), and how many reservations were refused;
- ``paced``: the wall time of every token handed over to a reader of tenant ``paced``
  (tokens_per_s PACE_PER_S, burst PACE_BURST; no quota);
- ``degraded``: how many times this replica left shared state (0: measured on Redis);
- ``lag_s``: the longest the event loop was late to wake a 5 ms sleep (a loaded machine): tokens
  whose wait ended meanwhile reach their readers together when it wakes.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from contextlib import aclosing
from pathlib import Path
from typing import Any

import redis.asyncio as aredis

from ragguard import Guard, Policy, QuotaExceeded, StagePolicy, TenantQuota, events
from ragguard.redis import RedisBackend, SharedStateDegraded

sys.path.insert(0, str(Path(__file__).parent))
from _replica import Lag, started

QUOTA, WINDOW_S, ESTIMATE = 300, 1.0, 30
PACE_PER_S, PACE_BURST = 200.0, 20
POLICY = Policy(
    stages={"answer": StagePolicy(preset="generation")},
    tenants={
        "metered": TenantQuota(token_quota=QUOTA, token_window_s=WINDOW_S, max_wait_s=0.05),
        "paced": TenantQuota(tokens_per_s=PACE_PER_S, token_burst=PACE_BURST),
    },
)


async def main(port: int, duration_s: float, streams: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    degraded: list[Any] = []
    events.bus.subscribe(lambda e: degraded.append(e) if isinstance(e, SharedStateDegraded) else None)
    client = aredis.Redis(host="127.0.0.1", port=port, socket_timeout=5.0, max_connections=64)
    g = Guard(POLICY, backend=RedisBackend(client, tokens={"redis_timeout_s": 2.0}))

    @g.guard("answer", estimate=ESTIMATE, tokens=lambda item: 1)
    async def answer(n: int) -> Any:
        for _ in range(n):
            await asyncio.sleep(0.001)  # the model's time per token
            yield "t"

    quota: list[tuple[float, int]] = []
    paced: list[float] = []
    refused = 0
    end = await started(client) + duration_s

    async def metered(srng: random.Random) -> None:
        nonlocal refused
        while time.time() < end:
            n = srng.randint(10, ESTIMATE)
            used, admitted = 0, 0.0
            try:
                async with g.tenant("metered"), aclosing(answer(n)) as stream:
                    async for _ in stream:
                        if not used:
                            admitted = time.time()  # the stream opened: its reservation was made
                        used += 1
            except QuotaExceeded:
                refused += 1
                await asyncio.sleep(srng.uniform(0.05, 0.15))
                continue
            quota.append((admitted, used))

    async def reader() -> None:
        while time.time() < end:
            async with g.tenant("paced"), aclosing(answer(50)) as stream:
                async for _ in stream:
                    paced.append(time.time())
                    if time.time() >= end:
                        break

    lag = Lag()
    await asyncio.gather(
        *(metered(random.Random(rng.random())) for _ in range(streams)),
        *(reader() for _ in range(max(1, streams // 2))),
        lag.watch(end),
    )
    await g.aclose()
    await client.aclose()
    return {"quota": quota, "refused": refused, "paced": paced, "degraded": len(degraded), "lag_s": lag.s}


if __name__ == "__main__":
    port, duration_s, streams, seed = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    print(json.dumps(asyncio.run(main(port, duration_s, streams, seed))), flush=True)
