"""One replica of the multi-process deployment-limits test (run as a script by
test_deployment_limits).

Usage: python _deployment_worker.py PORT DURATION_S STREAMS SEED
Prints ``ready`` once imported and connected, then reads the start time (wall clock, one line on
stdin), runs for DURATION_S and prints one JSON line:

- ``streams``: (wall time the stream's first token came, deployment, tokens it used) for each
  stream a model group of two deployments served, each deployment limited to TPM tokens per
  WINDOW_S (``limits.tpm``, shared through Redis); a stream reserves ESTIMATE and uses 10..ESTIMATE
  tokens, one per item;
- ``refused``: calls for which both deployments' limits were spent (NoDeploymentAvailable);
- ``degraded``: how many times this replica left shared state (0: measured on Redis);
- ``lag_s``: the longest the event loop was late to wake a 5 ms sleep.
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

from ragguard import Guard, NoDeploymentAvailable, Policy, events
from ragguard.redis import RedisBackend, SharedStateDegraded

sys.path.insert(0, str(Path(__file__).parent))
from _replica import Lag, started

TPM, WINDOW_S, ESTIMATE = 300, 1.0, 30
LIMITS = {"tpm": TPM, "window_s": WINDOW_S}
POLICY = Policy.parse({
    "stages": {"chat": {"preset": "generation", "generation": {"estimate_tokens": ESTIMATE},
                        "retry": {"attempts": 1}}},
    "groups": {"chat": {"deployments": [{"name": "a", "limits": LIMITS}, {"name": "b", "limits": LIMITS}]}},
})  # fmt: skip


def model(name: str) -> Any:
    async def answer(n: int) -> Any:
        for _ in range(n):
            await asyncio.sleep(0.001)  # the model's time per token
            yield name * 4  # one token (characters / 4)

    return answer


async def main(port: int, duration_s: float, streams: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    degraded: list[Any] = []
    events.bus.subscribe(lambda e: degraded.append(e) if isinstance(e, SharedStateDegraded) else None)
    client = aredis.Redis(host="127.0.0.1", port=port, socket_timeout=5.0, max_connections=64)
    g = Guard(POLICY, backend=RedisBackend(client, tokens={"redis_timeout_s": 2.0}))
    group = g.group("chat", {"a": model("a"), "b": model("b")})
    served: list[tuple[float, str, int]] = []
    refused = 0
    end = await started(client) + duration_s

    async def caller(srng: random.Random) -> None:
        nonlocal refused
        while time.time() < end:
            n = srng.randint(10, ESTIMATE)
            used, first, by = 0, 0.0, ""
            try:
                async with aclosing(group.stream(n)) as items:
                    async for item in items:
                        if not used:
                            first, by = time.time(), item[0]  # admitted: its tokens were reserved
                        used += 1
            except NoDeploymentAvailable:
                refused += 1
                await asyncio.sleep(srng.uniform(0.05, 0.15))
                continue
            served.append((first, by, used))

    lag = Lag()
    await asyncio.gather(*(caller(random.Random(rng.random())) for _ in range(streams)), lag.watch(end))
    await g.aclose()
    await client.aclose()
    return {"streams": served, "refused": refused, "degraded": len(degraded), "lag_s": lag.s}


if __name__ == "__main__":
    port, duration_s, streams, seed = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    print(json.dumps(asyncio.run(main(port, duration_s, streams, seed))), flush=True)
