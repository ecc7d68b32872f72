"""How long the Redis-shared breaker and quotas take to switch to local state and back (issue 11).

Real ``redis-server`` and a fault proxy on 127.0.0.1, ragguard's default settings
(``redis_timeout_s`` 0.25, ``probe_every_s`` 1.0, the breaker's ``flush_interval_s`` 0.1). While a
load of ``--rate`` requests per second runs through each component, Redis

* goes away (the process stops: connections refused),
* turns slow (the proxy delays every reply by 0.5 s, twice the timeout),
* comes back,

and the benchmark times each switch (from the fault to the component's ``shared`` flag changing;
both components under load at once), and the slowest request during the switch. Medians (min..max)
over ``--repeats`` runs. Usage::

    python benchmarks/shared_failover.py [--repeats 3] [--rate 200]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ragguard import BreakerOpen, CircuitBreaker, QuotaExceeded, TenantQuota
from ragguard.chaos import FaultProxy, RedisServer
from ragguard.redis import RedisQuotas, SharedCircuitBreaker


def client_for(port: int) -> aredis.Redis:
    return aredis.Redis(port=port, socket_timeout=0.5, socket_connect_timeout=0.5,
                        retry=Retry(NoBackoff(), 0))


async def timed_switch(flag: Callable[[], bool], want: bool, request: Callable[[], Awaitable[None]],
                       rate: float, limit_s: float = 15.0) -> tuple[float, float]:
    """Run ``request`` at ``rate``/s until ``flag() == want``; (seconds it took, slowest request)."""
    t0 = time.monotonic()
    slowest = 0.0
    while time.monotonic() - t0 < limit_s:
        start = time.monotonic()
        await request()
        slowest = max(slowest, time.monotonic() - start)
        if flag() is want:
            return time.monotonic() - t0, slowest
        await asyncio.sleep(max(0.0, 1.0 / rate - (time.monotonic() - start)))
    return float("inf"), slowest


async def switches(label: str, client: aredis.Redis, fault: Callable[[], None], heal: Callable[[], None],
                   rate: float) -> dict[str, tuple[float, float]]:
    """Time both components through ``fault`` then ``heal``."""
    breaker = await SharedCircuitBreaker(CircuitBreaker(f"bench-{label}"), client).start()
    quotas = RedisQuotas(lambda t: TenantQuota(max_concurrency=1000), client)

    async def call() -> None:
        try:
            breaker.on_result(breaker.acquire(), 0.001, None)
        except BreakerOpen:
            pass

    async def admit() -> None:
        try:
            quotas.release(await quotas.acquire("acme"))
        except QuotaExceeded:
            pass

    def breaker_shared() -> bool:
        return breaker.shared

    def quotas_shared() -> bool:
        return quotas.shared

    out: dict[str, tuple[float, float]] = {}
    await admit()
    await asyncio.sleep(0.05)  # the release of that admission has landed: nothing pending
    fault()
    (out[f"breaker, Redis {label}: to local"],
     out[f"quotas, Redis {label}: to local"]) = await asyncio.gather(
        timed_switch(breaker_shared, False, call, rate), timed_switch(quotas_shared, False, admit, rate))
    heal()
    (out[f"breaker, Redis {label}: back to shared"],
     out[f"quotas, Redis {label}: back to shared"]) = await asyncio.gather(
        timed_switch(breaker_shared, True, call, rate), timed_switch(quotas_shared, True, admit, rate))
    await breaker.aclose()
    await quotas.aclose()
    return out


async def one_run(rate: float) -> dict[str, tuple[float, float]]:
    with RedisServer() as server:
        proxy = FaultProxy(server.port).start_in_thread()
        direct, slow = client_for(server.port), client_for(proxy.port)
        try:
            out = await switches("down", direct, server.stop, server.start, rate)
            out.update(await switches("slow", slow, lambda: proxy.set_latency(to_client_s=0.5), proxy.heal,
                                      rate))
        finally:
            await direct.aclose()
            await slow.aclose()
            proxy.close()
    return out


async def main(repeats: int, rate: float) -> None:
    logging.getLogger("ragguard.distributed").setLevel(logging.ERROR)  # the switches log on purpose
    runs: list[dict[str, Any]] = [await one_run(rate) for _ in range(repeats)]
    print(f"{'switch':<42}{'took s (median, min..max)':>28}{'slowest request s':>20}")
    for key in runs[0]:
        took = [r[key][0] for r in runs]
        slowest = [r[key][1] for r in runs]
        print(f"{key:<42}{statistics.median(took):>10.3f} ({min(took):.3f}..{max(took):.3f})"
              f"{max(slowest):>20.3f}")
    print(f"(defaults: redis_timeout_s 0.25, probe_every_s 1.0, flush_interval_s 0.1; load {rate:.0f} "
          f"requests/s per component; {repeats} runs)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs (1..20)")
    parser.add_argument("--rate", type=float, default=200.0, help="requests per second (1..10,000)")
    args = parser.parse_args()
    if not (1 <= args.repeats <= 20 and 1 <= args.rate <= 10_000):
        parser.error("--repeats in 1..20, --rate in 1..10,000")
    asyncio.run(main(args.repeats, args.rate))
