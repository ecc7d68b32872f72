"""Per-item cost of a guarded generation stream, beside a bare async generator and an unpaced stream.

    .venv/bin/python benchmarks/generation.py [--streams 200] [--items 100] [--rounds 9]

Each contender reads ``streams`` streams of ``items`` short text items (as a model streams tokens),
inside a tenant block, on the real clock (so the budgets arm the loop's timer wheel per item).
Contenders run interleaved, round by round, in a rotating order; the figure is the median over
rounds of nanoseconds per item (the stream's opening and closing spread over its items), with the
spread (min-max) beside it. Contenders:

- bare async generator: no ragguard at all;
- guarded stream, plain stage: ``@guard`` on a stage with no preset (breaker, attempt timeout);
- generation stage, tenant unlimited: the three budgets, no token accounting;
- generation stage, paced tenant: budgets plus counting and pacing every item (a rate so high
  that no item ever waits: what pacing costs when it does not delay);
- generation stage, paced + token quota: the same plus a reservation and its settlement per stream.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from rich.console import Console
from rich.table import Table

import ragguard
from ragguard import GenerationPolicy, Policy, StagePolicy, TenantQuota
from ragguard.rag import token_accounts

WORDS = tuple(f"tok{i % 97} " for i in range(1000))


async def model(n: int) -> AsyncIterator[str]:
    for i in range(n):
        yield WORDS[i % 1000]


def contenders() -> dict[str, Callable[[int], Awaitable[int]]]:
    policy = Policy(
        stages={
            "plain": StagePolicy(timeout_s=30.0),
            "generation": StagePolicy(generation=GenerationPolicy(first_item_s=30, idle_s=10, total_s=300)),
        },
        tenants={
            "paced": TenantQuota(tokens_per_s=1e9, token_burst=10**9),
            "quota": TenantQuota(tokens_per_s=1e9, token_burst=10**9, token_quota=10**12),
        },
    )
    g = ragguard.Guard(policy)
    plain = g.guard("plain")(model)
    generation = g.guard("generation")(model)

    def reader(stream: Callable[[int], AsyncIterator[str]], tenant: str) -> Callable[[int], Awaitable[int]]:
        async def read(items: int) -> int:
            n = 0
            async with g.tenant(tenant):
                async for _ in stream(items):
                    n += 1
            return n

        return read

    async def bare(items: int) -> int:
        n = 0
        async with g.tenant("unlimited"):
            async for _ in model(items):
                n += 1
        return n

    runs = {
        "bare async generator": bare,
        "guarded stream, plain stage": reader(plain, "unlimited"),
        "generation stage, tenant unlimited": reader(generation, "unlimited"),
        "generation stage, paced tenant": reader(generation, "paced"),
        "generation stage, paced + token quota": reader(generation, "quota"),
    }
    runs["_check"] = lambda items: _check(g)
    return runs


async def _check(g: ragguard.Guard) -> int:
    accounts = token_accounts(g)
    assert accounts.total_reserved() == 0, "a reservation was left behind"
    return 0


async def main(streams: int, items: int, rounds: int) -> None:
    runs = contenders()
    check = runs.pop("_check")
    names = list(runs)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for name in names:  # warm up
        for _ in range(max(streams // 10, 5)):
            await runs[name](items)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            read = runs[name]
            start = time.perf_counter_ns()
            total = 0
            for _ in range(streams):
                total += await read(items)
            samples[name].append((time.perf_counter_ns() - start) / total)
            await asyncio.sleep(0)
    await check(0)

    median = {name: statistics.median(s) for name, s in samples.items()}
    title = f"per-item cost, median of {rounds} rounds x {streams} streams x {items} items (ns/item)"
    table = Table(title=title)
    for column in ("contender", "ns/item", "spread", "x bare", "x guarded plain"):
        table.add_column(column, justify="left" if column == "contender" else "right")
    bare, plain = median["bare async generator"], median["guarded stream, plain stage"]
    for name in names:
        s = samples[name]
        table.add_row(
            name,
            f"{median[name]:,.0f}",
            f"{min(s):,.0f}-{max(s):,.0f}",
            f"{median[name] / bare:.1f}",
            f"{median[name] / plain:.2f}",
        )
    Console(width=120).print(table)
    paced = median["generation stage, paced tenant"]
    unlimited = median["generation stage, tenant unlimited"]
    print(f"pacing + counting per item: {paced - unlimited:,.0f} ns over the budgets alone")
    print(f"budgets per item: {unlimited - plain:,.0f} ns over a plain guarded stream")
    print(f"(Python {sys.version.split()[0]}, asyncio)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--items", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    asyncio.run(main(args.streams, args.items, args.rounds))
