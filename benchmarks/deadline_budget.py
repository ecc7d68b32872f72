"""What the deadline's shares and the fallback's reserve cost: the full stack (see ``_stacks``: a
request of tenant ``acme`` with a 0.8 s deadline calling a ``vector_store`` stage with a keyword
fallback) with its standard ``deadline_share`` (0.25) and its learnt reserve, beside the same stack
with both off (``deadline_share: 1``, ``reserve: 0``: the stack as it was before them), on the happy
path and on a refused connection answered by the fallback (which the reserve learns from), in one
interleaved run.

    .venv/bin/python benchmarks/deadline_budget.py [--ops 2000] [--rounds 15]

CPU time of the loop's thread per call, median over rounds. The promise measured: the two gates
cost at most 10% of the full stack's happy path.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import _bench
import _stacks
import ragguard
from _bench import Contender


async def refused(x: int = 1) -> int:
    raise ConnectionRefusedError("the vector store is down")


def contenders() -> list[Contender]:
    # 1 attempt and a breaker that never opens, so the failing rows measure the fallback alone
    never_opens = ragguard.BreakerPolicy(
        kind="generic", window_type="time", window_size=1, minimum_calls=10**6
    )
    fail = {"retry": ragguard.RetryPolicy(attempts=1), "breaker": never_opens}
    on = {"deadline_share": 0.25, "reserve": ragguard.ReservePolicy()}  # the vector_store stage's own
    off = {"deadline_share": 1.0, "reserve": 0}
    _, kept = _stacks.full_stack_guard(ragguard, **on)
    _, plain = _stacks.full_stack_guard(ragguard, **off)
    _, kept_failing = _stacks.full_stack_guard(ragguard, refused, **fail, **on)
    _, plain_failing = _stacks.full_stack_guard(ragguard, refused, **fail, **off)
    return [
        Contender("share + reserve", "the full stack, its share (0.25) and learnt reserve", kept),
        Contender("neither", "the full stack, deadline_share 1 and reserve 0", plain),
        Contender("fallback, share + reserve", "refused; the fallback answers, the reserve learns", kept_failing),
        Contender("fallback, neither", "refused; the fallback answers", plain_failing),
    ]


async def main(ops: int, rounds: int) -> int:
    _bench.header()
    results = await _bench.run_async(contenders(), ops=ops, rounds=rounds)
    _bench.print_table(results, "Deadline shares and the fallback's reserve", against=("neither",))
    targets = [
        _bench.ratio_target(results, "share + reserve on the happy path", "share + reserve", "neither", 1.10),
        _bench.ratio_target(
            results, "share + reserve when the fallback answers", "fallback, share + reserve",
            "fallback, neither", 1.10,
        ),
    ]
    return _bench.print_targets(targets)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.ops, args.rounds)))
