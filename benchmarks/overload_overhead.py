"""Happy-path cost of the overload layers, each beside the same stage without them, in one run.

    .venv/bin/python benchmarks/overload_overhead.py [--calls 20000] [--rounds 7]

Every variant awaits a trivial coroutine through a Guard stage ``calls`` times per round, yielding
to the loop every 100 calls; variants are interleaved round by round and the figure is the median
over rounds of nanoseconds per call, with the spread (min-max) beside it. The hedged stage has
enough latencies recorded to hedge, so every call runs the race (a helper task per call): that is
its real cost while the stage's P95 is above zero. Shared machines are noisy: compare ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from collections.abc import Awaitable, Callable

from rich.console import Console
from rich.table import Table

from ragguard import AdaptivePolicy, Guard, HedgePolicy, Policy, StagePolicy, ThrottlePolicy

Body = Callable[[], Awaitable[object]]


async def work() -> int:
    return 1


def stages() -> dict[str, StagePolicy]:
    adaptive = AdaptivePolicy(initial_limit=64, max_limit=1000)
    return {
        "plain": StagePolicy(),
        "adaptive": StagePolicy(adaptive=adaptive),
        "adaptive+throttle": StagePolicy(adaptive=adaptive, throttle=ThrottlePolicy()),
        "hedge (racing)": StagePolicy(idempotent=True, hedge=HedgePolicy(min_samples=1, min_delay_s=10.0)),
    }


async def main(calls: int, rounds: int) -> None:
    g = Guard(Policy(stages=stages()), rng=random.Random(1))
    bodies: dict[str, Body] = {name: g.guard(name)(work) for name in stages()}
    for body in bodies.values():
        for _ in range(100):
            await body()  # warm: chains compiled, the adaptive limit's first probe over, hedge delay known
    samples: dict[str, list[float]] = {name: [] for name in bodies}
    for _ in range(rounds):
        for name, body in bodies.items():
            start = time.perf_counter_ns()
            for i in range(calls):
                await body()
                if i % 100 == 99:
                    await asyncio.sleep(0)
            samples[name].append((time.perf_counter_ns() - start) / calls)
    base = statistics.median(samples["plain"])
    table = Table(title=f"overload layers, happy path ({calls} calls x {rounds} rounds, interleaved)")
    for col in ("stage", "ns/call (median)", "spread", "vs plain stage"):
        table.add_column(col, justify="left" if col == "stage" else "right")
    for name, xs in samples.items():
        med = statistics.median(xs)
        table.add_row(name, f"{med:,.0f}", f"{min(xs):,.0f}-{max(xs):,.0f}", f"{med / base:.2f}x")
    Console().print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.rounds))
