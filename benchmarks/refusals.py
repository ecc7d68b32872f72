"""What routing a provider's refusals costs: the happy path of a generation function that names its
passages and routes its refusals beside one that does not, and a refused call answered by a route,
by the shrink, or (for scale) a failed call answered by a plain fallback, in one interleaved run.

    .venv/bin/python benchmarks/refusals.py [--ops 2000] [--rounds 15]

The model is a coroutine: it answers, or refuses a prompt of more than 8 passages with the
``ValueError`` llama-cpp-python raises ("Requested tokens (N) exceed context window of M"), a
context-length refusal by its words. CPU time of the loop's thread per call, median over rounds.
The promise measured: routes and ``passages=`` cost nothing until a refusal comes (the happy path
within 10% of the plain function's).
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import _bench
import ragguard
from _bench import Contender
from ragguard import BreakerPolicy, GenerationPolicy, Policy, RetryPolicy, StagePolicy

PASSAGES = [f"passage {i}: " + "lorem ipsum " * 20 for i in range(12)]


async def model(question: str, passages: list[str]) -> str:
    if len(passages) > 8:
        raise ValueError(f"Requested tokens ({len(passages) * 70}) exceed context window of 600")
    return question


async def down(question: str, passages: list[str]) -> str:
    raise ConnectionRefusedError("the model server is down")


async def larger(question: str, passages: list[str]) -> str:
    return question


def contenders() -> list[Contender]:
    stage = StagePolicy(
        preset="generation",
        generation=GenerationPolicy(first_item_s=None, idle_s=None, total_s=None),
        retry=RetryPolicy(attempts=1),
        # counts, never opens (a second's window that needs a million calls), as failure_path's
        breaker=BreakerPolicy(kind="generic", window_type="time", window_size=1, minimum_calls=1_000_000),
    )
    g = ragguard.Guard(Policy(stages={"generation": stage}))
    plain = g.guard("generation")(model)
    routed = g.guard("generation", passages="passages", on_context_length=larger)(model)
    only_route = g.guard("generation", on_context_length=larger)(model)
    fallback = g.guard("generation", fallback=larger)(down)
    few, many = PASSAGES[:4], PASSAGES

    async def call(fn: object, passages: list[str]) -> None:
        await fn("why?", passages)  # type: ignore[operator]

    return [
        Contender("plain", "generation function, no route, 4 passages: answered", lambda: call(plain, few)),
        Contender("routed", "with passages= and on_context_length=: answered", lambda: call(routed, few)),
        Contender("refused, shrunk", "12 passages refused, shrunk to 8, answered", lambda: call(routed, many)),
        Contender("refused, routed", "12 passages refused, on_context_length= answers", lambda: call(only_route, many)),
        Contender("failed, fallback", "a refused connection, fallback= answers", lambda: call(fallback, few)),
    ]


async def main(ops: int, rounds: int) -> int:
    _bench.header()
    results = await _bench.run_async(contenders(), ops=ops, rounds=rounds)
    _bench.print_table(results, "Routed refusals", against=("plain",))
    targets = [_bench.ratio_target(results, "routes and passages= on the happy path", "routed", "plain", 1.10)]
    return _bench.print_targets(targets)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.ops, args.rounds)))
