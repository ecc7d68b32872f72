"""What a keyed stage and a model group cost per call, against the unkeyed stage doing equal work,
in one interleaved run.

    .venv/bin/python benchmarks/deployments.py [--ops 2000] [--rounds 15]

Every contender calls the same coroutine (it answers at once) through a stage with a breaker and
one attempt: unkeyed; keyed by its ``model`` argument, one model or 64 in turn (each key its own
breaker and chain); 64 unkeyed stages in turn (the equal work of 64 keys without keys: 64 breakers
and chains); and a model group of two deployments (the first answers), whose deployments are keys
of its stage (the ordered strategy's first choice: the group's call is that key's chain, with the
failover loop as its outermost layer). CPU time of the loop's thread per call, median over rounds. The promise measured: a
key, and a group's choice of deployment, cost at most 20% more than the unkeyed stage doing the
same work (one key against one stage, 64 keys against 64 stages).

For scale, LiteLLM publishes the overhead of its gateway (whose Router picks the deployment): a
median "LiteLLM Overhead Duration" of 2 ms (P95 8 ms) with 4 instances at 1,170 requests/s, and
12 ms (P95 29 ms) with 2 instances at 1,036 requests/s (https://docs.litellm.ai/docs/benchmarks);
its proxy performance page states 3.25 ms added against the raw OpenAI API
(https://docs.litellm.ai/docs/proxy/perf). Those are milliseconds over HTTP under load; the
figures here are a call's CPU time in process, microseconds. LiteLLM is not installed here.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys

import _bench
import ragguard
from _bench import Contender

LITELLM_OVERHEAD_MS = (2.0, 12.0)
"""LiteLLM's published median gateway overhead, 4 and 2 instances (see the module docstring)."""


async def model(question: str, model: str) -> str:
    return question


def contenders() -> list[Contender]:
    stage = {"retry": {"attempts": 1}}
    group = {"deployments": [{"name": "primary", "model": "gpt-4o"}, {"name": "backup", "model": "gpt-4o-mini"}]}
    many = {f"plain-{i}": stage for i in range(64)}
    policy = ragguard.Policy.parse({
        "stages": {"plain": stage, "keyed": {**stage, "max_keys": 128}, "chat": stage, **many},
        "groups": {"chat": group},
    })  # fmt: skip
    g = ragguard.Guard(policy)
    unkeyed = g.guard("plain")(model)
    keyed = g.guard("keyed", key="model")(model)
    chat = g.group("chat", {"primary": model, "backup": model})
    models = itertools.cycle([f"model-{i}" for i in range(64)])
    stages = itertools.cycle([g.guard(name)(model) for name in many])

    return [
        Contender("unkeyed", "a stage with a breaker, one attempt", lambda: unkeyed("q", "gpt-4o")),
        Contender("keyed", "the same, keyed by model: one model", lambda: keyed("q", "gpt-4o")),
        Contender("64 stages", "64 such unkeyed stages in turn", lambda: next(stages)("q", "gpt-4o")),
        Contender("keyed, 64 models", "one stage keyed by model, 64 models in turn", lambda: keyed("q", next(models))),
        Contender("group of two", "a model group: its first deployment answers", lambda: chat("q")),
    ]


async def main(ops: int, rounds: int) -> int:
    _bench.header()
    results = await _bench.run_async(contenders(), ops=ops, rounds=rounds)
    _bench.print_table(results, "Keyed stages and model groups", against=("unkeyed", "64 stages"))
    targets = [
        _bench.ratio_target(results, "a keyed stage, against the unkeyed one", "keyed", "unkeyed", 1.20),
        _bench.ratio_target(results, "64 keys, against 64 stages", "keyed, 64 models", "64 stages", 1.20),
        _bench.ratio_target(results, "a model group's call, against the unkeyed stage", "group of two", "unkeyed", 1.20),
    ]
    group_us = results.median("group of two") / 1000
    _bench.console.print(
        f"for scale: a group call costs {group_us:.1f} us of CPU here; LiteLLM's published gateway overhead "
        f"is a median of {LITELLM_OVERHEAD_MS[0]:g} to {LITELLM_OVERHEAD_MS[1]:g} ms "
        "(https://docs.litellm.ai/docs/benchmarks; over HTTP, under load)",
        markup=False,
    )
    return _bench.print_targets(targets)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.ops, args.rounds)))
