"""Happy-path cost of a guarded call, each figure beside its baselines measured in the same run.

    .venv/bin/python benchmarks/overhead.py [--calls 20000] [--rounds 7]

Every variant awaits the same trivial coroutine ``calls`` times per round, yielding to the event
loop every 100 calls as a server would; the figure is the median over rounds of nanoseconds per
call. Ratios are against a bare ``await`` and against interlock-cb's full pipeline (fallback,
retry, breaker, bulkhead, timeout), the closest Python peer. Shared machines are noisy: compare
ratios, not absolute figures.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable

import aiobreaker
import tenacity
from interlock.breaker import CircuitBreaker as InterlockBreaker
from interlock.pipeline import Pipeline
from rich.console import Console
from rich.table import Table

import ragguard
from ragguard import _inject
from ragguard.breakers import CircuitBreaker, VectorStoreUnavailableBreaker
from ragguard.chaos import Chaos, Latency, RedisServer
from ragguard.events import bus


async def work(x: int = 1) -> int:
    return x


async def _raiser() -> None:
    raise ragguard.BreakerOpen("floor", 1.0)


async def _refused() -> None:
    raise ConnectionRefusedError("benchmark: the store is down")


async def measure(body: Callable[[], Awaitable[object]], calls: int, rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        for i in range(calls):
            await body()
            if i % 100 == 99:
                await asyncio.sleep(0)
        samples.append((time.perf_counter_ns() - start) / calls)
    return statistics.median(samples)


Body = Callable[[], Awaitable[object]]


async def shared_stacks() -> tuple[Body, Body, Callable[[], Awaitable[None]]] | None:
    """The full stack with the breaker kept in a real redis-server (outcomes batched, state read from a
    local copy: calls should not wait on Redis), and with the tenant quota there too (one Redis round
    trip per request, the price of an exact cross-replica quota). None without a redis-server binary."""
    try:
        server = RedisServer()
        server.start()
    except Exception as exc:  # no redis-server binary: say so and skip the rows
        print(f"(no shared-state rows: {exc})")
        return None
    import redis.asyncio as aredis

    from ragguard.distributed import SharedCircuitBreaker

    client = aredis.Redis(host=server.host, port=server.port, socket_timeout=0.5)
    policy = ragguard.Policy(
        stages={"vector_store": ragguard.StagePolicy(timeout_s=2.0, min_attempt_s=0.01)},
        tenants={"acme": ragguard.TenantQuota(max_concurrency=64, timeout_s=0.8)},
    )
    local_quota = ragguard.Guard(policy)
    local_quota.stage(
        "vector_store",
        breaker=SharedCircuitBreaker(
            VectorStoreUnavailableBreaker("vector_store"), client, key_prefix="bench"
        ),
    )
    all_shared = ragguard.Guard(policy, redis=client, redis_prefix="bench2")

    def body_of(g: ragguard.Guard) -> Body:
        search = g.guard("vector_store")(work)

        async def body() -> object:
            async with g.tenant("acme"):
                return await search(1)

        return body

    async def close() -> None:
        await local_quota.breaker("vector_store").aclose()
        await all_shared.aclose()
        await client.aclose()
        server.stop()

    return body_of(local_quota), body_of(all_shared), close


def full_stack_guard() -> tuple[ragguard.Guard, Callable[[], Awaitable[object]]]:
    policy = ragguard.Policy(
        stages={
            "vector_store": ragguard.StagePolicy(
                timeout_s=2.0,
                min_attempt_s=0.01,
                breaker=ragguard.BreakerPolicy(kind="vector_store_unavailable"),
                retry=ragguard.RetryPolicy(attempts=3, retry_on=("connection", "timeout")),
            )
        },
        tenants={"acme": ragguard.TenantQuota(max_concurrency=64, rate_per_s=1e7, timeout_s=0.8)},
    )
    g = ragguard.Guard(policy)

    async def keyword_search(x: int = 1) -> int:
        return -x

    search = g.guard("vector_store", fallback=keyword_search)(work)

    async def body() -> object:
        async with g.tenant("acme"):
            return await search(1)

    return g, body


async def main(calls: int, rounds: int) -> int:
    rows: list[tuple[str, float]] = []

    async def run(name: str, body: Callable[[], Awaitable[object]]) -> float:
        await measure(body, max(calls // 10, 100), 1)  # warm up
        ns = await measure(body, calls, rounds)
        rows.append((name, ns))
        return ns

    bare = await run("bare await", work)

    async def with_timeout() -> object:
        async with asyncio.timeout(5):
            return await work()

    await run("asyncio.timeout", with_timeout)

    aio = aiobreaker.CircuitBreaker(fail_max=5)
    aiob = await run("aiobreaker call_async", lambda: aio.call_async(work))

    async def tenacity_loop() -> object:
        async for attempt in tenacity.AsyncRetrying(stop=tenacity.stop_after_attempt(3)):
            with attempt:
                return await work()
        return None

    await run("tenacity AsyncRetrying", tenacity_loop)

    ib = InterlockBreaker(name="bench")
    await run("interlock-cb breaker", lambda: ib.call_async(work))
    pipeline = (
        Pipeline.builder()
        .fallback(lambda exc: -1)
        .retry(attempts=3)
        .circuit_breaker(InterlockBreaker(name="bench-pipeline"))
        .bulkhead(64)
        .timeout(2.0)
        .build()
    )
    interlock_full = await run("interlock-cb full pipeline", lambda: pipeline.call(work))

    rb = CircuitBreaker("bench")
    ours_breaker = await run("ragguard breaker.call", lambda: rb.call(work))

    async def raise_floor() -> object:
        try:
            await _raiser()
        except ragguard.BreakerOpen:
            return None
        return None

    floor = await run("floor: raise+catch through a coroutine", raise_floor)

    opened = VectorStoreUnavailableBreaker("bench-open", open_for_s=3600)
    for _ in range(10):
        try:
            await opened.call(_refused)
        except (ConnectionRefusedError, ragguard.BreakerOpen):
            pass
    assert opened.state is ragguard.BreakerState.OPEN

    async def rejected() -> object:
        try:
            return await opened.call(work)
        except ragguard.BreakerOpen:
            return None

    ours_reject = await run("ragguard rejection while open", rejected)

    _, full = full_stack_guard()
    ours_full = await run("ragguard full stack", full)

    unsubscribe = bus.subscribe(lambda event: None)
    try:
        ours_events = await run("ragguard full stack + listener", full)
    finally:
        unsubscribe()

    chaos = Chaos(rng=random.Random(0)).install()
    chaos.inject(Latency(seconds=0.5), stage="some_other_stage")
    await run("ragguard full stack + chaos on, fault elsewhere", full)
    chaos.disable()
    assert _inject.active is None
    chaos_off = await run("ragguard full stack, chaos installed then disabled", full)

    shared = await shared_stacks()
    if shared is not None:
        breaker_shared, all_shared, close = shared
        try:
            ours_shared = await run("ragguard full stack, breaker shared in Redis", breaker_shared)
            await run("ragguard full stack, quota in Redis too (admit+release scripts)", all_shared)
        finally:
            await close()

    table = Table(title=f"guarded-call overhead, median of {rounds} rounds x {calls} calls (ns/call)")
    table.add_column("variant")
    table.add_column("ns/call", justify="right")
    table.add_column("x bare await", justify="right")
    table.add_column("x interlock pipeline", justify="right")
    for name, ns in rows:
        table.add_row(name, f"{ns:,.0f}", f"{ns / bare:.1f}", f"{ns / interlock_full:.3f}")
    console = Console(width=110)
    console.print(table)

    checks = [
        ("full stack <= 5 us median", ours_full <= 5000, f"{ours_full / 1000:.2f} us"),
        (
            "full stack >= 10x faster than interlock-cb pipeline",
            interlock_full / ours_full >= 10,
            f"{interlock_full / ours_full:.1f}x",
        ),
        (
            "breaker alone no slower than aiobreaker",
            ours_breaker <= aiob,
            f"{ours_breaker / aiob:.2f}x aiobreaker",
        ),
        (
            "rejection while open < 1 us",
            ours_reject < 1000,
            f"{ours_reject:.0f} ns, {ours_reject / floor:.2f}x the floor of raising any exception",
        ),
        ("full stack + listener (events delivered)", True, f"{ours_events / 1000:.2f} us"),
        (
            "chaos disabled costs nothing measurable",
            chaos_off <= ours_full * 1.1,
            f"{chaos_off / ours_full:.2f}x the full stack without chaos",
        ),
    ]
    if shared is not None:
        checks.append(
            (
                "shared-breaker stack <= 2x the in-memory one",
                ours_shared <= 2 * ours_full,
                f"{ours_shared / ours_full:.2f}x",
            )
        )
    for name, ok, detail in checks:
        console.print(f"{'MET ' if ok else 'GAP '} {name}: {detail}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.calls, args.rounds)))
