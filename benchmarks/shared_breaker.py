"""Per-call cost of the Redis-shared breaker beside the in-memory breaker, in the same run.

The section of ``benchmarks/overhead.py`` for issue 6. Starts a real ``redis-server`` on a free
127.0.0.1 port and measures, in one asyncio loop, what ``@guard`` pays per call:

* ``bare``: ``await fn()`` alone (the floor);
* ``in-memory``: ``CircuitBreaker.acquire()`` + ``on_result()``, closed, success;
* ``shared``: ``SharedCircuitBreaker.acquire()`` + ``on_result()``, closed, success, with its
  background task flushing the batches to Redis during the round (its client-side cost counts);
* the same two while open (rejected), and the shared breaker on local fallback (Redis stopped).

Every body yields to the loop every ``--yield-every`` calls, as real I/O calls would, so the
shared breaker's flush task runs inside the measured time. Each figure is the median of
``--repeats`` rounds of ``--n`` calls. Target: shared <= 2x in-memory. Usage::

    python benchmarks/shared_breaker.py [--n 100000] [--repeats 5] [--yield-every 10]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aredis

from ragguard import BreakerOpen
from ragguard.breakers import CircuitBreaker
from ragguard.chaos import RedisServer
from ragguard.distributed import SharedCircuitBreaker

Body = Callable[[], Awaitable[None]]


async def ok() -> int:
    return 1


def guarded(breaker: Any, n: int, every: int) -> Body:
    """What Stage.attempt does around one call: acquire, time the call, report the outcome."""
    clock = time.monotonic

    async def body() -> None:
        acquire, on_result = breaker.acquire, breaker.on_result
        for i in range(n):
            token = acquire()
            start = clock()
            await ok()
            now = clock()
            on_result(token, now - start, None, now)
            if i % every == 0:
                await asyncio.sleep(0)

    return body


def rejected(breaker: Any, n: int, every: int) -> Body:
    async def body() -> None:
        acquire = breaker.acquire
        for i in range(n):
            try:
                acquire()
            except BreakerOpen:
                pass
            if i % every == 0:
                await asyncio.sleep(0)

    return body


def bare(n: int, every: int) -> Body:
    async def body() -> None:
        for i in range(n):
            await ok()
            if i % every == 0:
                await asyncio.sleep(0)

    return body


async def measure(cases: dict[str, Body], n: int, repeats: int) -> dict[str, float]:
    """Median ns/call per case; the cases take turns within each round, so a noisy neighbour
    on the machine slows them alike."""
    for body in cases.values():
        await body()  # warm-up (and the shared breaker's first flushes)
    rounds: dict[str, list[float]] = {label: [] for label in cases}
    for _ in range(repeats):
        for label, body in cases.items():
            start = time.perf_counter_ns()
            await body()
            rounds[label].append((time.perf_counter_ns() - start) / n)
    return {label: statistics.median(r) for label, r in rounds.items()}


def breaker(name: str) -> CircuitBreaker:
    return CircuitBreaker(name, minimum_calls=100, window_size=100, open_for_s=3600)


async def main(n: int, repeats: int, every: int) -> None:
    with RedisServer() as server:
        client = aredis.Redis(host=server.host, port=server.port, socket_timeout=0.5)
        memory = breaker("bench-memory")
        shared = await SharedCircuitBreaker(breaker("bench-shared"), client).start()
        memory_open = breaker("bench-memory-open")
        shared_open = await SharedCircuitBreaker(breaker("bench-shared-open"), client).start()
        for b in (memory_open, shared_open):
            for _ in range(100):
                b.on_result(b.acquire(), 0.0, ConnectionRefusedError("down"))
        await shared_open.refresh()
        assert memory_open.state == "open" and shared_open.state == "open" and shared.shared

        got = await measure({
            "bare": bare(n, every),
            "memory": guarded(memory, n, every),
            "shared": guarded(shared, n, every),
            "memory_open": rejected(memory_open, n, every),
            "shared_open": rejected(shared_open, n, every),
        }, n, repeats)
        base, mem, shr, mem_rej, shr_rej = (got[k] for k in ("bare", "memory", "shared", "memory_open",
                                                             "shared_open"))
        calls_in_redis = int(await client.hget(shared.keys[0], "calls") or 0)
        server.stop()  # Redis goes away: the shared breaker falls back to its wrapped breaker
        for _ in range(300):
            if not shared.shared:
                break
            await asyncio.sleep(0.01)
        after = await measure({"bare": bare(n, every), "memory": guarded(memory, n, every),
                               "fallback": guarded(shared, n, every)}, n, repeats)
        fallback = after["fallback"] * mem / after["memory"]  # scaled to the first run's in-memory
        assert not shared.shared
        await shared.aclose()
        await shared_open.aclose()
        await client.aclose()

    print(f"{'case':<46}{'ns/call':>9}{'over bare':>11}{'x in-memory':>13}")
    rows = [
        ("bare await", base, None),
        ("in-memory acquire/on_result, closed", mem, mem),
        ("shared acquire/on_result, closed", shr, mem),
        ("shared, Redis stopped (local fallback)", fallback, mem),
        ("in-memory acquire, open (rejected)", mem_rej, mem_rej),
        ("shared acquire, open (rejected)", shr_rej, mem_rej),
    ]
    for label, ns, ref in rows:
        over = ns - base if "acquire/" in label or "fallback" in label else ns
        ratio = "" if ref is None else f"{ns / ref:.2f}"
        print(f"{label:<46}{ns:>9.0f}{over:>11.0f}{ratio:>13}")
    print(f"breaker cost alone (minus bare): in-memory {mem - base:.0f} ns, shared {shr - base:.0f} ns "
          f"-> {(shr - base) / max(mem - base, 1e-9):.2f}x (target <= 2x)")
    print(f"(n={n} calls per round, median of {repeats} rounds, yield every {every} calls; "
          f"the shared window in Redis holds {calls_in_redis} calls, so the batches did arrive)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="calls per round (1..1,000,000)")
    parser.add_argument("--repeats", type=int, default=7, help="rounds per case (1..50)")
    parser.add_argument("--yield-every", type=int, default=10, help="calls between loop yields (1..1000)")
    args = parser.parse_args()
    if not (1 <= args.n <= 1_000_000 and 1 <= args.repeats <= 50 and 1 <= args.yield_every <= 1000):
        parser.error("--n in 1..1,000,000, --repeats in 1..50, --yield-every in 1..1000")
    asyncio.run(main(args.n, args.repeats, args.yield_every))
