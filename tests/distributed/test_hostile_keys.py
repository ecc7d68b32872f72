"""A hostile caller sending 100,000 distinct keys to a keyed stage whose breakers live in Redis:
the keys kept, the memory, the Redis keys and the metric series stay bounded (issue 28)."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest
from distributed_helpers import PATIENT

from ragguard import BreakerOpen, Guard, Policy
from ragguard.metrics import PrometheusExporter
from ragguard.redis import RedisBackend

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]

KEYS, MAX_KEYS = 100_000, 64
BREAKER = {"minimum_calls": 2, "window_size": 2, "failure_rate_threshold": 50}


def _series(scrape: bytes, label: str = "") -> int:
    """Series in a scrape (those with ``label``, when given)."""
    lines = scrape.decode().splitlines()
    return sum(1 for line in lines if line and not line.startswith("#") and label in line)


async def test_a_hostile_callers_100000_keys_leave_memory_redis_keys_and_metric_series_bounded(
    client: Any,
) -> None:
    stage = {"max_keys": MAX_KEYS, "breaker": BREAKER, "retry": {"attempts": 1}}
    policy = Policy.parse({"stages": {"gen": stage}})
    g = Guard(policy, backend=RedisBackend(client, prefix="hostile", **PATIENT))
    exporter = PrometheusExporter(guards=g).start()

    @g.guard("gen", key="model")
    async def call(model: str) -> str:
        if model.startswith("bad"):
            raise ConnectionResetError(model)
        return model

    async def hostile(first: int, n: int) -> None:
        for i in range(first, first + n):
            try:
                await call(f"bad-{i}-" + "x" * (i % 300))  # long keys too
            except (ConnectionResetError, BreakerOpen):
                pass
            if i % 100 == 0:
                await asyncio.sleep(0)  # as a server's requests would: the events are delivered

    try:
        await hostile(0, 2000)  # warm up: the map full, the overflow's breaker open
        await asyncio.sleep(0)
        gc.collect()  # a breaker dropped but not yet collected still shows its state gauge
        warm = exporter.scrape()
        warm_series, warm_breakers = _series(warm), _series(warm, 'breaker="')
        objects = len(gc.get_objects())
        await hostile(2000, KEYS)
        await asyncio.sleep(0)
        gc.collect()
        grown = len(gc.get_objects()) - objects
        for _, runtime in g.stage("gen").keys.items():  # type: ignore[union-attr]
            await runtime.breaker.refresh()  # what each key had to say is in Redis now
        await g.breaker("gen").refresh()
        redis_keys = [k async for k in client.scan_iter(match="*hostile*", count=1000)]
        scraped = exporter.scrape()
        series, breakers = _series(scraped), _series(scraped, 'breaker="')
        keys = g.stage("gen").keys
        assert keys is not None
        print(f"\n{KEYS:,} hostile keys (+2,000 to warm up): {len(keys)} kept, {keys.overflowed:,} calls "
              f"on the overflow; {grown:+,} objects in memory; {len(redis_keys)} Redis keys; "
              f"{series} metric series ({warm_series} after the first 2,000), {breakers} with a breaker "
              f"label ({warm_breakers})")
        assert len(keys) == MAX_KEYS
        assert keys.overflowed >= KEYS
        assert len(redis_keys) <= 4 * (MAX_KEYS + 1) + 8  # state, window, trials, seq per breaker, probes
        assert 0 < breakers <= warm_breakers  # the breaker label is capped (max_breakers): no series per key
        assert series <= warm_series + 16  # (gauges read at scrape time come and go: a link, a pool)
        assert grown < 5_000  # tracked objects: the kept keys' runtimes replaced, nothing per key sent
    finally:
        exporter.close()
        await g.aclose()
