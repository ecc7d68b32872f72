"""What a typed ending and a continuation cost a generation stream, measured in one run.

    .venv/bin/python benchmarks/continuation.py [--ops 200] [--items 100] [--rounds 11]

One operation reads a stream of ``items`` short text items to its end inside a tenant block, on
the real clock (the budgets arm the loop's timer wheel per item). Contenders, interleaved round by
round (benchmarks/_bench.py):

- bare async generator: no ragguard;
- generation stage: as shipped (a GuardedStream, its ending set and kept in the request), read
  with ``async for`` (which reads the generator inside the GuardedStream directly);
- read with anext(): the same, item by item through the GuardedStream's own ``__anext__``: what
  the wrapper that carries ``.ending`` costs a reader that calls ``anext`` itself (a Python call
  per item; ``async for`` pays none);
- continuation declared: the same stage with ``continuation=`` (each item kept for it), nothing
  failing: target at most 1.05x the generation stage;
- continued at half: the model drops the stream after half its items and the continuation
  (restarting two items back, trimmed) hands over the rest: the failure path, for scale.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import ragguard
from _bench import Contender, header, print_table, print_targets, ratio_target, run_async
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


def contenders(items: int) -> list[Contender]:
    generation = GenerationPolicy(first_item_s=30, idle_s=10, total_s=300)
    stages = {
        "generation": StagePolicy(generation=generation),
        "failing": StagePolicy(preset="generation", generation=generation),  # no breaker to open
    }
    g = ragguard.Guard(Policy(stages=stages))
    plain = g.guard("generation")(model)
    continuing = g.guard("generation", continuation=finish)(model)
    failing = g.guard("failing", breaker=False, continuation=finish)(model)

    def reading(open_stream: Callable[[], Any]) -> Callable[[], Any]:
        async def read() -> None:
            n = 0
            async with g.tenant("acme"):
                async for _ in open_stream():
                    n += 1
            assert n == items, n

        return read

    async def by_anext() -> None:
        n = 0
        async with g.tenant("acme"):
            stream = plain(items)
            try:
                while True:
                    await anext(stream)
                    n += 1
            except StopAsyncIteration:
                pass
        assert n == items, n

    return [
        Contender("bare async generator", "no ragguard", reading(lambda: model(items))),
        Contender("generation stage", "as shipped, async for", reading(lambda: plain(items))),
        Contender("read with anext()", "the same, anext() per item", by_anext),
        Contender(
            "continuation declared", "continuation=, nothing fails", reading(lambda: continuing(items))
        ),
        Contender(
            "continued at half",
            "cut at half, continued, repeat trimmed",
            reading(lambda: failing(items, items // 2)),
        ),
    ]


async def main(ops: int, items: int, rounds: int) -> int:
    header()
    results = await run_async(contenders(items), ops=ops, rounds=rounds)
    print_table(
        results,
        f"a generation stream of {items} items",
        against=("bare async generator", "generation stage"),
        unit="stream",
    )
    by_anext, lo, hi = results.ratio("read with anext()", "generation stage")
    print(f"the wrapper, for a reader calling anext(): {by_anext:.2f}x (rounds {lo:.2f}-{hi:.2f}); async for: none")
    targets = [ratio_target(results, "a declared continuation", "continuation declared", "generation stage", 1.05)]
    return print_targets(targets)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ops", type=int, default=200)
    parser.add_argument("--items", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args()
    asyncio.run(main(args.ops, args.items, args.rounds))
