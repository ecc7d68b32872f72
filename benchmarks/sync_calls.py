"""What ``@guard`` on a sync function costs the event loop, beside the thread hop it makes.

    .venv/bin/python benchmarks/sync_calls.py [--ops 2000] [--rounds 15]

CPU time of the event loop's thread per call (``time.thread_time_ns``: the worker thread's own time
and the time the loop sleeps waiting for it are not counted), median over rounds, contenders
interleaved round by round (see ``_bench``). The function does nothing, so what is measured is
the dispatch:

- floor: ``await anyio.to_thread.run_sync(fn)``, the hop every sync call makes;
- guarded: ``@guard`` on ``fn`` in a stage with a timeout and a breaker, inside a tenant request
  (the thread bulkhead's permit, the abandonment bookkeeping, the layers);
- guarded async (scale): the same stage around an ``async def`` doing nothing (no hop).

Target: the guarded sync call costs the loop at most 1.3x the bare hop.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import anyio

import _bench
from _bench import Contender
from ragguard import Guard, Policy, StagePolicy


def fn() -> int:
    return 1


async def main(ops: int, rounds: int) -> int:
    g = Guard(Policy(stages={"s": StagePolicy(timeout_s=5.0)}))
    guarded = g.guard("s")(fn)

    async def noop() -> int:
        return 1

    guarded_async = g.guard("s")(noop)

    async def floor() -> None:
        await anyio.to_thread.run_sync(fn)

    async def sync_call() -> None:
        await guarded()

    async def async_call() -> None:
        await guarded_async()

    async with g.tenant("acme"):
        results = await _bench.run_async(
            [
                Contender("to_thread", "anyio.to_thread.run_sync(fn), bare", floor),
                Contender("guarded sync", "@guard on fn: layers + thread bulkhead + hop", sync_call),
                Contender("guarded async", "@guard on an async no-op (no hop), for scale", async_call),
            ],
            ops=ops,
            rounds=rounds,
        )
    _bench.print_table(results, "sync callables", against=["to_thread"], unit="call")
    return _bench.print_targets(
        [_bench.ratio_target(results, "guarded sync vs the bare hop", "guarded sync", "to_thread", 1.3)]
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    sys.exit(0 if asyncio.run(main(args.ops, args.rounds)) == 0 else 1)
