"""What a typed ending and a continuation cost a generation stream, per item, measured in one run.

    .venv/bin/python benchmarks/continuation.py [--streams 200] [--items 100] [--rounds 9]

Each contender reads ``streams`` streams of ``items`` short text items inside a tenant block, on
the real clock, interleaved round by round in a rotating order; the figure is the median over
rounds of nanoseconds per item (a stream's opening and closing spread over its items), with the
spread (min-max). Contenders:

- bare async generator: no ragguard;
- generation stage: as shipped (a GuardedStream, its ending set and kept in the request);
- generation stage, read with anext(): the same stream read item by item through the
  GuardedStream's own ``__anext__`` (``async for`` reads the generator inside it directly): what
  the wrapper that carries ``.ending`` costs a reader that calls ``anext`` itself;
- continuation declared: the same stage with ``continuation=`` (each item kept for it), nothing
  failing: the target is at most 1.05x the generation stage;
- continued at half: the model drops the stream after half its items and the continuation (which
  restarts two items back, trimmed) hands over the rest: the failure path, for scale.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from rich.console import Console
from rich.table import Table

import ragguard
from ragguard import GenerationPolicy, Policy, StagePolicy
from ragguard.rag import Partial

WORDS = tuple(f"tok{i} " for i in range(1000))


async def model(n: int, fail_at: int | None = None) -> AsyncIterator[str]:
    for i in range(n):
        if i == fail_at:
            raise ConnectionResetError("dropped")
        yield WORDS[i % 1000]


async def finish(n: int, fail_at: int | None = None, *, partial: Partial) -> AsyncIterator[str]:
    for i in range(max(0, len(partial.items) - 2), n):  # a model asked to continue repeats some
        yield WORDS[i % 1000]


def contenders() -> dict[str, Callable[[int], Awaitable[int]]]:
    generation = GenerationPolicy(first_item_s=30, idle_s=10, total_s=300)
    stages = {
        "generation": StagePolicy(generation=generation),
        "failing": StagePolicy(preset="generation", generation=generation),  # no breaker to open
    }
    g = ragguard.Guard(Policy(stages=stages))
    plain = g.guard("generation")(model)
    continuing = g.guard("generation", continuation=finish)(model)
    failing = g.guard("failing", breaker=False, continuation=finish)(model)

    def reader(open_stream: Callable[[int], Any], fail: bool = False) -> Callable[[int], Awaitable[int]]:
        async def read(items: int) -> int:
            n = 0
            async with g.tenant("acme"):
                async for _ in open_stream(items) if not fail else open_stream(items, items // 2):
                    n += 1
            assert n == items, n
            return n

        return read

    def by_anext(open_stream: Callable[[int], Any]) -> Callable[[int], Awaitable[int]]:
        async def read(items: int) -> int:
            n = 0
            async with g.tenant("acme"):
                stream = open_stream(items)
                try:
                    while True:
                        await anext(stream)
                        n += 1
                except StopAsyncIteration:
                    pass
            return n

        return read

    async def bare(items: int) -> int:
        n = 0
        async with g.tenant("acme"):
            async for _ in model(items):
                n += 1
        return n

    return {
        "bare async generator": bare,
        "generation stage": reader(plain),
        "generation stage, read with anext()": by_anext(plain),
        "continuation declared": reader(continuing),
        "continued at half": reader(failing, fail=True),
    }


async def main(streams: int, items: int, rounds: int) -> None:
    runs = contenders()
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

    median = {name: statistics.median(s) for name, s in samples.items()}
    title = f"per-item cost, median of {rounds} rounds x {streams} streams x {items} items (ns/item)"
    table = Table(title=title)
    for column in ("contender", "ns/item", "spread", "x bare", "x generation stage"):
        table.add_column(column, justify="left" if column == "contender" else "right")
    bare, stage = median["bare async generator"], median["generation stage"]
    for name in names:
        s = samples[name]
        table.add_row(
            name, f"{median[name]:,.0f}", f"{min(s):,.0f}-{max(s):,.0f}", f"{median[name] / bare:.1f}",
            f"{median[name] / stage:.3f}",
        )  # fmt: skip
    Console(width=120).print(table)
    by_anext = median["generation stage, read with anext()"]
    print(f"the GuardedStream wrapper per item read with anext(): {by_anext - stage:,.0f} ns")
    declared = median["continuation declared"] / stage
    print(f"continuation declared: {declared:.3f}x the generation stage (target <= 1.05x)")
    print(f"(Python {sys.version.split()[0]}, asyncio)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--items", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    asyncio.run(main(args.streams, args.items, args.rounds))
