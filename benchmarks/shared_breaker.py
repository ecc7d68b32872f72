"""Per-call cost of the Redis-shared breaker beside the in-memory breaker, in the same run.

The section of ``benchmarks/overhead.py`` for issue 6. Starts a real ``redis-server`` on a free
127.0.0.1 port and measures, in one asyncio loop, what ``@guard`` pays per call:

* ``bare``: ``await fn()`` alone (the floor);
* ``in-memory``: ``CircuitBreaker.acquire()`` + ``on_result()``, closed, success;
* ``shared``: ``SharedCircuitBreaker.acquire()`` + ``on_result()``, closed, success, with its
  background task flushing the batches to Redis during the round (its client-side cost counts);
* the same two while open (rejected), and the shared breaker on local fallback (Redis stopped).

The contenders take turns round by round (``_bench.run_async``: the order rotates, so a burst of
load from another process lands on all of them alike), and every contender yields to the loop every
``--yield-every`` calls, as real I/O calls would, so the shared breaker's flush task runs inside
the measured time. Figures are CPU time of the loop's thread per call (the replica's own cost:
redis-server's work is another process's, in production another machine's), the median of
``--rounds`` rounds of ``--ops`` calls. Target: the shared breaker's cost over the bare call at most
2x the in-memory breaker's, paired per round. Usage::

    python benchmarks/shared_breaker.py [--ops 20000] [--rounds 9] [--yield-every 10]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aredis

import _bench
from _bench import Contender, Results, Target
from ragguard import BreakerOpen
from ragguard.breakers import CircuitBreaker
from ragguard.chaos import RedisServer
from ragguard.redis import SharedCircuitBreaker


async def ok() -> int:
    return 1


def guarded(breaker: Any) -> Callable[[], Awaitable[None]]:
    """What Stage.attempt does around one call: acquire, time the call, report the outcome."""
    clock = time.monotonic
    acquire, on_result = breaker.acquire, breaker.on_result

    async def body() -> None:
        token = acquire()
        start = clock()
        await ok()
        now = clock()
        on_result(token, now - start, None, now)

    return body


def rejected(breaker: Any) -> Callable[[], Awaitable[None]]:
    acquire = breaker.acquire

    async def body() -> None:
        try:
            acquire()
        except BreakerOpen:
            pass

    return body


def breaker(name: str) -> CircuitBreaker:
    return CircuitBreaker(name, minimum_calls=100, window_size=100, open_for_s=3600)


def over_bare(results: Results, a: str, b: str, bare: str) -> tuple[float, float, float]:
    """Median, min and max over rounds of (a - bare) / (b - bare), all three from the same round."""
    per_round = [(x - z) / max(y - z, 1e-9) for x, y, z in
                 zip(results.samples[a], results.samples[b], results.samples[bare], strict=True)]
    return statistics.median(per_round), min(per_round), max(per_round)


async def main(ops: int, rounds: int, every: int) -> int:
    _bench.header()
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
        before = int((await client.info("commandstats")).get("cmdstat_evalsha", {}).get("calls", 0))

        contenders = [
            Contender("bare await", "the call alone", ok),
            Contender("in-memory, closed", "acquire, the call, on_result (success)", guarded(memory)),
            Contender("shared, closed", "the same, outcomes batched to Redis by the background task",
                      guarded(shared)),
            Contender("in-memory, open", "acquire raises BreakerOpen, caught", rejected(memory_open)),
            Contender("shared, open", "the same on the shared state", rejected(shared_open)),
        ]  # fmt: skip
        results = await _bench.run_async(contenders, ops=ops, rounds=rounds, yield_every=every)
        syncs = int((await client.info("commandstats"))["cmdstat_evalsha"]["calls"]) - before
        calls_in_redis = int(await client.hget(shared.keys[0], "calls") or 0)

        server.stop()  # Redis goes away: the shared breaker falls back to its wrapped breaker
        for _ in range(300):
            if not shared.shared:
                break
            await asyncio.sleep(0.01)
        assert not shared.shared
        fallback = await _bench.run_async([
            Contender("bare await", "the call alone", ok),
            Contender("in-memory, closed", "acquire, the call, on_result (success)", guarded(memory)),
            Contender("shared, Redis stopped", "on local fallback: the wrapped breaker decides",
                      guarded(shared)),
        ], ops=ops, rounds=rounds, yield_every=every)  # fmt: skip
        await shared.aclose()
        await shared_open.aclose()
        await client.aclose()

    _bench.print_table(results, "shared breaker beside the in-memory one", unit="call",
                       against=["bare await", "in-memory, closed"])
    _bench.print_table(fallback, "Redis stopped", unit="call", against=["bare await", "in-memory, closed"])
    closed = over_bare(results, "shared, closed", "in-memory, closed", "bare await")
    local = over_bare(fallback, "shared, Redis stopped", "in-memory, closed", "bare await")
    mem_ns = results.median("in-memory, closed") - results.median("bare await")
    shr_ns = results.median("shared, closed") - results.median("bare await")
    targets = [
        Target("shared closed-path cost vs in-memory (each minus the bare call)", closed[0], 2.0,
               f"{shr_ns:.0f} ns vs {mem_ns:.0f} ns; rounds {closed[1]:.2f}-{closed[2]:.2f}"),
        Target("shared on local fallback vs in-memory (each minus the bare call)", local[0], 2.0,
               f"rounds {local[1]:.2f}-{local[2]:.2f}"),
        _bench.ratio_target(results, "shared rejection vs in-memory rejection", "shared, open",
                            "in-memory, open", 2.0),
    ]
    gaps = _bench.print_targets(targets)
    print(f"({ops} calls per round, {rounds} rounds, a yield every {every} calls; {syncs} syncs with Redis "
          f"during the rounds, one per {(rounds + 1) * ops * 2 / max(syncs, 1):,.0f} calls of the two shared "
          f"contenders; the shared window holds {calls_in_redis} calls, so the batches did arrive)")
    return gaps


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=20_000, help="calls per round (1..1,000,000)")
    parser.add_argument("--rounds", type=int, default=9, help="rounds (1..50)")
    parser.add_argument("--yield-every", type=int, default=10, help="calls between loop yields (1..1000)")
    args = parser.parse_args()
    if not (1 <= args.ops <= 1_000_000 and 1 <= args.rounds <= 50 and 1 <= args.yield_every <= 1000):
        parser.error("--ops in 1..1,000,000, --rounds in 1..50, --yield-every in 1..1000")
    sys.exit(asyncio.run(main(args.ops, args.rounds, args.yield_every)))
