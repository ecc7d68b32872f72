"""Per-item cost of a guarded stream, beside a bare async generator, measured in one run.

    .venv/bin/python benchmarks/stream_items.py [--items 20000] [--rounds 7]

Variants, interleaved round by round: the bare async generator; a guarded stream (stage with
nothing configured: the timeout gate only) as shipped; and, on Python 3.11, the same with the
lost-cancellation check of each item read switched off (``_drivers._CHECK_LOST_CANCEL``), which is what
the check costs. The figure is the median over rounds of nanoseconds per item, with the spread
(min-max); compare ratios, not absolute figures, on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable

import ragguard
from ragguard.pipeline import _drivers


async def items(n: int) -> AsyncIterator[int]:
    for i in range(n):
        yield i


async def consume(make: Callable[[int], AsyncIterator[int]], n: int) -> float:
    started = time.perf_counter_ns()
    count = 0
    async for _ in make(n):
        count += 1
    assert count == n
    return (time.perf_counter_ns() - started) / n


async def main(n: int, rounds: int) -> None:
    g = ragguard.Guard()
    guarded = g.guard("tokens")(items)
    checked = _drivers._CHECK_LOST_CANCEL
    async def bare() -> float:
        return await consume(items, n)

    async def shipped() -> float:
        _drivers._CHECK_LOST_CANCEL = checked
        return await consume(guarded, n)

    async def unchecked() -> float:
        _drivers._CHECK_LOST_CANCEL = False
        try:
            return await consume(guarded, n)
        finally:
            _drivers._CHECK_LOST_CANCEL = checked

    variants = {"bare async generator": bare, "guarded stream (as shipped)": shipped}
    if checked:
        variants["guarded, 3.11 check off"] = unchecked
    figures: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, run in variants.items():
            figures[name].append(await run())  # type: ignore[misc]
    base = statistics.median(figures["bare async generator"])
    print(f"python {sys.version.split()[0]}, {n} items x {rounds} rounds, ns per item")
    for name, got in figures.items():
        median = statistics.median(got)
        print(f"{name:30s} {median:8.0f}  (spread {min(got):.0f}-{max(got):.0f})  x{median / base:.2f} bare")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    asyncio.run(main(args.items, args.rounds))
