"""Tenant scaling: the full stack's request cost with 1, 1,000 and 100,000 tenants taking turns
(in one interleaved run), and the memory an idle tenant holds.

    .venv/bin/python benchmarks/tenants.py [--ops 2000] [--rounds 15] [--against COMMIT]

Each contender is a Guard of its own whose requests rotate over its tenants (request i is tenant
``i % n``, every tenant limited by the default quota), so with 100,000 tenants no tenant is seen
twice within 100,000 requests. Memory: tracemalloc's traced bytes after admitting and releasing one
request each of 90,000 new tenants, divided by 90,000 (the ids themselves are made beforehand and
not counted: they are the caller's).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import tracemalloc
from typing import Any

import _against
import _bench
import _stacks
import ragguard
from _bench import Contender, Target


def rotating(n: int, mod: Any = ragguard) -> Any:
    policy = mod.Policy(
        stages={"vector_store": mod.StagePolicy(
            timeout_s=2.0, min_attempt_s=0.01, breaker=mod.BreakerPolicy(kind="vector_store_unavailable"),
            retry=mod.RetryPolicy(attempts=3, retry_on=("connection", "timeout")),
        )},
        default_quota=mod.TenantQuota(max_concurrency=64, rate_per_s=1e7, timeout_s=0.8),
    )  # fmt: skip
    g = mod.Guard(policy)
    search = g.guard("vector_store", fallback=_stacks.keyword_search)(_stacks.work)
    ids = [f"tenant{i}" for i in range(n)]
    state = {"i": 0}

    async def body() -> Any:
        i = state["i"]
        state["i"] = i + 1 if i + 1 < n else 0
        async with g.tenant(ids[i]):
            return await search(1)

    return body


async def bytes_per_idle_tenant(n: int = 90_000, mod: Any = ragguard) -> float:
    policy = mod.Policy(default_quota=mod.TenantQuota(max_concurrency=64, rate_per_s=1e7))
    g = mod.Guard(policy)
    ids = [f"idle{i}" for i in range(n)]
    async with g.tenant("warm"):
        pass
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for tenant in ids:
        async with g.tenant(tenant):
            pass
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(g.quotas._buckets) >= n, "every tenant is still tracked"
    return (after - before) / n


async def main(ops: int, rounds: int, against: str | None = None) -> int:
    _bench.header()
    old = _against.load(against)
    contenders = [
        Contender("1 tenant", "the full stack, one tenant", rotating(1)),
        Contender("1,000 tenants", "the full stack, 1,000 tenants in turn", rotating(1000)),
        Contender("100,000 tenants", "the full stack, 100,000 tenants in turn", rotating(100_000)),
    ]
    if old is not None and against is not None:
        contenders += [Contender(_against.named(c.name, against), f"{c.does}, at {against}", rotating(n, old))
                       for c, n in zip(list(contenders), (1, 1000, 100_000), strict=True)]  # fmt: skip
    results = await _bench.run_async(contenders, ops=ops, rounds=rounds, warmup=100_000)
    _bench.print_table(results, "tenant scaling", against=["1 tenant"], unit="request")
    per_tenant = await bytes_per_idle_tenant()
    _bench.console.print(f"bytes per idle tenant (tracemalloc, 90,000 tenants, under max_tenants): {per_tenant:,.0f}", markup=False)
    targets = [
        _bench.ratio_target(results, "100,000 tenants vs 1 tenant", "100,000 tenants", "1 tenant", 1.2),
        _bench.ratio_target(results, "1,000 tenants vs 1 tenant", "1,000 tenants", "1 tenant", 1.2),
        Target("bytes per idle tenant vs 300 bytes", per_tenant / 300, 1.0, f"{per_tenant:.0f} bytes"),
    ]
    if old is not None and against is not None:
        old_per_tenant = await bytes_per_idle_tenant(mod=old)
        _bench.console.print(f"bytes per idle tenant at {against}: {old_per_tenant:,.0f}", markup=False)
        targets += _against.targets(results, ["1 tenant", "1,000 tenants", "100,000 tenants"], against)
        targets.append(Target(f"bytes per idle tenant vs {against}", per_tenant / old_per_tenant, 1.0,
                              f"{per_tenant:.0f} vs {old_per_tenant:.0f} bytes"))  # fmt: skip
    _bench.print_targets(targets)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15)
    _against.add_argument(parser)
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.ops, args.rounds, args.against)))
