"""What every benchmark here shares: contenders interleaved round by round, medians with spread,
ratios paired per round, and targets printed as MET or GAP.

A benchmark lists its contenders (a name, what the contender does, and a body: one operation per
call). :func:`run_async` (or :func:`run_sync`) measures them in rounds: in each round every
contender runs ``ops`` operations, in an order that rotates from round to round, so a burst of
load from another process on the shared machine lands on every contender alike instead of on the
one whose rounds happened to run then. A contender's figure is the median of its rounds (ns per
operation) with the spread of its rounds (min-max); a ratio between two contenders is the median
of their per-round ratios (both measured in the same round, moments apart), with its min-max.

Shared machines are noisy: compare ratios, not absolute figures.
"""

from __future__ import annotations

import asyncio
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = [
    "Contender",
    "Results",
    "Target",
    "console",
    "header",
    "print_table",
    "print_targets",
    "ratio_target",
    "run_async",
    "run_sync",
]

console = Console(width=int(os.environ.get("BENCH_WIDTH", "130")), highlight=False)


@dataclass
class Contender:
    """One contender: ``body()`` performs one operation (an awaitable for :func:`run_async`)."""

    name: str
    does: str
    body: Callable[[], Any]
    setup: Callable[[], Any] | None = None  # called before each round (not timed)


@dataclass
class Results:
    """Per-contender samples (ns per operation, one per round), in contender order."""

    samples: dict[str, list[float]] = field(default_factory=dict)
    does: dict[str, str] = field(default_factory=dict)
    ops: int = 0
    rounds: int = 0

    def median(self, name: str) -> float:
        return statistics.median(self.samples[name])

    def spread(self, name: str) -> tuple[float, float]:
        s = self.samples[name]
        return min(s), max(s)

    def ratio(self, a: str, b: str) -> tuple[float, float, float]:
        """Median, min and max over rounds of ``a``'s time / ``b``'s time in the same round."""
        per_round = [x / y for x, y in zip(self.samples[a], self.samples[b], strict=True)]
        return statistics.median(per_round), min(per_round), max(per_round)

    def noise(self) -> float:
        """The widest relative spread ((max - min) / median) of any contender: how noisy the run was."""
        return max((max(s) - min(s)) / statistics.median(s) for s in self.samples.values())


def _order(n: int, round_no: int) -> list[int]:
    # rotate the starting contender each round, and reverse every other round, so that no
    # contender always runs right after the same one (or first, after a warm-up)
    order = [(i + round_no) % n for i in range(n)]
    return order[::-1] if round_no % 2 else order


async def run_async(
    contenders: Sequence[Contender],
    *,
    ops: int,
    rounds: int,
    yield_every: int = 100,
    warmup: int | None = None,
) -> Results:
    """Measure async contenders interleaved round by round (see the module docstring).

    Each operation is awaited in turn; every ``yield_every`` operations the loop gets one
    ``asyncio.sleep(0)``, as a server's loop would run other work (0: never)."""
    results = Results(ops=ops, rounds=rounds)
    for c in contenders:
        results.samples[c.name] = []
        results.does[c.name] = c.does

    async def one_round(c: Contender, n: int) -> float:
        if c.setup is not None:
            c.setup()
        gc.collect()  # each contender pays for the garbage it makes, not for the one before it
        body = c.body
        every = yield_every if yield_every > 0 else n + 1
        start = time.thread_time_ns()
        for i in range(n):
            await body()
            if i % every == every - 1:
                await asyncio.sleep(0)
        return (time.thread_time_ns() - start) / n

    for c in contenders:  # warm up: caches, compiled chains, lazily built state
        await one_round(c, warmup if warmup is not None else max(ops // 10, 50))
    gc.collect()
    for r in range(rounds):
        for i in _order(len(contenders), r):
            c = contenders[i]
            results.samples[c.name].append(await one_round(c, ops))
    return results


def run_sync(
    contenders: Sequence[Contender], *, ops: int, rounds: int, warmup: int | None = None
) -> Results:
    """Measure synchronous contenders interleaved round by round (see the module docstring)."""
    results = Results(ops=ops, rounds=rounds)
    for c in contenders:
        results.samples[c.name] = []
        results.does[c.name] = c.does

    def one_round(c: Contender, n: int) -> float:
        if c.setup is not None:
            c.setup()
        gc.collect()
        body = c.body
        start = time.thread_time_ns()
        for _ in range(n):
            body()
        return (time.thread_time_ns() - start) / n

    for c in contenders:
        one_round(c, warmup if warmup is not None else max(ops // 10, 50))
    gc.collect()
    for r in range(rounds):
        for i in _order(len(contenders), r):
            c = contenders[i]
            results.samples[c.name].append(one_round(c, ops))
    return results


def _ns(ns: float) -> str:
    if ns >= 100_000:
        return f"{ns / 1000:,.0f} µs"
    if ns >= 10_000:
        return f"{ns / 1000:,.1f} µs"
    return f"{ns:,.0f} ns"


def print_table(
    results: Results, title: str, *, against: Sequence[str] = (), unit: str = "op", names: Sequence[str] = ()
) -> None:
    """Print each contender's median and spread, what it does, and its ratio to ``against``."""
    table = Table(title=f"{title} (median of {results.rounds} interleaved rounds x {results.ops:,} {unit}s)")
    table.add_column("contender")
    table.add_column("what it does", max_width=48)
    table.add_column(f"per {unit}", justify="right")
    table.add_column("spread (min-max)", justify="right")
    for ref in against:
        table.add_column(f"x {ref}", justify="right", max_width=18)
    for name in names or results.samples:
        lo, hi = results.spread(name)
        row = [name, results.does[name], _ns(results.median(name)), f"{_ns(lo)}-{_ns(hi)}"]
        row += [f"{results.ratio(name, ref)[0]:.2f}" for ref in against]
        table.add_row(*row)
    console.print(table)


@dataclass
class Target:
    """A goal: ``ratio`` at most ``limit`` (or at least, with ``at_least``)."""

    name: str
    ratio: float
    limit: float
    detail: str = ""
    at_least: bool = False

    @property
    def met(self) -> bool:
        return self.ratio >= self.limit if self.at_least else self.ratio <= self.limit

    def line(self) -> str:
        op = ">=" if self.at_least else "<="
        extra = f" ({self.detail})" if self.detail else ""
        verdict = "MET" if self.met else "GAP"
        return f"{verdict}  {self.name}: {self.ratio:.2f}x (target {op} {self.limit:g}x){extra}"


def ratio_target(
    results: Results, name: str, a: str, b: str, limit: float, *, at_least: bool = False
) -> Target:
    """``a`` / ``b`` paired per round (median, with the per-round min-max) against ``limit``."""
    med, lo, hi = results.ratio(a, b)
    return Target(name, med, limit, f"rounds {lo:.2f}-{hi:.2f}", at_least)


def print_targets(targets: Sequence[Target]) -> int:
    """Print every target as MET or GAP; returns how many are GAP."""
    for t in targets:
        console.print(t.line(), markup=False)
    return sum(not t.met for t in targets)


def header() -> None:
    """One line saying where the figures come from."""
    import platform

    console.print(
        f"python {platform.python_version()} ({sys.implementation.name}), {os.cpu_count()} cpus, "
        f"load average {', '.join(f'{x:.1f}' for x in os.getloadavg())}",
        markup=False,
    )

