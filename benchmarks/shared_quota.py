"""What a tenant quota held in Redis costs per request, as a ratio to one bare EVALSHA round trip,
and how far the opt-in local-lease mode strays from the quota across processes (issue 11).

Part 1, cost (one asyncio loop, one real ``redis-server`` on 127.0.0.1): each round runs every
contender for ``--n`` sequential requests, in turn (the order rotating from round to round, as in
``_bench``), so a noisy neighbour slows them alike::

    bare EVALSHA           await client.evalsha(<sha of "return 1">, 0) on the same client (same
                           connection pool, socket timeout): the floor, one round trip
    bare, same arguments   the same "return 1" sent with the admission's 3 keys and 2 arguments:
                           what the arguments cost (packing in redis-py, parsing in Redis)
    admission script       the admission script alone, awaited (one round trip, the same work in
                           Redis as RedisQuotas does): what is left is RedisQuotas' own Python
    two scripts            the old way: await the admit script, then await the release script
    RedisQuotas            acquire + release (concurrency + rate): the release rides on the next
                           admission of the tenant, or goes in the background
    local lease            RedisQuotas with LocalLease: admitted on a borrowed share, no round trip
    in-memory              LocalQuotas acquire + release

Figures are the median of ``--rounds`` rounds in microseconds per request (wall clock: the wait for
Redis is the cost), with the spread (min to max) and the ratio to the bare round trip: the median of
the per-round ratios (both measured in the same round, moments apart), so a burst of load from
another process moves both. Target: RedisQuotas within 1.3x.

Part 2, accuracy (``--processes`` worker processes, 200 callers each, one tenant, ``--seconds``
long): the same load against the exact mode and the local-lease mode, for a rate-only quota (50/s,
burst 5) and for the same rate with 10 concurrency slots, with equal demand and with skewed demand
(callers per process 1:2:4:8, 800 in all). Each call holds its slot 0.05 s (a quarter 0.3 s).
Reported: admitted rate in the steady window and its error against the limit, the peak in flight (a
Redis-side counter), and the refusals by reason. Usage::

    python benchmarks/shared_quota.py [--n 2000] [--rounds 7] [--processes 4] [--seconds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aredis

import _bench
from ragguard import QuotaExceeded, TenantQuota
from ragguard.chaos import RedisServer
from ragguard.quotas import LocalQuotas
from ragguard.redis import LocalLease, RedisQuotas
from ragguard.redis._keys import quota_keys
from ragguard.redis._link import Script
from ragguard.redis._scripts import QUOTA as QUOTA_SCRIPT

Body = Callable[[], Awaitable[None]]
QUOTA = TenantQuota(max_concurrency=1000, rate_per_s=1e6, burst=1000)
LOADS = {
    "rate 50/s": TenantQuota(rate_per_s=50.0, burst=5),
    "rate 50/s + 10 slots": TenantQuota(max_concurrency=10, rate_per_s=50.0, burst=5),
}


# -- part 1: cost -------------------------------------------------------------------------------


async def cost(n: int, rounds: int) -> None:
    with RedisServer() as server:
        client = aredis.Redis(host=server.host, port=server.port, socket_timeout=1.0)
        sha = await client.script_load("return 1")
        script = Script(client, QUOTA_SCRIPT, 3)
        shared = RedisQuotas(lambda t: QUOTA, client, holder_id="bench")
        leased = RedisQuotas(lambda t: QUOTA, client, holder_id="lease", key_prefix="lease",
                             local_lease=LocalLease(period_s=0.5))
        memory = LocalQuotas(lambda t: QUOTA)
        # the keys and the plan as RedisQuotas sends them (encoded once), the request built per call
        keys = [k.encode() for k in quota_keys("two", "two")[:3]]
        script_keys = [k.encode() for k in quota_keys("one", "one")[:3]]
        plan = b"10.0 0.7 0.7 1000 1000000.0 1000"
        ids = iter(range(10**9))

        async def bare() -> None:
            for _ in range(n):
                await client.evalsha(sha, 0)

        async def bare_args() -> None:
            lease = f"bare:{next(ids)}"
            for _ in range(n):
                await client.evalsha(sha, 3, *script_keys, plan, f"- {lease} 0.0 2")

        async def one_script() -> None:
            # each admission takes over the slot the previous one released (flag 2), as
            # RedisQuotas does for sequential requests
            lease = f"one:{next(ids)}"
            await script(*script_keys, plan, f"- {lease} 0.0 0")
            for _ in range(n):
                await script(*script_keys, plan, f"- {lease} 0.0 2")

        async def two_scripts() -> None:
            for _ in range(n):
                lease = f"two:{next(ids)}"
                await script(*keys, plan, f"- {lease} 0.0 0")
                await script(*keys, plan, f"- - 0 8 {lease} 0")

        def quotas(q: Any) -> Body:
            async def body() -> None:
                for _ in range(n):
                    q.release(await q.acquire("acme"))
            return body

        cases: dict[str, Body] = {
            "bare EVALSHA (one round trip)": bare,
            "bare, same keys and arguments": bare_args,
            "admission script alone (one trip)": one_script,
            "two scripts (admit, then release)": two_scripts,
            "RedisQuotas acquire + release": quotas(shared),
            "RedisQuotas, local lease": quotas(leased),
            "LocalQuotas (in memory)": quotas(memory),
        }
        for body in cases.values():
            await body()  # warm-up: connections, scripts loaded, the lease borrowed
        samples: dict[str, list[float]] = {label: [] for label in cases}
        labels = list(cases)
        for r in range(rounds):
            for i in _bench._order(len(labels), r):  # the starting contender rotates round by round
                label, body = labels[i], cases[labels[i]]
                start = time.perf_counter_ns()
                await body()
                samples[label].append((time.perf_counter_ns() - start) / n / 1000)
        scripts = int((await client.info("commandstats"))["cmdstat_evalsha"]["calls"])
        server_us = await server_cpu(client, {
            "return 1": (sha, 0, ()),
            "admission script": (script.sha, 3, (*script_keys, plan, b"- one:bench 0.0 2")),
        }, rounds)
        await shared.aclose()
        await leased.aclose()
        await client.aclose()

    def paired(a: str, b: str) -> list[float]:
        return [x / y for x, y in zip(samples[a], samples[b], strict=True)]

    bare_label = "bare EVALSHA (one round trip)"
    print(f"{'per request':<38}{'median us':>10}{'min..max us':>16}{'x one round trip':>18}")
    for label, values in samples.items():
        spread = f"{min(values):.1f}..{max(values):.1f}"
        ratio = statistics.median(paired(label, bare_label))
        print(f"{label:<38}{statistics.median(values):>10.1f}{spread:>16}{ratio:>18.2f}")
    per_round = paired("RedisQuotas acquire + release", bare_label)
    ratio = statistics.median(per_round)
    own = statistics.median(paired("RedisQuotas acquire + release", "admission script alone (one trip)"))
    print(f"RedisQuotas per request: {ratio:.2f}x one EVALSHA round trip (rounds {min(per_round):.2f}-"
          f"{max(per_round):.2f}; target <= 1.3x): {'MET' if ratio <= 1.3 else 'GAP'}; "
          f"{own:.2f}x its admission script alone")
    print("Redis CPU per script (pipelined, so the network's share drops out; min of rounds): "
          + ", ".join(f"{label} {us:.1f} us" for label, us in server_us.items()))
    print(f"(n={n} sequential requests per round, median of {rounds} rounds, interleaved; "
          f"{scripts} EVALSHA in all)")


async def server_cpu(client: Any, scripts: dict[str, tuple[str, int, tuple[Any, ...]]],
                     rounds: int) -> dict[str, float]:
    """Redis's CPU time (INFO cpu, user + sys) per run of each script, sent 2,000 at a time in
    pipelines: the smallest of ``rounds`` rounds, in microseconds."""
    async def used() -> float:
        info = await client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    best = {label: math.inf for label in scripts}
    for _ in range(rounds):
        for label, (digest, numkeys, args) in scripts.items():
            before = await used()
            for _ in range(10):
                pipe = client.pipeline(transaction=False)
                for _ in range(200):
                    pipe.evalsha(digest, numkeys, *args)
                await pipe.execute()
            best[label] = min(best[label], (await used() - before) / 2000 * 1e6)
    return best


# -- part 2: accuracy across processes --------------------------------------------------------------


async def worker(port: int, start_at: float, seconds: float, callers: int, seed: int, mode: str,
                 load: str) -> None:
    rng = random.Random(seed)
    quota = LOADS[load]
    client = aredis.Redis(port=port, socket_timeout=5.0, max_connections=64)
    lease = LocalLease(period_s=0.25) if mode == "local-lease" else None
    prefix = f"{mode}-{load}".replace(" ", "_").replace("/", "")
    quotas = RedisQuotas(lambda t: quota, client, redis_timeout_s=2.0, key_prefix=prefix,
                         rng=random.Random(seed), local_lease=lease)
    admitted: list[float] = []
    refused = {"rate": 0, "concurrency": 0}
    peak = 0
    end = start_at + seconds
    counter = f"{{{prefix}}}:in_flight"
    await asyncio.sleep(max(0.0, start_at - time.time()))

    async def caller(crng: random.Random) -> None:
        nonlocal peak
        while time.time() < end:
            try:
                granted = await quotas.acquire("acme")
            except QuotaExceeded as exc:
                refused[exc.reason] = refused.get(exc.reason, 0) + 1
                await asyncio.sleep(crng.uniform(0.2, 0.8))
                continue
            admitted.append(time.time())
            try:
                peak = max(peak, int(await client.incr(counter)))
                await asyncio.sleep(0.3 if crng.random() < 0.25 else 0.05)
                await client.decr(counter)
            finally:
                quotas.release(granted)

    await asyncio.gather(*(caller(random.Random(rng.random())) for _ in range(callers)))
    await quotas.aclose()
    await client.aclose()
    print(json.dumps({"admitted": admitted, "peak": peak, "refused": refused}))


def run_load(port: int, processes: int, seconds: float, mode: str, load: str,
             callers: list[int]) -> tuple[float, int, dict[str, int]]:
    start_at = time.time() + 2.5
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(port), repr(start_at), repr(seconds),
                               str(callers[i]), str(i), mode, load], stdout=subprocess.PIPE, text=True)
             for i in range(processes)]
    results = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in procs]
    lo, hi = start_at + 1.0, start_at + seconds - 0.25
    in_window = sum(1 for r in results for t in r["admitted"] if lo <= t < hi)
    refused = {k: sum(r["refused"].get(k, 0) for r in results) for k in ("rate", "concurrency")}
    return in_window / (hi - lo), max(r["peak"] for r in results), refused


def accuracy(processes: int, seconds: float) -> None:
    equal = [200] * processes
    weights = [2**i for i in range(processes)]
    skewed = [max(1, round(200 * processes * w / sum(weights))) for w in weights]
    demands = (("equal", equal), (f"skewed {':'.join(map(str, callers_ratio(skewed)))}", skewed))
    print(f"\n{processes} processes, one tenant (burst 5), {seconds:.0f} s per run; the rate is measured "
          f"from 1 s after the start to 0.25 s before the end")
    print(f"{'quota':<22}{'mode':<13}{'demand':<16}{'admitted/s':>11}{'rate error':>12}{'peak in flight':>16}"
          f"{'refused: rate / slot':>22}")
    with RedisServer() as server:
        for load, quota in LOADS.items():
            limit = quota.rate_per_s or 0.0
            for demand, callers in demands:
                for mode in ("exact", "local-lease"):
                    rate, peak, refused = run_load(server.port, processes, seconds, mode, load, callers)
                    slots = "-" if quota.max_concurrency is None else str(quota.max_concurrency)
                    print(f"{load:<22}{mode:<13}{demand:<16}{rate:>11.1f}{(rate - limit) / limit:>+12.1%}"
                          f"{peak:>11} / {slots:<3}{refused['rate']:>13} / {refused['concurrency']}")


def callers_ratio(callers: list[int]) -> list[int]:
    low = min(callers)
    return [round(c / low) for c in callers]


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        port, start_at, seconds, callers, seed, mode, load = sys.argv[2:9]
        asyncio.run(worker(int(port), float(start_at), float(seconds), int(callers), int(seed), mode, load))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="sequential requests per round (1..100,000)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds per contender (1..50)")
    parser.add_argument("--processes", type=int, default=4, help="worker processes for part 2 (0 skips it)")
    parser.add_argument("--seconds", type=float, default=4.0, help="length of each part-2 run (2..30)")
    args = parser.parse_args()
    if not (1 <= args.n <= 100_000 and 1 <= args.rounds <= 50 and 0 <= args.processes <= 16
            and 2 <= args.seconds <= 30):
        parser.error("--n in 1..100,000, --rounds in 1..50, --processes in 0..16, --seconds in 2..30")
    asyncio.run(cost(args.n, args.rounds))
    if args.processes:
        accuracy(args.processes, args.seconds)
